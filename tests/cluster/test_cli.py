"""The ``pathways`` CLI against a real API server, with no operator.

The CLI shows what the operator wrote into ``status``; so these tests write that status
themselves, through the status subresource exactly as the operator does, together with
the Events and labelled worker pods it would create. Then ``status``, ``describe``,
``logs``, ``-w`` and ``submit`` run as a user runs them (``main([...])`` with the test
cluster's kubeconfig), and their output and exit codes are checked.

Runs before ``test_operator.py`` (file order), whose session-wide operator would
otherwise reconcile these objects and overwrite their status.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from kubernetes import client

from pathways.cli import EXIT_FAILED, EXIT_OK, main
from pathways.cli.watch_state import SLICES, Listed, StreamFailed
from pathways.cli.watch_streams import follow
from pathways.kube import Kube, ResourceVersionGone
from tests.cluster.builders import container, pod
from tests.cluster.conftest import Cluster
from pathways_devcluster.controlplane import REPO_ROOT
from tests.cluster.program_files import double_inc_program

GROUP, VERSION = "pathways.dev", "v1alpha1"
Manifest = dict[str, Any]


# -- builders ----------------------------------------------------------------------------


def virtual_slice(name: str, devices: int, **spec: Any) -> Manifest:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VirtualSlice",
        "metadata": {"name": name},
        "spec": {"devices": devices, **spec},
    }


def pathways_program(name: str, *slices: Manifest, steps: int = 10, weight: float = 2) -> Manifest:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PathwaysProgram",
        "metadata": {"name": name},
        "spec": {
            "slices": list(slices),
            "source": {"entrypoint": "examples.programs:paper_example"},
            "steps": steps,
            "weight": weight,
        },
    }


def condition(type_: str, status: str, reason: str, message: str) -> Manifest:
    return {
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1,
    }  # fmt: skip


def ready_status(island: str, hosts: list[tuple[str, str, int]]) -> Manifest:
    return {
        "phase": "Ready",
        "island": island,
        "readyHosts": f"{len(hosts)}/{len(hosts)}",
        "restarts": 0,
        "hosts": [{"index": i, "pod": p, "node": n, "podIP": f"127.0.0.{100 + i}", "devices": d}
                  for i, (p, n, d) in enumerate(hosts)],
        "conditions": [condition("Admitted", "True", "Admitted", f"placed on {island}"),
                       condition("Ready", "True", "AllHostsRunning", f"{len(hosts)} hosts running")],
    }  # fmt: skip


def event(namespace: str, kind: str, name: str, reason: str, message: str) -> Manifest:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "name": name, "namespace": namespace},
        "reason": reason,
        "message": message,
        "type": "Normal",
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": "kube-pathways-operator"},
    }


def worker_pod(slice_name: str, index: int, greeting: str) -> Manifest:
    manifest = pod(
        f"{slice_name}-{index}",
        container("worker", "python", "-c", f"print({greeting!r})"),
        container("dataflow", "python", "-c", "print('sidecar up')"),
    )
    manifest["metadata"]["labels"].update({"pathways.dev/slice": slice_name, "pathways.dev/host-index": str(index)})
    return manifest


def row(text: str, first: str) -> list[str]:
    """The cells (split on spaces) of the table row whose first cell is ``first``."""
    found = [line.split() for line in text.splitlines() if line.split()[:1] == [first]]
    assert found, f"no row starting with {first!r} in:\n{text}"
    return found[0]


# -- the scene ---------------------------------------------------------------------------


@dataclass
class Scene:
    cluster: Cluster
    namespace: str

    def cli(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["--kubeconfig", str(self.cluster.kubeconfig), "-n", self.namespace, *argv], out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    @property
    def custom(self) -> Any:
        api: Any = client.CustomObjectsApi(self.cluster.api)
        return api

    def create(self, plural: str, manifest: Manifest) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, manifest)

    def set_status(self, plural: str, name: str, status: Manifest) -> None:
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, self.namespace, plural, name, {"status": status})


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds"))
    cluster.kubectl("wait", "--for", "condition=Established", "--timeout=30s",
                    "crd/virtualslices.pathways.dev", "crd/pathwaysprograms.pathways.dev", timeout=40)  # fmt: skip


@pytest.fixture(scope="module")
def scene(cluster: Cluster, crds: None) -> Iterator[Scene]:
    """A Ready shared slice with two hosts, a queued slice, and a program on the shared one."""
    namespace = cluster.create_namespace("cli")
    s = Scene(cluster, namespace)
    core: Any = client.CoreV1Api(cluster.api)
    s.create("virtualslices", virtual_slice("shared", 8, devicesPerHost=4))
    s.set_status("virtualslices", "shared", ready_status("island-a", [("shared-0", "a-0", 4), ("shared-1", "a-1", 4)]))
    s.create("virtualslices", virtual_slice("big", 16))
    s.set_status("virtualslices", "big", {
        "phase": "Pending",
        "conditions": [condition("Admitted", "False", "InsufficientDevices",
                                 "needs 16 devices on one island; best is island-a with 8 free")],
    })  # fmt: skip
    s.create("pathwaysprograms", pathways_program("train", {"name": "main", "ref": "shared"},
                                                  {"name": "aux", "template": {"devices": 4}}))  # fmt: skip
    s.set_status("pathwaysprograms", "train", {
        "phase": "Running", "stepsCompleted": 3, "progress": "3/10", "sliceNames": "main=shared,aux=train-aux",
        "conditions": [condition("Running", "True", "Running", "step 4 of 10")],
    })  # fmt: skip
    core.create_namespaced_event(namespace, event(namespace, "VirtualSlice", "shared", "Admitted", "Admitted on island-a"))
    for i in range(2):
        core.create_namespaced_pod(namespace, worker_pod("shared", i, f"hello from host {i}"))
    for i in range(2):
        cluster.wait_pod_phase(namespace, f"shared-{i}", {"Succeeded"}, timeout=45)
    yield s
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# -- status ------------------------------------------------------------------------------


def test_status_shows_both_tables(scene: Scene) -> None:
    code, out, _ = scene.cli("status")
    assert code == EXIT_OK
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert rows[0] == ["SLICE", "DEVICES", "ISLAND", "PHASE", "READY", "RESTARTS", "AGE"]
    assert rows[1][:6] == ["big", "16", "-", "Pending", "-", "0"]
    assert rows[2][:6] == ["shared", "8", "island-a", "Ready", "2/2", "0"]
    assert rows[3] == ["PROGRAM", "SLICES", "PHASE", "STEPS", "WEIGHT", "AGE"]
    assert rows[4][:5] == ["train", "main=shared,aux=train-aux", "Running", "3/10", "2"]


def test_status_wide_and_all_namespaces(scene: Scene) -> None:
    code, out, _ = scene.cli("status", "-A", "-o", "wide")
    assert code == EXIT_OK
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["NAMESPACE", "SLICE"]
    big = next(line for line in lines if f"{scene.namespace}   big" in line)
    assert big.endswith("InsufficientDevices: needs 16 devices on one island; best is island-a with 8 free")


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_status_as_documents(scene: Scene, fmt: str) -> None:
    code, out, _ = scene.cli("status", "-o", fmt)
    assert code == EXIT_OK
    doc = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert doc["kind"] == "List"
    assert sorted((i["kind"], i["metadata"]["name"]) for i in doc["items"]) == [
        ("PathwaysProgram", "train"), ("VirtualSlice", "big"), ("VirtualSlice", "shared"),
    ]  # fmt: skip


def test_status_of_an_empty_namespace(scene: Scene) -> None:
    empty = scene.cluster.create_namespace("cli-empty")
    code, out, _ = Scene(scene.cluster, empty).cli("status")
    assert (code, out.strip()) == (EXIT_OK, f"No VirtualSlices or PathwaysPrograms in namespace {empty}.")


def test_watch_prints_changes_and_stops_at_the_timeout(scene: Scene) -> None:
    scene.create("virtualslices", virtual_slice("watched", 4))

    def admit_later() -> None:
        time.sleep(1.5)
        scene.set_status("virtualslices", "watched", ready_status("island-b", [("watched-0", "b-0", 4)]))

    thread = threading.Thread(target=admit_later)
    thread.start()
    code, out, _ = scene.cli("status", "-w", "--timeout", "4s", "--interval", "0.2")
    thread.join()
    assert code == EXIT_OK  # the timeout ended the watch: nothing else would have
    first, _, rest = out.partition("\n--- ")
    assert row(first, "watched")[:4] == ["watched", "4", "-", "-"]
    assert row(rest, "watched")[:5] == ["watched", "4", "island-b", "Ready", "1/1"]


def test_watch_until_done_exits_with_the_programs_outcome(scene: Scene) -> None:
    ns = scene.cluster.create_namespace("cli-done")
    other = Scene(scene.cluster, ns)
    other.create("pathwaysprograms", pathways_program("ok", {"name": "main", "ref": "shared"}, steps=1))
    other.create("pathwaysprograms", pathways_program("bad", {"name": "main", "ref": "shared"}, steps=1))

    def finish_later() -> None:
        time.sleep(1.0)
        other.set_status("pathwaysprograms", "ok", {"phase": "Succeeded", "stepsCompleted": 1})
        other.set_status("pathwaysprograms", "bad", {"phase": "Failed", "message": "host lost"})

    thread = threading.Thread(target=finish_later)
    thread.start()
    code, _, err = other.cli("status", "-w", "--until-done", "--timeout", "30s", "--interval", "0.2")
    thread.join()
    assert code == EXIT_FAILED and "programs failed: bad" in err
    other.set_status("pathwaysprograms", "bad", {"phase": "Succeeded"})
    assert other.cli("status", "-w", "--until-done", "--timeout", "10s")[0] == EXIT_OK
    timed_out = other.cli("status", "-A", "-w", "--until-done", "--timeout", "1s", "--interval", "0.2")
    assert timed_out[0] == EXIT_FAILED and "timed out after 1s waiting for" in timed_out[2]


# -- describe ----------------------------------------------------------------------------


def test_describe_waiting_slice_says_why(scene: Scene) -> None:
    code, out, _ = scene.cli("describe", "slice", "big")
    assert code == EXIT_OK
    assert "Waiting:       InsufficientDevices: needs 16 devices on one island; best is island-a with 8 free" in out


def test_describe_ready_slice_shows_hosts_pods_programs_and_events(scene: Scene) -> None:
    code, out, _ = scene.cli("describe", "slice", "shared")
    assert code == EXIT_OK
    assert "Devices:       8 (4 per host)" in out
    assert row(out, "0") == ["0", "shared-0", "a-0", "127.0.0.100", "4", "Succeeded", "0"]
    assert row(out, "train") == ["train", "Running", "3/10", "2"]
    assert "Normal   Admitted" in out and "kube-pathways-operator   Admitted on island-a" in out


def test_describe_program_shows_its_slices(scene: Scene) -> None:
    code, out, _ = scene.cli("describe", "program", "train")
    assert code == EXIT_OK
    assert "Source:        entrypoint examples.programs:paper_example" in out
    assert row(out, "main") == ["main", "shared", "shared", "8", "island-a", "Ready", "2/2"]
    assert row(out, "aux") == ["aux", "train-aux", "inline", "-", "-", "not", "found", "-"]


@pytest.mark.parametrize("argv", [["describe", "slice", "nope"], ["describe", "program", "nope"], ["logs", "program", "nope"]])
def test_missing_objects_exit_1_with_the_servers_words(scene: Scene, argv: list[str]) -> None:
    code, _, err = scene.cli(*argv)
    assert code == EXIT_FAILED
    assert '"nope" not found' in err


# -- logs --------------------------------------------------------------------------------


def test_logs_of_a_program_are_prefixed_by_host(scene: Scene) -> None:
    code, out, err = scene.cli("logs", "program", "train", "--log-dir", str(scene.cluster.state_dir))
    assert code == EXIT_OK, err
    assert out.splitlines() == ["[shared/host-0] hello from host 0", "[shared/host-1] hello from host 1"]
    code, out, _ = scene.cli("logs", "slice", "shared", "--all-containers", "--log-dir", str(scene.cluster.state_dir / "pods"))
    assert "[shared/host-1/dataflow] sidecar up" in out.splitlines()


def test_logs_through_the_api_server_are_the_nodes_log_files(scene: Scene) -> None:
    code, out, err = scene.cli("logs", "program", "train")
    assert code == EXIT_OK, err
    assert out.splitlines() == ["[shared/host-0] hello from host 0", "[shared/host-1] hello from host 1"]
    code, out, err = scene.cli("logs", "slice", "shared", "--tail", "1", "--all-containers")
    assert code == EXIT_OK, err
    assert "[shared/host-1/dataflow] sidecar up" in out.splitlines()


DRIVER_LOG = "--- starting at step 0: -m pathways.driver\nTraceback (most recent call last):\nValueError: boom\n"


def test_logs_of_a_finished_program_show_its_driver_log(scene: Scene) -> None:
    """What the operator leaves of an ended program: its status, and its driver's log in a
    ConfigMap the program owns; its inline slice and that slice's pods are gone."""
    scene.create("pathwaysprograms", pathways_program("finished", {"name": "main", "template": {"devices": 4}}, steps=1))
    scene.set_status("pathwaysprograms", "finished", {
        "phase": "Failed", "message": "the entrypoint raised ValueError: boom", "sliceNames": "main=finished-main",
    })  # fmt: skip
    core: Any = client.CoreV1Api(scene.cluster.api)
    core.create_namespaced_config_map(scene.namespace, {
        "metadata": {"name": "finished-driver-log", "labels": {"pathways.dev/program": "finished"}},
        "data": {"driver.log": DRIVER_LOG},
    })  # fmt: skip
    code, out, err = scene.cli("logs", "program", "finished")
    assert code == EXIT_OK, err
    assert out.splitlines() == [f"[driver] {line}" for line in DRIVER_LOG.splitlines()]
    code, out, _ = scene.cli("logs", "program", "finished", "--tail", "1")
    assert (code, out) == (EXIT_OK, "[driver] ValueError: boom\n")


