"""The order a call's computations are granted in: fewest moves between slices first.

Every host of a slice runs its grants strictly in sequence order (see
`island_scheduler`), so the order in which a call's computations are granted is the
order in which each slice runs them. A program's trace order interleaves its slices
the way the user's loop does: a pipeline that loops over microbatches puts, on stage
0's slice, the backward of microbatch 1 before the forward of microbatch 2. That
backward waits for a round trip through stage 1 (an activation out, stage 1's work,
a gradient back), stage 0 runs nothing meanwhile, and every microbatch pays the
round trip in turn.

`grant_order` grants by *remote depth* instead: the most moves between slices on any
path from the call's inputs to a computation (an input made on another slice counts
one more than its producer's depth; one made on the same slice, none). Computations
of equal depth keep their trace order. For a two-stage pipeline this is GPipe's
schedule: every forward of stage 0, then stage 1's steps as the activations arrive,
then stage 0's backwards as the gradients come back. Each slice first runs all that
it can without waiting on another slice. A program whose computations all run on
one slice keeps its trace order.

It is a topological order, all that the scheduler's deadlock argument asks for: a
consumer's depth is at least its producer's (greater when they are on different
slices), and at equal depth the producer comes first in the trace.

The cost is memory: the values between stages of every microbatch can be alive at
once, as in GPipe, where the trace order would have freed each microbatch's before
starting the next.
"""

from __future__ import annotations

from collections.abc import Sequence

from pathways_operator.core.island_scheduler import ScheduledComputation


def remote_depths(computations: Sequence[ScheduledComputation]) -> dict[int, int]:
    """Each node's remote depth; ``computations`` in a topological order."""
    slice_of = {c.node: c.slice_id for c in computations}
    depth: dict[int, int] = {}
    for c in computations:
        depth[c.node] = max(
            (depth[d] + (slice_of[d] != c.slice_id) for d in c.deps), default=0
        )
    return depth


def grant_order(computations: Sequence[ScheduledComputation]) -> list[ScheduledComputation]:
    """``computations`` (a topological order) sorted by remote depth, ties in their given order."""
    depth = remote_depths(computations)
    return sorted(computations, key=lambda c: depth[c.node])
