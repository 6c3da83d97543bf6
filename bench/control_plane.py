"""Experiment 6: the control plane -- pure-core placement, then apply → Ready on a cluster.

Pure core: 1,000 hosts (4 devices each) over 8 islands, 500 queued slices of 1–8
hosts: `core.admission.admit` decides the whole queue at once against its index of
free capacity per island (decisions/s = queue length over its time), beside
`admit_on(MachineScan(...))`, the reference that scans every machine per decision, timed in the
same run on the same inputs (and checked to decide the same); once with devices
only and once with cpu/memory requests on every host. Then one gang at a time:
`CapacityIndex.place` against `place_gang`'s scan.

Cluster: the cluster test tier's harness (`tests.cluster`), outside pytest -- a real
etcd + kube-apiserver + kube-controller-manager + kube-scheduler (`ControlPlane`), one
node agent (the kubelet stand-in that runs containers as local processes) serving one
island `island-bench` of 4 nodes × 4 `pathways.dev/device`, and the operator as a
process (`OperatorProcess`), after `kubectl apply -f crds/`. Four nodes of four devices,
rather than hosts of two devices on the test tier's 2-node islands, so a slice of n
hosts is n pods of 4 devices each, one per node -- the same shape as the baseline.

After one unrecorded warm-up slice (the first slice of a fresh cluster, and the
client's first call, pay one-off costs), each repeat goes through n in (1, 2, 4) hosts
in turn, so every size sees the same load: `kubectl apply` a VirtualSlice of 4n
devices, time from just before the command until `status.phase == Ready` (read from a
watch, as `kubectl wait` reads it: the operator admitted it, bound the gang, and every
host's worker has formed the slice's JAX job), then time a first computation on it (a PathwaysProgram of
one step of the paper example, applied at Ready, until the step is done: the controller
serves only a program's own driver), then delete it and wait until its pods are gone. The baseline is
n plain pods applied in one `kubectl apply` (a List), each requesting 4 devices so the
default kube-scheduler puts one per node, running `python -c "time.sleep(600)"`, timed
until all are Ready (from a watch too); then deleted and waited for. The ratio is slice ÷ plain pods: what
the operator's admission, gang binding and the slice's own containers cost over the
bare Kubernetes path on the same nodes. The target is the largest slice's apply →
Ready against the 1-host slice's (≤ 2×): a gang's start-up must not grow with its
hosts. What does grow with them on one machine is the hosts' own start, n processes
importing jax on the same cores; `start_floor` measures that alone, in the same run,
and `gang_floor` a whole gang of n hosts (worker and sidecar processes) started by the
embedded runtime's launcher, without Kubernetes, from which follows the least the
target's ratio can be on these cores.

Everything is bounded (a slice or pods not Ready within `READY_TIMEOUT_S` fails the
experiment's cluster figures; start-up within the harness's own timeouts) and torn down
in `finally` blocks (the harness's processes also die with this one, PDEATHSIG). With no
Kubernetes binaries or kubectl the cluster figures say "not run: <reason>".
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.measure import Figure, figure
from pathways_operator.core.admission import AdmissionResult, QueuedGang, admit, admit_on
from pathways_operator.core.free_capacity import CapacityIndex
from pathways_operator.core.placement import GangRequest, HostResources, Machine, MachineScan, place_gang

EXP = "6 control plane"


def _inventory(hosts: int = 1000, islands: int = 8, cpu: int = 0, memory: int = 0) -> list[Machine]:
    rng = random.Random(0)
    machines = []
    for i in range(hosts):
        used = rng.choice((0, 0, 0, 4))
        machines.append(Machine(f"node-{i}", f"island-{i % islands}", 4, used,
                                allocatable_cpu_millis=cpu, allocatable_memory_bytes=memory,
                                used_cpu_millis=cpu * used // 4, used_memory_bytes=memory * used // 4))
    return machines


def _queue(n: int = 500, needs: HostResources = HostResources()) -> list[QueuedGang]:
    rng = random.Random(1)
    return [
        QueuedGang(GangRequest(f"slice-{i}", 4 * rng.choice((1, 1, 2, 4, 8)), host_resources=needs),
                   queued_at=float(i))
        for i in range(n)
    ]


def run(repeats: int, cluster_repeats: int, hosts: Sequence[int] = (1, 2, 4)) -> list[Figure]:
    return _pure_core(repeats) + cluster_figures(cluster_repeats, hosts)


PLACEMENT_TARGET = 10_000
"""Decisions/s that admission must reach for 500 queued slices over 1,000 hosts."""

GiB = 1 << 30


def _pure_core(repeats: int) -> list[Figure]:
    """Admission and single placements with the free-capacity index, each beside the scan it replaces."""
    figures = []
    workloads = (
        ("", _inventory(), _queue()),
        (", cpu/memory requests", _inventory(cpu=16_000, memory=64 * GiB),
         _queue(needs=HostResources(3_000, 12 * GiB))),
    )
    for label, machines, queue in workloads:
        def by_scan(queue: list[QueuedGang], machines: list[Machine], now: float) -> AdmissionResult:
            return admit_on(MachineScan(machines), queue, now=now)

        def admit_per_s(decide: Callable[..., AdmissionResult]) -> float:
            start = time.perf_counter()
            decide(queue, machines, now=1e9)
            return len(queue) / (time.perf_counter() - start)

        result = admit(queue, machines, now=1e9)
        if result != by_scan(queue, machines, now=1e9):
            raise AssertionError(f"admit() and admission by scan decide differently{label}")
        scan = figure(EXP, f"admit() by scan{label}: 500 queued slices, 1000 hosts, 8 islands",
                      "decisions/s", [admit_per_s(by_scan) for _ in range(repeats)],
                      note="the reference, a scan of every machine per decision")
        indexed = figure(EXP, f"admit(){label}: 500 queued slices, 1000 hosts, 8 islands", "decisions/s",
                         [admit_per_s(admit) for _ in range(repeats)], baseline="scan",
                         baseline_samples=scan.samples, target=f"≥ {PLACEMENT_TARGET:,} decisions/s",
                         note=f"{len(result.admitted)} admitted, {len(result.waiting)} waiting; same decisions")
        indexed.ratio = indexed.median / scan.median
        indexed.met = indexed.median >= PLACEMENT_TARGET
        figures += [scan, indexed]
    machines, queue = workloads[0][1], workloads[0][2]
    index = CapacityIndex(machines)

    def place_per_s(place: Callable[[GangRequest], object]) -> float:
        start = time.perf_counter()
        for gang in queue[:100]:
            place(gang.request)
        return 100 / (time.perf_counter() - start)

    scan = figure(EXP, "place_gang() by scan: one gang, 1000 hosts", "decisions/s",
                  [place_per_s(lambda r: place_gang(r, machines)) for _ in range(repeats)])
    indexed = figure(EXP, "CapacityIndex.place(): one gang, 1000 hosts", "decisions/s",
                     [place_per_s(index.place) for _ in range(repeats)], baseline="scan",
                     baseline_samples=scan.samples)
    indexed.ratio = indexed.median / scan.median
    return figures + [scan, indexed]


# -- cluster: kubectl apply → Ready ---------------------------------------------------------

ISLAND = "bench"
NODES = 4
DEVICES_PER_NODE = 4
READY_TIMEOUT_S = 120.0
GONE_TIMEOUT_S = 90.0
POLL_S = 0.05


def _not_run(hosts: Sequence[int], why: str) -> list[Figure]:
    return [Figure(EXP, f"kubectl apply → Ready ({', '.join(map(str, hosts))} hosts) vs plain pods",
                   "", float("nan"), float("nan"), float("nan"), 0, note=f"not run: {why}")]


def _missing_harness() -> str | None:
    """Why the cluster half cannot start here, or None."""
    try:
        from pathways_devcluster.binaries import MissingBinariesError, find_binaries
    except ImportError as err:  # pytest or the kubernetes client missing
        return f"the cluster harness does not import ({err})"
    try:
        find_binaries()
    except MissingBinariesError as err:
        return str(err).splitlines()[0]
    if shutil.which("kubectl") is None:
        return "no `kubectl` on PATH"
    return None


GANG_TARGET = 2.0
"""apply → Ready of the largest slice at most this many times the 1-host slice's."""