# -- submit ------------------------------------------------------------------------------


PROGRAM_FILE = double_inc_program()


@pytest.mark.timeout(180)
def test_submit_wait_prints_the_results(scene: Scene, tmp_path: Path) -> None:
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM_FILE)
    core: Any = client.CoreV1Api(scene.cluster.api)

    def succeed_when_created() -> None:  # what the operator does when the driver reports results
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                scene.custom.get_namespaced_custom_object(GROUP, VERSION, scene.namespace, "pathwaysprograms", "waited")
                break
            except client.ApiException:
                time.sleep(0.2)
        core.create_namespaced_config_map(scene.namespace, {
            "metadata": {"name": "waited-results"}, "data": {"output_1": "[2.0, 4.0]", "output_0": "[3.0, 5.0]"},
        })  # fmt: skip
        scene.set_status("pathwaysprograms", "waited", {
            "phase": "Succeeded", "stepsCompleted": 1,
            "results": {"configMap": "waited-results", "keys": ["output_0", "output_1"]},
        })  # fmt: skip

    thread = threading.Thread(target=succeed_when_created)
    thread.start()
    code, out, err = scene.cli("submit", str(path), "--name", "waited", "--wait", "--timeout", "2m")
    thread.join()
    assert code == EXIT_OK, err
    assert out.splitlines() == [
        "pathwaysprogram.pathways.dev/waited created (ConfigMap waited-compiled)",
        "output_0: [3.0, 5.0]",
        "output_1: [2.0, 4.0]",
    ]
    assert "waited: Succeeded 1/1 step" in err


