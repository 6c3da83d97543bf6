"""Experiment 6: placement decisions per second of the pure core.

1,000 hosts (4 devices each) over 8 islands, 500 queued slices of 1–8 hosts:
`core.admission.admit` decides the whole queue at once (decisions/s = queue
length over its time), and `core.placement.place_gang` places one gang at a
time. The cluster half (kubectl apply → Ready vs plain pods) needs the
operator's cluster harness and is not run here.
"""

from __future__ import annotations

import random
import time

from bench.measure import Figure, figure
from pathways_operator.core.admission import QueuedGang, admit
from pathways_operator.core.placement import GangRequest, Machine, place_gang

EXP = "6 control plane"


def _inventory(hosts: int = 1000, islands: int = 8) -> list[Machine]:
    rng = random.Random(0)
    return [
        Machine(f"node-{i}", f"island-{i % islands}", 4, rng.choice((0, 0, 0, 4)))
        for i in range(hosts)
    ]


def _queue(n: int = 500) -> list[QueuedGang]:
    rng = random.Random(1)
    return [
        QueuedGang(GangRequest(f"slice-{i}", 4 * rng.choice((1, 1, 2, 4, 8))), queued_at=float(i))
        for i in range(n)
    ]


def run(repeats: int) -> list[Figure]:
    machines, queue = _inventory(), _queue()
    per_s = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = admit(queue, machines, now=1e9)
        per_s.append(len(queue) / (time.perf_counter() - start))
    admitted = len(result.admitted)
    single = []
    for _ in range(repeats):
        start = time.perf_counter()
        for gang in queue[:100]:
            place_gang(gang.request, machines)
        single.append(100 / (time.perf_counter() - start))
    return [
        figure(EXP, "admit(): 500 queued slices, 1000 hosts, 8 islands", "decisions/s", per_s,
               note=f"{admitted} admitted, {len(queue) - admitted} waiting"),
        figure(EXP, "place_gang(): one gang, 1000 hosts", "decisions/s", single),
        Figure(EXP, "kubectl apply → Ready (1, 2, 4 hosts) vs plain pods", "", float("nan"),
               float("nan"), float("nan"), 0,
               note="not run: the operator's cluster harness is still being finished"),
    ]