def _hosts(n: int) -> str:
    return f"{n} host{'s' if n > 1 else ''}"


def cluster_figures(repeats: int, hosts: Sequence[int] = (1, 2, 4)) -> list[Figure]:
    why = _missing_harness()
    if why is not None:
        return _not_run(hosts, why)
    assert max(hosts) <= NODES
    slices: dict[int, list[float]] = {n: [] for n in hosts}
    first: dict[int, list[float]] = {n: [] for n in hosts}
    failed: dict[int, list[str]] = {n: [] for n in hosts}
    floor: dict[int, list[float]] = {n: [] for n in hosts}
    gangs: dict[int, list[float]] = {n: [] for n in hosts}
    pods: dict[int, list[float]] = {n: [] for n in hosts}
    with _bench_cluster() as bench:
        bench.slice_ready("warm-up", min(hosts))
        for i in range(repeats):
            for n in hosts:
                ready, computed = bench.slice_ready(f"s{n}-{i}", n)
                slices[n].append(ready)
                if isinstance(computed, str):
                    failed[n].append(computed)
                else:
                    first[n].append(computed)
                floor[n].append(_start_jax(n))
                gangs[n].append(_start_gang(n))
                pods[n].append(bench.pods_ready(f"p{n}-{i}", n))
    out: list[Figure] = []
    for n in hosts:
        plain = statistics.median(pods[n])
        out.append(figure(EXP, f"plain pods: create → all Ready, {n} pod{'s' if n > 1 else ''}",
                          "s", pods[n], note="default scheduler, one pod of 4 devices per node"))
        out.append(figure(EXP, f"VirtualSlice: kubectl apply → Ready, {_hosts(n)}",
                          "s", slices[n], baseline=f"{n} plain pod{'s' if n > 1 else ''}",
                          baseline_samples=pods[n], ratio=statistics.median(slices[n]) / plain,
                          note=f"{4 * n} devices, 4 per host"))
        what = f"VirtualSlice: Ready → first computation, {_hosts(n)}"
        missing = (f"; {len(failed[n])} of {repeats} repeats failed: {failed[n][0]}" if failed[n] else "")
        if first[n]:
            out.append(figure(EXP, what, "s", first[n],
                              note="a PathwaysProgram applied at Ready until its first step: its driver pod "
                                   "starting, then the paper example's four computations compiled and run"
                                   + missing))
        else:
            out.append(Figure(EXP, what, "s", float("nan"), float("nan"), float("nan"), 0,
                              note=f"not run{missing}"))
    low, high = min(hosts), max(hosts)
    if high > low:
        gang = figure(EXP, f"VirtualSlice: kubectl apply → Ready, {_hosts(high)} vs {_hosts(low)}", "s",
                      slices[high], baseline=f"{_hosts(low)} slice", baseline_samples=slices[low],
                      ratio=statistics.median(slices[high]) / statistics.median(slices[low]),
                      target=f"≤ {GANG_TARGET:g}× the {_hosts(low)} slice",
                      note="each measured in this run; the floor below is what the hosts' own start costs")
        gang.met = gang.ratio is not None and gang.ratio <= GANG_TARGET
        out.append(gang)
    return out + start_floor(floor) + gang_floor(gangs, slices)


