"""The order a call's computations are granted in: by remote depth, ties in trace order."""

from __future__ import annotations

import random

from pathways_operator.core.grant_order import grant_order, remote_depths
from pathways_operator.core.island_scheduler import IslandScheduler, ScheduledComputation


def pipeline_trace(microbatches: int) -> list[ScheduledComputation]:
    """A two-stage pipeline step as a microbatch loop traces it: per microbatch, stage 0's
    forward (slice a), stage 1's forward-backward (b), stage 0's backward (a); then
    each stage's update (a, b) and the mean loss (b)."""
    comps: list[ScheduledComputation] = []
    backwards, stage1 = [], []
    for _ in range(microbatches):
        f0 = len(comps)
        comps.append(ScheduledComputation(f0, "a"))
        comps.append(ScheduledComputation(f0 + 1, "b", (f0,)))
        comps.append(ScheduledComputation(f0 + 2, "a", (f0 + 1,)))
        stage1.append(f0 + 1)
        backwards.append(f0 + 2)
    n = len(comps)
    comps.append(ScheduledComputation(n, "a", tuple(backwards)))
    comps.append(ScheduledComputation(n + 1, "b", tuple(stage1)))
    comps.append(ScheduledComputation(n + 2, "b", tuple(stage1)))
    return comps


def per_slice(order: list[ScheduledComputation]) -> dict[str, list[int]]:
    runs: dict[str, list[int]] = {}
    for c in order:
        runs.setdefault(c.slice_id, []).append(c.node)
    return runs


def test_a_pipeline_step_runs_every_forward_of_stage_0_before_any_backward() -> None:
    runs = per_slice(grant_order(pipeline_trace(4)))
    forwards, backwards = [0, 3, 6, 9], [2, 5, 8, 11]
    assert runs["a"] == forwards + backwards + [12]
    assert runs["b"] == [1, 4, 7, 10, 13, 14]


def test_remote_depth_counts_moves_between_slices_not_computations() -> None:
    depths = remote_depths(pipeline_trace(2))
    assert depths == {0: 0, 1: 1, 2: 2, 3: 0, 4: 1, 5: 2, 6: 2, 7: 1, 8: 1}


def test_a_program_on_one_slice_keeps_its_trace_order() -> None:
    comps = [ScheduledComputation(0, "a"), ScheduledComputation(1, "a"),
             ScheduledComputation(2, "a", (0, 1)), ScheduledComputation(3, "a", (2,)),
             ScheduledComputation(4, "a")]
    assert grant_order(comps) == comps


def random_dag(rng: random.Random, n: int, slices: str) -> list[ScheduledComputation]:
    return [
        ScheduledComputation(i, rng.choice(slices),
                             tuple(sorted(rng.sample(range(i), rng.randint(0, min(i, 3))))))
        for i in range(n)
    ]


def test_the_grant_order_is_topological_for_random_graphs() -> None:
    rng = random.Random(7)
    for _ in range(300):
        comps = random_dag(rng, rng.randint(1, 30), "abc")
        order = grant_order(comps)
        assert sorted(c.node for c in order) == [c.node for c in comps]
        position = {c.node: i for i, c in enumerate(order)}
        for c in order:
            assert all(position[d] < position[c.node] for d in c.deps), (comps, order)


def test_the_island_scheduler_accepts_the_grant_order_and_grants_it_in_that_order() -> None:
    order = grant_order(pipeline_trace(3))
    sched = IslandScheduler(window=64)
    sched.submit("call", 1.0, order)
    granted = sched.grants()
    assert [g.node for g in sorted(granted, key=lambda g: g.seq)] == [c.node for c in order]
