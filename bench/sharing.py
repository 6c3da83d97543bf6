"""Experiment 5 (paper Fig. 8): four programs with weights 1:2:4:8 sharing one slice.

Four client threads each call their own chained program (`CHAIN` computations
of a calibrated cost) on one named 1-device slice for a window of time, and the
window is repeated. Each keeps its next call queued behind the running one
(calls return futures, as asynchronous dispatch has it), so no tenant leaves
the slice between its calls. With more computations queued than the island
scheduler's window, stride scheduling decides the order. A window lasts until
every program has finished a call (the lightest, with a fifteenth of the
slice, takes about fifteen times as long per call as alone).

In each window a program's share is its rate of completed computations over
the sum of the rates, judged relative to its weight's share
(`bench.verdicts.SHARE_TOLERANCE`). A rate counts the whole calls that ended
while all programs were still calling, over the time from the window's start
to the last of them: calls ending later ran with fewer tenants and would
flatter the light ones, whose one call outlasts the window. Utilization is each
window's completed computations per second over those of the single-tenant
window taken just before it, in the same round: the slice's capacity, measured
side by side, so that a machine that speeds up or slows down during the run
moves both alike. The figure is the median of those ratios. The single-tenant
windows have one tenant alone, calling the same program the same way, in windows
as long, counted the same way (every computation completed, over the window's
wall time until its last call ended). (A tenant's rate counts only calls ended
before the stop, and the end of a call with the next one queued behind it can
reach the client a finish batch later than it happened (`host_state`, Batching):
within a short window that cost the lone tenant's rate several percent that the
contended total never paid.) Above 1 it means that baseline is wrong, or that
contention costs less than the windows' noise, and the verdict says so. The
baseline was the fastest single-tenant window of the run: a maximum over five
noisy windows against a median of five, which reads low by the noise itself: in
all 34 utilization figures of `bench/results` measured that way (2026-11-25 to
2026-11-29), the median of the paired ratios read 0.010 to 0.092 higher.

A window that begins after the slice was calm measures the onset of
contention, not the shares: a tenant alone on a slice has a whole scheduler
window (256 computations) granted ahead, and whoever comes next waits behind
it. So before each contended window one is run and not counted, and the
contended window begins where it left the slice. Likewise a lone tenant on a
lately contended slice is granted little ahead until a whole window has gone
calm (`island_scheduler`), so each single-tenant window follows one of its own,
not counted.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import pathways as pw
from bench import workloads
from bench.measure import Figure, figure
from bench.verdicts import MIN_REPEATS, SHARE_TOLERANCE, share_error, share_met

EXP = "5 multi-tenancy"
WEIGHTS = (1.0, 2.0, 4.0, 8.0)
CHAIN = 128
CALM_S = 1.0
"""The single tenant's window before each counted one, not counted: the first calls ran
slow in every run, and the slice goes calm again after contention."""


def _contend(programs: list[Any], x: Any, seconds: float) -> tuple[list[float], float, list[int]]:
    """Every program called in a loop by its own thread, until ``seconds`` have passed
    and each has finished a call.

    Returns each program's rate (computations/s over the calls it finished before
    the stop, from the common start to the last of them), the rate of all
    computations completed over the window's wall time, and each one's counted calls.
    Calls that end after the stop are not counted: from then on the programs leave
    one by one, and a call still running has the slice more to itself.
    """
    ended: list[list[float]] = [[] for _ in programs]
    stop = threading.Event()
    start = time.perf_counter()

    def tenant(i: int) -> None:
        running = programs[i](x)
        while not stop.is_set():
            queued = programs[i](x)
            running.block_until_ready()
            ended[i].append(time.perf_counter())
            running = queued
        running.block_until_ready()
        ended[i].append(time.perf_counter())

    threads = [threading.Thread(target=tenant, args=(i,)) for i in range(len(programs))]
    for t in threads:
        t.start()
    while all(t.is_alive() for t in threads) and (time.perf_counter() < start + seconds or not all(ended)):
        time.sleep(0.01)
    stopped = time.perf_counter()
    stop.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    counted = [[at for at in e if at <= stopped] for e in ended]
    rates = [CHAIN * len(c) / (c[-1] - start) if c else 0.0 for c in counted]
    return rates, CHAIN * sum(len(e) for e in ended) / wall, [len(c) for c in counted]


def run(target_ms: tuple[float, ...], seconds: float, repeats: int) -> list[Figure]:
    """``repeats`` (at least `MIN_REPEATS`) contended windows of ``seconds / repeats`` each,
    per computation size, each after a single-tenant window as long."""
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
        alone: list[float] = []
        windows = []
        for _ in range(max(repeats, MIN_REPEATS)):
            _contend(programs[:1], x, CALM_S)
            alone.append(_contend(programs[:1], x, seconds / repeats)[1])
            _contend(programs, x, 0.0)  # the onset of contention, not counted (see the module docstring)
            windows.append(_contend(programs, x, seconds / repeats))
        label = f"{ms:g} ms comps ({workloads.label(n)})"
        want = [w / sum(WEIGHTS) for w in WEIGHTS]
        for i, w in enumerate(WEIGHTS):
            shares = [rates[i] / (sum(rates) or 1.0) for rates, _, _ in windows]
            calls = sum(c[i] for _, _, c in windows)
            f = figure(EXP, f"{label}: weight {w:g} share", "fraction", shares,
                       baseline=f"weight share {want[i]:.3f}", baseline_exact=True,
                       target=f"within {SHARE_TOLERANCE:.0%} of {want[i]:.3f}",
                       note=f"{calls} calls of {CHAIN} in {len(windows)} windows")
            f.ratio = f.median / want[i]
            f.met = share_met(f.median, want[i])
            figures.append(f)
        worst = [max(share_error(rates[i] / (sum(rates) or 1.0), want[i]) for i in range(len(WEIGHTS)))
                 for rates, _, _ in windows]
        figures.append(figure(EXP, f"{ms:g} ms comps: worst relative share error", "fraction", worst,
                              baseline="weight shares", baseline_exact=True,
                              target=f"≤ {SHARE_TOLERANCE:g}", met=statistics.median(worst) <= SHARE_TOLERANCE))
        util = figure(EXP, f"{ms:g} ms comps: utilization", "fraction",
                      [total / single for (_, total, _), single in zip(windows, alone, strict=True)],
                      baseline="one tenant alone on the slice, the window before each", baseline_samples=alone,
                      limit=1.0, limit_each=False,
                      target="≥ 0.9",
                      note=f"each window over the lone tenant's window just before it; alone: median "
                           f"{statistics.median(alone):.0f} computations/s of {len(alone)} windows")
        util.met = util.median >= 0.9
        figures.append(util)
        pw.shutdown()
    return figures