def start_floor(samples: dict[int, list[float]]) -> list[Figure]:
    """n processes starting JAX at once (`import jax; jax.devices()`, 4 CPU devices), beside one.

    Each host's worker does this before it can join its slice's JAX job, all of a
    gang's hosts at the same time on this machine's cores: the part of a gang's
    start-up that grows with its size however the hosts are started. It is timed
    right after each slice of the same size, with the cluster running, so it shares
    the machine as the slice did.
    """
    return _beside_smallest(
        samples, lambda n: f"floor: {n} process{'es' if n > 1 else ''} starting JAX at once",
        lambda n: f"{n} process", "python -c 'import jax; jax.devices()', until the last exits")


def _beside_smallest(samples: dict[int, list[float]], name: Callable[[int], str], baseline: Callable[[int], str],
                     note: str) -> list[Figure]:
    """A figure in seconds per size, each larger one beside the smallest size's samples."""
    low = min(samples)
    return [figure(EXP, name(n), "s", samples[n], baseline=baseline(low) if n != low else "",
                   baseline_samples=samples[low] if n != low else [],
                   ratio=statistics.median(samples[n]) / statistics.median(samples[low]) if n != low else None,
                   note=note)
            for n in sorted(samples)]


def gang_floor(gangs: dict[int, list[float]], slices: dict[int, list[float]]) -> list[Figure]:
    """A gang of n hosts started as local processes, beside one host; and the target's floor.

    `pathways_operator.local_hosts.LocalHostLauncher` (the embedded runtime's) starts
    every host's worker and sidecar at once, exactly the processes of a host pod, and
    returns when every sidecar says its worker has joined the slice's JAX job: a gang's
    start with nothing of Kubernetes around it. If Kubernetes added nothing for a
    gang's extra hosts, the largest slice would take the 1-host slice's time plus what
    the larger gang's own start takes beyond the 1-host gang's; over the 1-host slice,
    that is the least the target's ratio can be on these cores.
    """
    low, high = min(gangs), max(gangs)
    out = _beside_smallest(
        gangs, lambda n: f"floor: a gang of {_hosts(n)} started as local processes",
        lambda n: f"a gang of {_hosts(n)}",
        "each host's worker and sidecar started at once by the embedded runtime's launcher, until "
        "every worker has joined the JAX job")
    if high > low:
        one = statistics.median(slices[low])
        least = [one + g - statistics.median(gangs[low]) for g in gangs[high]]
        out.append(figure(EXP, f"floor: kubectl apply → Ready, {_hosts(high)} vs {_hosts(low)}, if "
                          f"Kubernetes added nothing for the extra hosts", "s", least,
                          baseline=f"{_hosts(low)} slice", baseline_samples=slices[low],
                          ratio=statistics.median(least) / one,
                          note=f"the {_hosts(low)} slice's median, plus each {_hosts(high)} gang's start "
                               f"beyond the median {_hosts(low)} gang's"))
    return out