@pytest.mark.timeout(180)
def test_submit_stores_a_complete_program_owned_by_its_pathwaysprogram(scene: Scene, tmp_path: Path) -> None:
    from pathways_wire.compiled_program import CompiledProgram
    from pathways.runtime import connect, shutdown

    path = tmp_path / "prog.py"
    path.write_text(PROGRAM_FILE)
    code, out, err = scene.cli("submit", str(path), "--steps", "4")
    assert code == EXIT_OK, err
    assert out.strip() == "pathwaysprogram.pathways.dev/double-inc created (ConfigMap double-inc-compiled)"
    program = scene.custom.get_namespaced_custom_object(GROUP, VERSION, scene.namespace, "pathwaysprograms", "double-inc")
    assert program["spec"]["source"] == {"configMapRef": {"name": "double-inc-compiled"}} and program["spec"]["steps"] == 4
    core: Any = client.CoreV1Api(scene.cluster.api)
    raw = json.loads(core.read_namespaced_config_map("double-inc-compiled", scene.namespace, _preload_content=False).data)
    assert [o["uid"] for o in raw["metadata"]["ownerReferences"]] == [program["metadata"]["uid"]]
    again = scene.cli("submit", str(path))
    assert again[0] == EXIT_FAILED and "already exists" in again[2]

    compiled = CompiledProgram.from_config_map(raw)
    runtime = connect()
    try:
        (y,) = runtime.run(compiled.program, list(compiled.inputs), compiled.weight)
        np.testing.assert_allclose(y, [3.0, 5.0])  # while the runtime that holds it is up
    finally:
        shutdown()


