"""The operator against a real API server: VirtualSlices become gangs, programs run.

Every test gets its own namespace and deletes what it made (``objects`` waits for the
pods to be gone, since tests share the islands); the operator is one real process for
the module (the ``operator`` fixture in ``conftest``), started after ``kubectl apply -f
crds/``. The test cluster has two islands of two 4-device nodes each, 8 devices per
island, so an 8-device slice is a gang of 2 hosts that takes a whole island.
"""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml

from pathways_wire.driver_protocol import RunStart
from tests.cluster.builders import inline_slice, program, ref_slice, virtual_slice
from pathways_devcluster.controlplane import REPO_ROOT
from tests.cluster.harness import Cluster, Objects, OperatorProcess, condition

SLICE_READY_S = 120.0
PROGRAM_DONE_S = 180.0


def results(objects: Objects, done: dict[str, object]) -> dict[str, object]:
    """The program's results, read from the ConfigMap its status names."""
    where = done["status"]["results"]  # type: ignore[index]
    data = objects.configmap(where["configMap"])
    assert sorted(data) == sorted(where["keys"])
    return {k: json.loads(v) for k, v in data.items()}


def slice_looks(operator: OperatorProcess, result: str) -> float:
    """``pathways_reconciles_total`` of VirtualSlices with ``result`` (wrote or unchanged)."""
    line = f'pathways_reconciles_total{{kind="VirtualSlice",result="{result}"}} '
    found = [float(x.split()[-1]) for x in operator.metrics().splitlines() if x.startswith(line)]
    return found[0] if found else 0.0


def assert_continued(starts: list[RunStart], *, at_least: int) -> None:
    """A program without snapshots ran first from step 0, then again from the steps its
    progress file recorded: at least ``at_least``, never from the start."""
    assert starts[0] == RunStart(0, None), starts
    assert len(starts) >= 2, f"the driver never started again: {starts}"
    assert all(s.snapshot is None and s.step >= at_least for s in starts[1:]), starts


# -- the resource manager ----------------------------------------------------------------------


@pytest.mark.timeout(240, func_only=True)
def test_slice_becomes_a_gang_of_pods_on_one_island(objects: Objects, operator: OperatorProcess) -> None:
    applied = objects.apply(virtual_slice("gang", 8))
    ready = objects.wait_slice("gang", "Ready", SLICE_READY_S, operator)
    elapsed = time.monotonic() - applied
    print(f"\nkubectl apply -> Ready for a 2-host VirtualSlice: {elapsed:.1f} s")

    status = ready["status"]
    pods = objects.pods("pathways.dev/slice=gang")
    assert sorted(p.metadata.name for p in pods) == ["gang-0", "gang-1"]
    island = status["island"]
    prefix = island.removeprefix("island-")
    assert {p.spec.node_name for p in pods} == {f"{prefix}-0", f"{prefix}-1"}, "one island, both nodes"
    for pod in pods:
        assert pod.spec.scheduler_name == "pathways", "bound by the operator, not kube-scheduler"
        assert pod.metadata.labels["pathways.dev/generation"] == "0"
        assert pod.metadata.owner_references[0].kind == "VirtualSlice"
        worker = next(c for c in pod.spec.containers if c.name == "worker")
        assert worker.resources.requests["pathways.dev/device"] == "4"
        assert {c.name for c in pod.spec.containers} == {"worker", "dataflow"}
    assert [h["index"] for h in status["hosts"]] == [0, 1]
    assert all(h["podIP"] and h["node"] and h["pod"] and h["devices"] == 4 for h in status["hosts"])
    # both pods were created at once: host 1's before host 0's IP existed, so its worker
    # learnt host 0's JAX coordinator address from its sidecar, which the operator told
    workers = {p.metadata.name: next(c for c in p.spec.containers if c.name == "worker") for p in pods}
    coordinator = {name: {e.name: e.value for e in c.env}.get("PATHWAYS_COORDINATOR") for name, c in workers.items()}
    assert coordinator == {"gang-0": "$(POD_IP):8476", "gang-1": None}, coordinator
    host0_ip = status["hosts"][0]["podIP"]
    told = objects.cluster.container_log(objects.namespace, "gang-1", "worker").read_text()
    assert f"JAX coordinator {host0_ip}:8476, from the sidecar" in told, told[-2000:]
    assert status["readyHosts"] == "2/2" and status["restarts"] == 0
    assert condition(ready, "Admitted")["status"] == "True"
    assert condition(ready, "Ready")["reason"] == "GangReady"
    assert condition(ready, "Ready")["observedGeneration"] == ready["metadata"]["generation"]
    objects.wait_event("gang", "Admitted", text=f"Admitted on {island}")
    printed = objects.cluster.kubectl("get", "vslice", "gang", "-n", objects.namespace).stdout
    assert "Ready" in printed and "2/2" in printed and island in printed

    # kopf keeps its bookkeeping in annotations, and a steady slice is not rewritten:
    # no status write retriggers a handler.
    annotations = objects.slice("gang")["metadata"].get("annotations") or {}
    assert "pathways.dev/last-handled-configuration" in annotations
    version = objects.slice("gang")["metadata"]["resourceVersion"]
    quiet = slice_looks(operator, "unchanged")
    objects.cluster.poll(lambda: slice_looks(operator, "unchanged") > quiet, timeout=60, interval=0.5,
                         what="the operator looking at the steady slice again")
    assert objects.slice("gang")["metadata"]["resourceVersion"] == version


