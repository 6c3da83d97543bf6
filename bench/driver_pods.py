"""Experiment 9: program drivers in pods of their own, against drivers run inside the operator.

On the bench cluster of experiment 6 (`bench.control_plane`: a real control plane, one
node agent serving island `island-bench` of 4 nodes × 4 devices), two operators take
turns, never both serving: one with driver pods (the default), one with
`--driver-runtime processes`, which runs each driver as a child process of the operator
(the design before driver pods). Each repeat, on each in turn: `kubectl apply` the paper
example (`examples/manifests/paper-example.yaml`, under a fresh name), and time from just
before the command until the program's `status.stepsCompleted` first says a step is done
(the driver's first step, as a user sees it) and until `status.phase == Succeeded`
(polled every 50 ms); then delete it and wait until its pods are gone. Alternating the
two within one run puts both under the same load. The ratio is pods ÷ processes: what a
pod of its own (scheduling, the node agent starting a container, the driver's imports in
a fresh process, reports over gRPC) costs over a child process of the operator.

The operator writes `stepsCompleted` once per look at a running program (about every
second), so both figures carry up to a second of that period, the same for both runtimes.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any

import yaml

from bench.control_plane import GONE_TIMEOUT_S, POLL_S, _Bench, _bench_cluster, _missing_harness
from bench.measure import Figure, figure

EXP = "9 driver pods"
RUN_TIMEOUT_S = 240.0
RUNTIMES = ("pods", "processes")


def _paper_example() -> dict[str, Any]:
    from pathways_devcluster.controlplane import REPO_ROOT

    manifest: dict[str, Any] = yaml.safe_load((REPO_ROOT / "examples/manifests/paper-example.yaml").read_text())
    return manifest


def run(repeats: int) -> list[Figure]:
    why = _missing_harness()
    if why is not None:
        return [Figure(EXP, "kubectl apply → first step / Succeeded, driver pods vs in-operator drivers", "",
                       float("nan"), float("nan"), float("nan"), 0, note=f"not run: {why}")]
    from tests.cluster.harness import OperatorProcess

    first: dict[str, list[float]] = {r: [] for r in RUNTIMES}
    done: dict[str, list[float]] = {r: [] for r in RUNTIMES}
    with _bench_cluster() as bench:
        pods_operator = bench.operator
        processes_dir = bench.operator.run_dir.parent / "operator-processes"
        processes_dir.mkdir()
        processes_operator = OperatorProcess(pods_operator.kubeconfig, processes_dir, "--driver-runtime", "processes")
        operators = {"pods": pods_operator, "processes": processes_operator}
        serving = "pods"
        try:
            for i in range(repeats):
                for runtime in RUNTIMES:
                    if serving != runtime:
                        operators[serving].stop()
                        operators[runtime].start()
                        serving = runtime
                    bench.operator = operators[runtime]
                    step_s, succeeded_s = _time_program(bench, f"paper-{runtime}-{i}")
                    first[runtime].append(step_s)
                    done[runtime].append(succeeded_s)
        finally:
            processes_operator.close()
            bench.operator = pods_operator
            if serving != "pods":
                pods_operator.start()
    return [
        figure(EXP, "in-operator driver (child process): apply → first step", "s", first["processes"],
               note="--driver-runtime processes, the design before driver pods"),
        figure(EXP, "driver pod: apply → first step", "s", first["pods"], baseline="in-operator driver",
               ratio=statistics.median(first["pods"]) / statistics.median(first["processes"]),
               baseline_samples=first["processes"], note="paper example, a 2-device inline slice"),
        figure(EXP, "in-operator driver (child process): apply → Succeeded", "s", done["processes"],
               note="--driver-runtime processes"),
        figure(EXP, "driver pod: apply → Succeeded", "s", done["pods"], baseline="in-operator driver",
               ratio=statistics.median(done["pods"]) / statistics.median(done["processes"]),
               baseline_samples=done["processes"], note="results stored in ConfigMap paper-*-results"),
    ]


def _time_program(bench: _Bench, name: str) -> tuple[float, float]:
    """Seconds from `kubectl apply` of the paper example named ``name`` to its first step and to Succeeded."""
    manifest = copy.deepcopy(_paper_example())
    manifest["metadata"]["name"] = name
    start = bench._apply(manifest)
    first_step: float | None = None
    deadline = start + RUN_TIMEOUT_S
    while True:
        status = (bench.objects.get("pathwaysprograms", name) or {}).get("status") or {}
        now = time.monotonic()
        if first_step is None and int(status.get("stepsCompleted") or 0) >= 1:
            first_step = now - start
        if status.get("phase") == "Succeeded":
            succeeded = now - start
            break
        if status.get("phase") == "Failed" or now >= deadline:
            raise RuntimeError(f"program {name}: {status.get('phase') or 'no phase'} after {now - start:.0f} s: "
                               f"{status.get('message', '')}\n{bench.operator.log_tail(2000)}")
        time.sleep(POLL_S)
    bench.objects.delete("pathwaysprograms", name)
    bench._wait(lambda: bench.objects.get("pathwaysprograms", name) is None
                and not bench.objects.pods(f"pathways.dev/program={name}")
                and not bench.objects.pods(f"pathways.dev/slice={name}-main"),
                f"program {name} and its pods gone", GONE_TIMEOUT_S)
    return first_step if first_step is not None else succeeded, succeeded