def _start_gang(n: int) -> float:
    from pathways_operator.controller.gangs import HostRequest
    from pathways_operator.local_hosts import LocalHostLauncher

    state = Path(tempfile.mkdtemp(prefix="kpw-bench-gang-"))
    launcher = LocalHostLauncher(state, lambda host, why: None)
    try:
        requests = [HostRequest("bench-gang", f"gang-{os.getpid()}-{n}", i, n, DEVICES_PER_NODE,
                                f"local-{i}", token="bench-gang-token") for i in range(n)]
        start = time.monotonic()
        hosts = launcher.launch(requests)
        elapsed = time.monotonic() - start
        launcher.stop(hosts)
        return elapsed
    finally:
        launcher.close()
        shutil.rmtree(state, ignore_errors=True)


def _start_jax(n: int) -> float:
    # as a host's worker starts JAX (`pathways_worker.lifecycle.single_threaded_blas`)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "OPENBLAS_NUM_THREADS": "1"}
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", "import jax; jax.devices()"], env=env)
             for _ in range(n)]
    for proc in procs:
        if proc.wait(timeout=READY_TIMEOUT_S) != 0:
            raise RuntimeError(f"`import jax; jax.devices()` exited with {proc.returncode}")
    return time.monotonic() - start


class _Bench:
    """One namespace on the bench cluster; times slices and plain pods in it."""

    def __init__(self, cluster: Any, operator: Any, namespace: str) -> None:
        from tests.cluster.harness import Objects

        self.cluster = cluster
        self.operator = operator
        self.namespace = namespace
        self.objects = Objects(cluster, namespace)

    def _wait(self, check: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f} s; operator log tail:\n"
                                   f"{self.operator.log_tail(2000)}")
            time.sleep(POLL_S)

    def _watch_until(self, list_fn: Callable[..., Any], args: tuple[Any, ...], selector: str,
                     done: Callable[[dict[str, Any]], bool], what: str, timeout: float) -> None:
        """Until ``done`` holds for the namespace's objects that ``list_fn`` lists (by name,
        as the API serves them, JSON), read from a watch as the API server sends each change,
        the way ``kubectl wait`` reads it. Polled every 50 ms instead, the bench's own reads
        were about a third of the API server's requests while a 4-host slice started on these
        2 cores, and their CPU came out of the slice's start."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        deadline = time.monotonic() + timeout
        seen: dict[str, dict[str, Any]] = {}
        while (left := deadline - time.monotonic()) > 0:
            stream = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for event in stream.stream(list_fn, *args, label_selector=selector,  # type: ignore[no-untyped-call]
                                           timeout_seconds=max(1, int(left))):
                    found = event["raw_object"]
                    name = found.get("metadata", {}).get("name", "")
                    if event["type"] == "DELETED":
                        seen.pop(name, None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        seen[name] = found
                    if done(seen):
                        return
            except ApiException as err:
                if err.status != 410:  # 410: the watch fell too far behind; list afresh
                    raise
            finally:
                stream.stop()  # type: ignore[no-untyped-call]
            seen.clear()  # the stream ended (its timeout, or a 410): the next one lists afresh
        raise TimeoutError(f"{what}: not within {timeout:.0f} s; operator log tail:\n"
                           f"{self.operator.log_tail(2000)}")

    def _custom(self, plural: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        from tests.cluster.builders import GROUP, VERSION

        return self.objects.custom.list_namespaced_custom_object, (GROUP, VERSION, self.namespace, plural)

    def _apply(self, manifest: dict[str, Any]) -> float:
        start = time.monotonic()
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(manifest))
        return start

    def slice_ready(self, name: str, n: int) -> tuple[float, float | str]:
        """apply → Ready, then Ready → a first computation on the slice (or why it failed)."""
        from tests.cluster.builders import virtual_slice

        start = self._apply(virtual_slice(name, DEVICES_PER_NODE * n, island=f"island-{ISLAND}"))

        def ready(slices: dict[str, dict[str, Any]]) -> bool:
            return bool(((slices.get(name) or {}).get("status") or {}).get("phase") == "Ready")

        self._watch_until(*self._custom("virtualslices"), "", ready, f"VirtualSlice {name} Ready", READY_TIMEOUT_S)
        ready_at = time.monotonic()
        try:
            first: float | str = self._first_computation(name) - ready_at
        except (RuntimeError, TimeoutError) as err:
            first = str(err).splitlines()[0]
        self.objects.delete("virtualslices", name)
        self._wait(lambda: not self.objects.pods(f"pathways.dev/slice={name}")
                   and self.objects.get("virtualslices", name) is None,
                   f"VirtualSlice {name} and its pods gone", GONE_TIMEOUT_S)
        return ready_at - start, first

    def _first_computation(self, name: str) -> float:
        """A PathwaysProgram of one step on the VirtualSlice ``name``; returns when that step
        was seen done (`time.monotonic`), after deleting the program and waiting for it to go.

        The operator's controller serves only a program's own driver (its client
        token), so the first computation is a program's: its driver pod starts, connects,
        and runs one step of the paper example on the slice.
        """
        from tests.cluster.builders import program, ref_slice

        first = f"{name}-first"
        self._apply(program(first, "examples.programs:paper_example", ref_slice("main", name), steps=1))

        def stepped(programs: dict[str, dict[str, Any]]) -> bool:
            status = (programs.get(first) or {}).get("status") or {}
            if status.get("phase") == "Failed":
                raise RuntimeError(f"PathwaysProgram {first} failed: {status.get('message', '')}")
            return int(status.get("stepsCompleted") or 0) >= 1 or status.get("phase") == "Succeeded"

        self._watch_until(*self._custom("pathwaysprograms"), "", stepped, f"PathwaysProgram {first}'s first step",
                          READY_TIMEOUT_S)
        stepped_at = time.monotonic()
        self.objects.delete("pathwaysprograms", first)
        self._wait(lambda: self.objects.get("pathwaysprograms", first) is None
                   and not self.objects.pods(f"pathways.dev/program={first}"),
                   f"PathwaysProgram {first} and its driver gone", GONE_TIMEOUT_S)
        return stepped_at

    def pods_ready(self, name: str, n: int) -> float:
        from tests.cluster.builders import container, pod

        items = []
        for i in range(n):
            manifest = pod(f"{name}-{i}", container(
                "main", "python", "-c", "import time; time.sleep(600)"), grace_seconds=2)
            manifest["metadata"]["labels"] = {"bench": name}
            manifest["spec"]["containers"][0]["resources"] = {
                "requests": {"pathways.dev/device": str(DEVICES_PER_NODE)},
                "limits": {"pathways.dev/device": str(DEVICES_PER_NODE)},
            }
            manifest["spec"]["nodeSelector"] = {"pathways.dev/island": f"island-{ISLAND}"}
            items.append(manifest)
        start = self._apply({"apiVersion": "v1", "kind": "List", "items": items})

        def all_ready(pods: dict[str, dict[str, Any]]) -> bool:
            return len(pods) == n and all(
                any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (p.get("status") or {}).get("conditions") or [])
                for p in pods.values())

        self._watch_until(self.objects.core.list_namespaced_pod, (self.namespace,), f"bench={name}", all_ready,
                          f"{n} plain pods {name} Ready", READY_TIMEOUT_S)
        elapsed = time.monotonic() - start
        self.cluster.kubectl("delete", "pods", "-n", self.namespace, "-l", f"bench={name}",
                             "--wait=false")
        self._wait(lambda: not self.objects.pods(f"bench={name}"), f"plain pods {name} gone",
                   GONE_TIMEOUT_S)
        return elapsed


@contextmanager
def _bench_cluster() -> Iterator[_Bench]:
    """Control plane + one node agent (island-bench, 4 × 4 devices) + CRDs + the operator."""
    from pathways_devcluster.controlplane import REPO_ROOT, ControlPlane
    from tests.cluster.harness import CRDS, Cluster, OperatorProcess
    from pathways_devcluster.node_agent import NodeAgentProcess, NodeSpec

    run_dir = Path(tempfile.mkdtemp(prefix="kpw-bench-"))
    try:
        with ControlPlane(run_dir / "controlplane") as control_plane:
            nodes = [NodeSpec(f"{ISLAND}-{i}", f"island-{ISLAND}", DEVICES_PER_NODE)
                     for i in range(NODES)]
            with NodeAgentProcess(control_plane.kubeconfig, nodes, run_dir / "node-agent") as agent:
                api = control_plane.api_client()
                try:
                    cluster = Cluster(control_plane=control_plane, api=api, agent=agent,
                                      run_dir=run_dir)
                    cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds"))
                    cluster.kubectl("wait", "--for", "condition=Established", "--timeout=30s",
                                    *(f"crd/{name}" for name in CRDS), timeout=40)
                    (run_dir / "operator").mkdir()
                    operator = OperatorProcess(control_plane.kubeconfig, run_dir / "operator")
                    try:
                        operator.start()
                        namespace = cluster.create_namespace("bench")
                        yield _Bench(cluster, operator, namespace)
                    finally:
                        operator.stop()
                finally:
                    api.close()  # type: ignore[no-untyped-call]
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
