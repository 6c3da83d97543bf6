"""Grants on the wire as runs of consecutive sequence numbers of one call, and their completions too.

The island scheduler grants a call's computations with consecutive sequence numbers
unless another call's grants come between, so a lone call's 128 grants to a slice are
one `GrantRun` (its call, the first number, the nodes packed) rather than 128 `Grant`
messages: building and parsing those cost the controller and the host about a
microsecond per grant each, on the path between two calls. A host answers a run of grants that succeeded with no
output inline as one `Completion` whose `count` says how many it stands for.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from pathways_wire import pathways_pb2 as pb


def runs_of(grants: Iterable[tuple[int, str, int]]) -> list[pb.GrantRun]:
    """(seq, call id, node) in sequence order, as runs."""
    if isinstance(grants, Sequence) and grants:
        (first, call_id, _), (last, *_) = grants[0], grants[-1]
        if last - first == len(grants) - 1 and all(g[1] == call_id for g in grants):
            return [pb.GrantRun(call_id=call_id, first_seq=first, nodes=[g[2] for g in grants])]
    runs: list[pb.GrantRun] = []
    call_id, first = "", 0
    nodes: list[int] = []
    for seq, cid, node in grants:
        if nodes and (cid != call_id or seq != first + len(nodes)):
            runs.append(pb.GrantRun(call_id=call_id, first_seq=first, nodes=nodes))
            nodes = []
        if not nodes:
            call_id, first = cid, seq
        nodes.append(node)
    if nodes:
        runs.append(pb.GrantRun(call_id=call_id, first_seq=first, nodes=nodes))
    return runs


def grants_in(batch: pb.GrantBatch) -> Iterator[tuple[int, str, int]]:
    """The batch's grants, (seq, call id, node), in sequence order."""
    for run in batch.runs:
        call_id, first = run.call_id, run.first_seq
        for i, node in enumerate(run.nodes):
            yield first + i, call_id, node


def seqs_of(completion: pb.Completion) -> range:
    """The sequence numbers a completion stands for: its own, or a run's (`count`)."""
    return range(completion.seq, completion.seq + max(completion.count, 1))
