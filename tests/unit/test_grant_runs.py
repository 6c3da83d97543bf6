"""Grants on the wire as runs (`pathways_wire.grant_runs`): what goes in comes out, in order."""

from __future__ import annotations

from pathways_wire import pathways_pb2 as pb
from pathways_wire.grant_runs import grants_in, runs_of, seqs_of


def test_a_lone_calls_consecutive_grants_are_one_run() -> None:
    grants = [(7 + i, "c", 3 * i) for i in range(128)]
    runs = runs_of(grants)
    assert [(r.call_id, r.first_seq, len(r.nodes)) for r in runs] == [("c", 7, 128)]
    assert list(grants_in(pb.GrantBatch(runs=runs))) == grants


def test_a_new_run_starts_at_another_call_or_a_gap_in_the_numbers() -> None:
    grants = [(1, "a", 0), (2, "a", 1), (3, "b", 0), (5, "b", 1), (6, "a", 2)]
    runs = runs_of(grants)
    assert [(r.call_id, r.first_seq, list(r.nodes)) for r in runs] == [
        ("a", 1, [0, 1]), ("b", 3, [0]), ("b", 5, [1]), ("a", 6, [2]),
    ]
    batch = pb.GrantBatch.FromString(pb.GrantBatch(runs=runs).SerializeToString())
    assert list(grants_in(batch)) == grants


def test_no_grants_make_no_runs() -> None:
    assert runs_of([]) == []
    assert list(grants_in(pb.GrantBatch())) == []


def test_a_completion_stands_for_its_own_grant_or_a_runs_grants() -> None:
    assert list(seqs_of(pb.Completion(seq=5, ok=True))) == [5]
    assert list(seqs_of(pb.Completion(seq=5, ok=True, count=3))) == [5, 6, 7]


def test_consecutive_numbers_of_two_calls_are_two_runs_from_a_list_or_a_stream() -> None:
    grants = [(1, "a", 0), (2, "a", 1), (3, "b", 0), (4, "b", 1)]
    for given in (grants, iter(grants)):
        assert [(r.call_id, r.first_seq, list(r.nodes)) for r in runs_of(given)] == [
            ("a", 1, [0, 1]), ("b", 3, [0, 1]),
        ]
