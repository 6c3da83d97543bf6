"""Experiment 5 (paper Fig. 8): four programs with weights 1:2:4:8 sharing one slice.

Four client threads each call their own chained program (`CHAIN` computations
of a calibrated cost) on one named 1-device slice for a window of time, and the
window is repeated. With more computations queued than the island scheduler's
window, stride scheduling decides the order. In each window a program's share is
its rate of completed computations (counted over whole calls, from its first
call's start to its last call's end) over the sum of the rates, judged relative
to its weight's share (`bench.verdicts.SHARE_TOLERANCE`). Utilization is the
window's completed computations per second over the baseline: the same slice's
throughput with one tenant alone, measured in the same run as separate calls of
the same program. Above 1 it means that baseline is wrong, and the verdict says so.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import pathways as pw
from bench import workloads
from bench.measure import Figure, figure, timed
from bench.verdicts import MIN_REPEATS, SHARE_TOLERANCE, share_error, share_met

EXP = "5 multi-tenancy"
WEIGHTS = (1.0, 2.0, 4.0, 8.0)
CHAIN = 128


def _contend(programs: list[Any], x: Any, seconds: float) -> tuple[list[float], float, list[int]]:
    """Every program called in a loop by its own thread for ``seconds``.

    Returns each program's rate (computations/s over its own calls), the rate of
    all computations completed over the window's wall time, and each one's calls.
    """
    done: list[list[tuple[float, float]]] = [[] for _ in programs]
    start = time.perf_counter()
    stop = start + seconds

    def tenant(i: int) -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            programs[i](x).block_until_ready()
            done[i].append((t0, time.perf_counter()))

    threads = [threading.Thread(target=tenant, args=(i,)) for i in range(len(programs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    rates = [CHAIN * len(d) / (d[-1][1] - d[0][0]) if d else 0.0 for d in done]
    return rates, CHAIN * sum(len(d) for d in done) / wall, [len(d) for d in done]


def run(target_ms: tuple[float, ...], seconds: float, repeats: int) -> list[Figure]:
    """``repeats`` windows of ``seconds / repeats`` each, per computation size."""
    figures: list[Figure] = []
    for ms in target_ms:
        n = workloads.size_for_ms(ms)
        pw.connect(islands={"island-a": 8}, devices_per_host=4)
        shared = pw.make_virtual_device_set().add_slice(devices=1, name="shared")
        step = pw.jit(workloads.matmul, slice=shared)
        programs = []
        for w in WEIGHTS:
            def chain(x: Any) -> Any:
                for _ in range(CHAIN):
                    x = step(x)
                return x
            programs.append(pw.program(chain, name=f"tenant-w{w:g}-{n}", weight=w))
        x = workloads.size_input(n)
        for p in programs:
            p(x)
        alone = [CHAIN / timed(lambda: programs[0](x).block_until_ready()) for _ in range(max(repeats, MIN_REPEATS))]
        windows = [_contend(programs, x, seconds / repeats) for _ in range(repeats)]
        label = f"{ms:g} ms comps ({workloads.label(n)})"
        want = [w / sum(WEIGHTS) for w in WEIGHTS]
        for i, w in enumerate(WEIGHTS):
            shares = [rates[i] / (sum(rates) or 1.0) for rates, _, _ in windows]
            calls = sum(c[i] for _, _, c in windows)
            f = figure(EXP, f"{label}: weight {w:g} share", "fraction", shares,
                       baseline=f"weight share {want[i]:.3f}", baseline_exact=True,
                       target=f"within {SHARE_TOLERANCE:.0%} of {want[i]:.3f}",
                       note=f"{calls} calls of {CHAIN} in {repeats} windows")
            f.ratio = f.median / want[i]
            f.met = share_met(f.median, want[i])
            figures.append(f)
        worst = [max(share_error(rates[i] / (sum(rates) or 1.0), want[i]) for i in range(len(WEIGHTS)))
                 for rates, _, _ in windows]
        figures.append(figure(EXP, f"{ms:g} ms comps: worst relative share error", "fraction", worst,
                              baseline="weight shares", baseline_exact=True,
                              target=f"≤ {SHARE_TOLERANCE:g}", met=statistics.median(worst) <= SHARE_TOLERANCE))
        single = statistics.median(alone)
        util = figure(EXP, f"{ms:g} ms comps: utilization", "fraction",
                      [total / single for _, total, _ in windows],
                      baseline="one tenant alone on the slice", baseline_samples=alone, limit=1.0,
                      target="≥ 0.9", note=f"alone: {single:.0f} computations/s")
        util.met = util.median >= 0.9
        figures.append(util)
        pw.shutdown()
    return figures
