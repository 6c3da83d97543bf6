"""Experiment 5 (paper Fig. 8): four programs with weights 1:2:4:8 sharing one slice.

Four client threads each call their own chained program (`CHAIN` computations
of a calibrated cost) on one named 1-device slice for a fixed time. With more
computations queued than the island scheduler's window, stride scheduling
decides the order. A program's share is its rate of completed computations
(counted over whole calls, from its first call's start to its last call's end)
over the sum; utilization is device time of completed computations (at plain
jax.jit's cost per computation) over the wall time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pathways as pw
from bench import workloads
from bench.measure import Figure

EXP = "5 multi-tenancy"
WEIGHTS = (1.0, 2.0, 4.0, 8.0)
CHAIN = 128


def run(target_ms: tuple[float, ...], seconds: float) -> list[Figure]:
    figures: list[Figure] = []
    for ms in target_ms:
        n = workloads.size_for_ms(ms)
        comp_us = sorted(workloads.jax_chain_us(n, 16, 3))[1]
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
        done: list[list[tuple[float, float]]] = [[] for _ in WEIGHTS]
        stop = time.perf_counter() + seconds
        start_all = time.perf_counter()

        def tenant(i: int) -> None:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                programs[i](x)
                done[i].append((t0, time.perf_counter()))

        threads = [threading.Thread(target=tenant, args=(i,)) for i in range(len(WEIGHTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start_all
        rates = [
            CHAIN * len(d) / (d[-1][1] - d[0][0]) if d else 0.0 for d in done
        ]
        total_rate = sum(rates) or 1.0
        want = [w / sum(WEIGHTS) for w in WEIGHTS]
        worst = 0.0
        for i, w in enumerate(WEIGHTS):
            share = rates[i] / total_rate
            err = abs(share - want[i])
            worst = max(worst, err)
            figures.append(Figure(
                EXP, f"{ms:g} ms comps ({workloads.label(n)}): weight {w:g} share", "fraction",
                share, share, share, len(done[i]), baseline=f"weight share {want[i]:.3f}",
                ratio=share / want[i], note=f"{len(done[i])} calls of {CHAIN}",
            ))
        busy = sum(CHAIN * len(d) for d in done) * comp_us / 1e6
        util = Figure(EXP, f"{ms:g} ms comps: utilization", "fraction", busy / wall, busy / wall,
                      busy / wall, 1, baseline="jax.jit device time", target="≥ 0.9", met=busy / wall >= 0.9,
                      note=f"{comp_us / 1e3:.2f} ms per computation in jax.jit")
        shares = Figure(EXP, f"{ms:g} ms comps: worst share error", "fraction", worst, worst, worst, 1,
                        target="within 0.05 of the weights", met=worst <= 0.05)
        figures += [shares, util]
        pw.shutdown()
    return figures
