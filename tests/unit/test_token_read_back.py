"""When the operator may read a program's Secret to check a token it has not seen."""

from __future__ import annotations

import pytest

from pathways_operator.core.token_read_back import ReadBackGate


def test_a_program_whose_secret_was_missing_is_not_read_again_within_the_hold() -> None:
    gate = ReadBackGate(rate_per_s=100, burst=10, miss_hold_s=5.0)
    assert gate.allow("ns/ghost", 0.0)
    gate.missed("ns/ghost", 0.0)
    assert not gate.allow("ns/ghost", 4.9)
    assert gate.allow("ns/other", 4.9)
    assert gate.allow("ns/ghost", 5.0)


def test_a_found_secret_forgets_the_miss() -> None:
    gate = ReadBackGate(rate_per_s=100, burst=10, miss_hold_s=5.0)
    gate.missed("ns/train", 0.0)
    gate.found("ns/train")
    assert gate.allow("ns/train", 0.1)


def test_reads_over_all_programs_stay_within_the_bucket() -> None:
    gate = ReadBackGate(rate_per_s=2.0, burst=3, miss_hold_s=0.0)
    allowed = [gate.allow(f"ns/p{i}", 0.0) for i in range(10)]
    assert allowed == [True] * 3 + [False] * 7
    assert gate.allow("ns/late", 0.5)  # half a second at 2/s: one more
    assert not gate.allow("ns/later", 0.5)
    allowed_later = [gate.allow(f"ns/q{i}", 100.0) for i in range(5)]
    assert allowed_later == [True] * 3 + [False] * 2  # refilled to the burst, not beyond


def test_a_clock_that_steps_back_refills_nothing() -> None:
    gate = ReadBackGate(rate_per_s=1.0, burst=1, miss_hold_s=0.0)
    assert gate.allow("ns/a", 10.0)
    assert not gate.allow("ns/b", 5.0)
    assert not gate.allow("ns/c", 10.5)
    assert gate.allow("ns/d", 11.0)


def test_remembered_misses_are_bounded_the_oldest_forgotten_first() -> None:
    gate = ReadBackGate(rate_per_s=1000, burst=1000, miss_hold_s=60.0, max_misses=3)
    for i in range(4):
        gate.missed(f"ns/p{i}", float(i))
    assert gate.allow("ns/p0", 4.0)  # forgotten: read again
    assert not gate.allow("ns/p3", 4.0)


@pytest.mark.parametrize("args", [dict(rate_per_s=0), dict(burst=0), dict(miss_hold_s=-1), dict(max_misses=0)])
def test_a_gate_that_could_never_read_is_refused(args: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="positive rate"):
        ReadBackGate(**args)  # type: ignore[arg-type]