# -- watch streams -----------------------------------------------------------------------


def test_a_watch_from_a_version_the_server_no_longer_keeps_is_gone(scene: Scene) -> None:
    kube = Kube.connect(str(scene.cluster.kubeconfig), None, scene.namespace)
    with pytest.raises(ResourceVersionGone, match="resourceVersion 1 is gone"):
        list(kube.watch_custom(SLICES, scene.namespace, "1", 5))


def test_following_slices_lists_again_when_the_server_says_gone(scene: Scene) -> None:
    kube = Kube.connect(str(scene.cluster.kubeconfig), None, scene.namespace)
    watched_from: list[str] = []

    def watch_from(version: str) -> Iterator[tuple[str, Manifest]]:
        watched_from.append(version)
        return kube.watch_custom(SLICES, scene.namespace, "1" if len(watched_from) == 1 else version, 2)

    stopped = threading.Event()
    listed: list[Listed] = []
    for update in follow(SLICES, lambda: kube.list_custom(SLICES, scene.namespace), watch_from, stopped, 0.1):
        assert not isinstance(update, StreamFailed), update
        if isinstance(update, Listed):
            listed.append(update)
        if len(listed) == 2:
            stopped.set()
            break
    names = [sorted(o["metadata"]["name"] for o in update.items) for update in listed]
    assert names[0] == names[1] and {"big", "shared"} <= set(names[0])
    assert watched_from[0] != "1" and len(watched_from) == 1