@pytest.mark.timeout(300, func_only=True)
def test_competing_gangs_are_admitted_all_or_nothing(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(virtual_slice("first", 8, island="island-a"))
    objects.wait_slice("first", "Ready", SLICE_READY_S, operator)
    objects.apply(virtual_slice("second", 8, island="island-a"))

    def queued() -> dict[str, object] | None:
        found = objects.slice("second")
        status = found.get("status") or {}
        return found if status.get("phase") == "Pending" and status.get("conditions") else None

    second = objects.cluster.poll(queued, timeout=30, what="second slice queued")
    admitted = condition(second, "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "InsufficientDevices")
    assert "needs 8 devices on island island-a" in admitted["message"]
    assert "0 free" in admitted["message"]
    # the look that queued it is the one that would have created its pods
    assert objects.pods("pathways.dev/slice=second") == [], "a queued gang holds no pods"
    assert objects.slice("first")["status"]["phase"] == "Ready"

    objects.delete("virtualslices", "first")
    admitted_at = time.monotonic()
    ready = objects.wait_slice("second", "Ready", SLICE_READY_S, operator)
    print(f"\nsecond slice Ready {time.monotonic() - admitted_at:.1f} s after the first was deleted")
    assert ready["status"]["island"] == "island-a"
    assert condition(ready, "Admitted")["status"] == "True"


def by_label(operator: OperatorProcess, counter: str, label: str) -> dict[str, float]:
    """A counter's values by its one label, as the operator's /metrics shows them now."""
    line = re.compile(rf'{counter}\{{{label}="([^"]+)"\}} (\S+)')
    return {m.group(1): float(m.group(2)) for m in map(line.fullmatch, operator.metrics().splitlines()) if m}


def admission_passes(operator: OperatorProcess) -> dict[str, float]:
    """``pathways_admission_passes_total`` by ``cluster_read`` (listed, reused)."""
    return {"listed": 0.0, "reused": 0.0} | by_label(operator, "pathways_admission_passes_total", "cluster_read")


@pytest.mark.timeout(180, func_only=True)
def test_queued_slices_share_one_listing_of_the_cluster_per_moment(
    objects: Objects, operator: OperatorProcess
) -> None:
    names = [f"waiting-{i}" for i in range(6)]
    for name in names:  # 32 devices: more than an island holds, so each waits and looks once a second
        objects.apply(virtual_slice(name, 32))

    def all_pending() -> bool:
        return all((objects.slice(n).get("status") or {}).get("phase") == "Pending" for n in names)

    objects.cluster.poll(all_pending, timeout=60, what="six slices queued")
    before = admission_passes(operator)
    time.sleep(4.0)  # bounded: about four looks of each queued slice
    after = admission_passes(operator)
    listed, reused = (after[k] - before[k] for k in ("listed", "reused"))
    print(f"\nsix queued slices over 4 s: {listed:.0f} passes listed the cluster, {reused:.0f} reused a read")
    assert listed + reused >= 12, "the queued slices kept looking, each look an admission pass"
    assert listed * 2 <= listed + reused, (
        "passes of one moment share a read of the cluster, not one listing per queued slice"
    )
    for name in names:
        admitted = condition(objects.slice(name), "Admitted")
        assert (admitted["status"], admitted["reason"]) == ("False", "ExceedsIsland"), admitted


@pytest.mark.timeout(300, func_only=True)
def test_deleted_pod_recreates_the_whole_gang(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(virtual_slice("phoenix", 8, max_restarts=2))
    objects.wait_slice("phoenix", "Ready", SLICE_READY_S, operator)
    before = objects.pod_uids("pathways.dev/slice=phoenix")

    objects.core.delete_namespaced_pod("phoenix-1", objects.namespace)

    def recreated() -> dict[str, object] | None:
        found = objects.slice("phoenix")
        status = found.get("status") or {}
        return found if status.get("phase") == "Ready" and status.get("restarts") == 1 else None

    ready = objects.cluster.poll(recreated, timeout=SLICE_READY_S, interval=0.5, what="gang recreated")
    after = objects.pod_uids("pathways.dev/slice=phoenix")
    assert sorted(after) == ["phoenix-0", "phoenix-1"]
    assert not set(after.values()) & set(before.values()), "every pod of the gang is new"
    assert {p.metadata.labels["pathways.dev/generation"] for p in objects.pods("pathways.dev/slice=phoenix")} == {"1"}
    assert condition(ready, "Degraded")["status"] == "False"
    objects.wait_event("phoenix", "GangRecreated", text="Gang recreated: pod phoenix-1")


@pytest.mark.timeout(240, func_only=True)
def test_restarts_exhausted_fails_the_slice(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(virtual_slice("fragile", 2, max_restarts=0))
    objects.wait_slice("fragile", "Ready", SLICE_READY_S, operator)
    objects.core.delete_namespaced_pod("fragile-0", objects.namespace)
    failed = objects.wait_slice("fragile", "Failed", 60, operator)
    ready = condition(failed, "Ready")
    assert ready["reason"] == "RestartsExhausted"
    assert "pod fragile-0 was deleted" in ready["message"] and "maxRestarts=0" in ready["message"]
    objects.cluster.poll(lambda: not objects.pods("pathways.dev/slice=fragile"), timeout=60,
                         what="pods of the failed slice deleted")


@pytest.mark.timeout(240, func_only=True)
def test_suspended_slice_holds_nothing_until_resumed(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(virtual_slice("nap", 4))
    objects.wait_slice("nap", "Ready", SLICE_READY_S, operator)
    objects.cluster.kubectl("patch", "vslice", "nap", "-n", objects.namespace, "--type=merge",
                            "-p", '{"spec": {"suspend": true}}')
    suspended = objects.wait_slice("nap", "Suspended", 60, operator)
    assert condition(suspended, "Suspended")["status"] == "True"
    objects.cluster.poll(lambda: not objects.pods("pathways.dev/slice=nap"), timeout=60,
                         what="pods of the suspended slice deleted")
    objects.cluster.kubectl("patch", "vslice", "nap", "-n", objects.namespace, "--type=merge",
                            "-p", '{"spec": {"suspend": false}}')
    resumed = objects.wait_slice("nap", "Ready", SLICE_READY_S, operator)
    assert condition(resumed, "Suspended")["status"] == "False"
    assert resumed["status"]["restarts"] == 0


# -- programs -----------------------------------------------------------------------------------


def apply_example(objects: Objects, manifest: str) -> str:
    """``kubectl apply`` a file of examples/manifests; returns the object's name."""
    path = REPO_ROOT / "examples" / "manifests" / manifest
    objects.cluster.kubectl("apply", "-n", objects.namespace, "-f", str(path))
    return str(yaml.safe_load(path.read_text())["metadata"]["name"])


@pytest.mark.timeout(300, func_only=True)
def test_paper_example_manifest_succeeds_with_its_results(objects: Objects, operator: OperatorProcess) -> None:
    name = apply_example(objects, "paper-example.yaml")
    done = objects.wait_program(name, {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert results(objects, done) == {"y": [3.0, 5.0], "z": [2.0, 4.0]}
    status = done["status"]
    assert status["stepsCompleted"] == 1 and status["progress"] == "1/1"
    assert status["startTime"] and status["completionTime"]
    assert status["sliceNames"] == "main=paper-example-main"
    assert condition(done, "Succeeded")["status"] == "True"
    exposition = operator.metrics()
    assert 'pathways_programs{phase="Succeeded"}' in exposition
    assert "pathways_admission_wait_seconds_count" in exposition
    dispatched = next(line for line in exposition.splitlines()
                      if line.startswith("pathways_computations_dispatched_total"))
    assert float(dispatched.split()[-1]) >= 4, "the paper example is four computations"
    objects.cluster.poll(
        lambda: objects.get("virtualslices", "paper-example-main") is None
        and not objects.pods("pathways.dev/slice=paper-example-main"),
        timeout=60, what="the program's inline slice removed when it ended",
    )


@pytest.mark.timeout(400, func_only=True)
@pytest.mark.parametrize("manifest", ["pipeline-training.yaml", "train-regression.yaml"])
def test_training_manifests_reduce_the_loss(
    objects: Objects, operator: OperatorProcess, manifest: str
) -> None:
    name = apply_example(objects, manifest)
    done = objects.wait_program(name, {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    losses = results(objects, done)["losses"]
    assert isinstance(losses, list) and len(losses) == done["spec"]["steps"]
    print(f"\n{name}: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.timeout(400, func_only=True)
def test_program_survives_gang_recreation(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(virtual_slice("shared", 8))
    objects.wait_slice("shared", "Ready", SLICE_READY_S, operator)
    objects.apply(program("steady", "examples.programs:paper_example", ref_slice("main", "shared"),
                          steps=12, args={"step_seconds": 0.5}))

    objects.wait_steps("steady", 2, PROGRAM_DONE_S, what="program mid-run")
    objects.core.delete_namespaced_pod("shared-1", objects.namespace)

    done = objects.wait_program("steady", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert objects.slice("shared")["status"]["restarts"] == 1
    v = [float(i) for i in range(1, 9)]
    assert results(objects, done) == {"y": [2 * x + 1 for x in v], "z": [2 * x for x in v]}
    assert done["status"]["stepsCompleted"] == 12
    assert_continued(objects.driver_starts("steady"), at_least=2)


def contended_grants(operator: OperatorProcess) -> dict[str, float]:
    """``pathways_contended_grants_total`` by weight, as the operator's /metrics shows it now."""
    return by_label(operator, "pathways_contended_grants_total", "weight")


@pytest.mark.timeout(400, func_only=True)
def test_programs_share_a_slice_by_weight(objects: Objects, operator: OperatorProcess) -> None:
    """Two programs keep one slice busy; while both wait for it, the island scheduler grants
    their computations 1:2, as their weights say (counted by the scheduler, not timed)."""
    objects.apply(virtual_slice("pool", 4))
    objects.wait_slice("pool", "Ready", SLICE_READY_S, operator)
    before = contended_grants(operator)
    steps, length = 6, 320  # calls longer than the scheduler's window (256): they queue, and compete
    for name, weight in (("light", 1), ("heavy", 2)):
        manifest = program(name, "tests.cluster.faulty_programs:chains", ref_slice("main", "pool"),
                           steps=steps, args={"length": length})
        manifest["spec"]["weight"] = weight
        objects.apply(manifest)
    for name in ("light", "heavy"):
        done = objects.wait_program(name, {"Succeeded", "Failed"}, PROGRAM_DONE_S * 2, operator)
        assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
        assert results(objects, done)["v"] == [float(steps * length)] * 4
    assert objects.get("virtualslices", "pool") is not None, "a referenced slice outlives its programs"
    after = contended_grants(operator)
    light = after.get("1", 0.0) - before.get("1", 0.0)
    heavy = after.get("2", 0.0) - before.get("2", 0.0)
    print(f"\ngrants while both waited for the slice: weight 1 {light:.0f}, weight 2 {heavy:.0f}")
    assert light >= 100, f"the programs hardly competed for the slice (weight 1: {light:.0f} grants)"
    assert abs(heavy / light - 2.0) <= 0.2, f"weight 2 got {heavy / light:.2f}x the grants of weight 1"


@pytest.mark.timeout(400, func_only=True)
def test_operator_restart_mid_program_changes_nothing(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(program("durable", "examples.programs:paper_example", inline_slice("main", 8),
                          steps=10, args={"step_seconds": 0.5}))

    objects.wait_steps("durable", 2, PROGRAM_DONE_S, what="program mid-run")
    pods_before = objects.pod_uids("pathways.dev/slice=durable-main")
    assert len(pods_before) == 2
    at_restart = objects.program("durable")["status"]["stepsCompleted"]

    operator.restart(kill=True)
    # the new operator's driver needs the slice Ready: two steps on, it has looked at the gang
    objects.wait_steps("durable", at_restart + 2, PROGRAM_DONE_S, interval=0.2,
                       what="two steps run under the new operator")
    assert objects.pod_uids("pathways.dev/slice=durable-main") == pods_before, "no pod created or lost"

    done = objects.wait_program("durable", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert results(objects, done)["y"] == [2.0 * i + 1 for i in range(1, 9)]
    assert operator.starts >= 2
    # its driver pod ran on through the restart: one run, from step 0, and no other
    assert objects.driver_starts("durable") == [RunStart(0, None)]


@pytest.mark.timeout(300, func_only=True)
def test_deleting_a_program_removes_its_inline_slices(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(program("brief", "examples.programs:paper_example", inline_slice("main", 4),
                          steps=1000, args={"step_seconds": 1.0}))
    objects.wait_slice("brief-main", "Ready", SLICE_READY_S, operator)
    assert objects.slice("brief-main")["metadata"]["ownerReferences"][0]["kind"] == "PathwaysProgram"

    objects.delete("pathwaysprograms", "brief")
    objects.cluster.poll(
        lambda: objects.get("pathwaysprograms", "brief") is None
        and objects.get("virtualslices", "brief-main") is None
        and not objects.pods("pathways.dev/slice=brief-main"),
        timeout=90, interval=0.5, what="program, its slice and its pods deleted",
    )


# -- invalid manifests ----------------------------------------------------------------------------


def test_schema_and_cel_reject_invalid_manifests(objects: Objects, cluster: Cluster) -> None:
    def rejected(manifest: dict[str, object]) -> str:
        result = cluster.kubectl("apply", "-n", objects.namespace, "-f", "-",
                                 input=json.dumps(manifest), check=False)
        assert result.returncode != 0, f"accepted: {manifest}"
        return result.stderr

    assert "spec.devices" in rejected(virtual_slice("negative", -2))

    objects.apply(virtual_slice("fixed", 2))
    assert "devices is immutable" in rejected(virtual_slice("fixed", 4))

    no_entrypoint = program("nothing", "examples.programs:paper_example", inline_slice("main", 2))
    no_entrypoint["spec"]["source"] = {}
    assert "source needs exactly one of entrypoint" in rejected(no_entrypoint)
    assert "spec.source.entrypoint" in rejected(program("malformed", "not an entrypoint", inline_slice("main", 2)))


@pytest.mark.timeout(120, func_only=True)
@pytest.mark.parametrize(
    ("entrypoint", "slice_spec", "field", "words"),
    [
        ("os.path:join", {"name": "main", "template": {"devices": 2}}, "spec.source.entrypoint", "examples."),
        ("examples.no_such_module:run", {"name": "main", "template": {"devices": 2}},
         "spec.source.entrypoint", "not importable"),
    ],
    ids=["disallowed-entrypoint", "unimportable-entrypoint"],
)
def test_invalid_programs_fail_naming_the_field(
    objects: Objects, operator: OperatorProcess, entrypoint: str, slice_spec: dict[str, object],
    field: str, words: str,
) -> None:
    objects.apply(program("invalid", entrypoint, slice_spec))
    failed = objects.wait_program("invalid", {"Failed"}, 60, operator)
    message = condition(failed, "Failed")["message"]
    assert field in message and words in message, message
    assert failed["status"]["message"] == message


@pytest.mark.timeout(400, func_only=True)
@pytest.mark.parametrize("container", ["dataflow", "worker"])
def test_program_survives_a_killed_host_process(
    objects: Objects, operator: OperatorProcess, container: str
) -> None:
    import os
    import signal

    objects.apply(virtual_slice("victim", 8))
    objects.wait_slice("victim", "Ready", SLICE_READY_S, operator)
    objects.apply(program("enduring", "examples.programs:paper_example", ref_slice("main", "victim"),
                          steps=8, args={"step_seconds": 0.5}))

    objects.wait_steps("enduring", 2, PROGRAM_DONE_S, what="program mid-run")
    host = objects.slice("victim")["status"]["hosts"][1]
    pid = objects.cluster.container_pid(objects.namespace, host["pod"], container)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    def recovered() -> bool:
        status = objects.slice("victim").get("status") or {}
        return status.get("phase") == "Ready" and status.get("restarts") == 1

    objects.cluster.poll(recovered, timeout=SLICE_READY_S, interval=0.5, what="gang recreated")
    print(f"\n{container} killed: slice Ready again after {time.monotonic() - killed:.1f} s")
    done = objects.wait_program("enduring", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert done["status"]["stepsCompleted"] == 8
    v = [float(i) for i in range(1, 9)]
    assert results(objects, done) == {"y": [2 * x + 1 for x in v], "z": [2 * x for x in v]}
    assert_continued(objects.driver_starts("enduring"), at_least=2)
