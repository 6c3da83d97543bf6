"""Which operator leads (``core/leadership.py``): the decisions behind the operator's Lease."""

from __future__ import annotations

import pytest

from pathways_operator.core.leadership import Act, LeaseRecord, Leadership, renewal_lost


def _held(holder: str, renewed: str = "t0", transitions: int = 0, duration_s: float = 15.0) -> LeaseRecord:
    return LeaseRecord(holder=holder, renewed=renewed, duration_s=duration_s, transitions=transitions)


def test_no_lease_is_made_held_by_this_operator() -> None:
    step = Leadership("op-a").observe(None, now=0.0)
    assert (step.act, step.transitions) == (Act.CREATE, 0)


def test_a_lease_held_by_this_operator_is_renewed_without_changing_hands() -> None:
    step = Leadership("op-a").observe(_held("op-a", transitions=3), now=0.0)
    assert (step.act, step.transitions) == (Act.RENEW, 3)


def test_a_given_back_lease_is_taken_at_once_and_counts_a_change_of_hands() -> None:
    step = Leadership("op-b").observe(_held("", transitions=3), now=0.0)
    assert (step.act, step.transitions) == (Act.TAKE, 4)


def test_a_renewed_lease_of_another_is_waited_for_however_long_it_is_held() -> None:
    lead = Leadership("op-b")
    for k in range(10):  # op-a renews every 10 s: each renewal is a new record, seen fresh
        step = lead.observe(_held("op-a", renewed=f"t{k}"), now=10.0 * k)
        assert (step.act, step.holder, step.lapses_in_s) == (Act.WAIT, "op-a", 15.0)


def test_a_lease_left_unrenewed_lapses_a_full_duration_after_it_was_first_seen_here() -> None:
    lead = Leadership("op-b")
    assert lead.observe(_held("op-a"), now=100.0).act is Act.WAIT
    waiting = lead.observe(_held("op-a"), now=115.0)
    assert (waiting.act, waiting.lapses_in_s) == (Act.WAIT, 0.0), "the lapse is judged on this clock, not on t0"
    step = lead.observe(_held("op-a", transitions=2), now=115.5)
    assert step.act is Act.WAIT, "a changed record (another count) is seen anew"
    step = lead.observe(_held("op-a", transitions=2), now=130.6)
    assert (step.act, step.transitions) == (Act.TAKE, 3)


def test_a_lease_that_reappears_after_it_was_deleted_is_judged_from_when_it_reappeared() -> None:
    lead = Leadership("op-b")
    lead.observe(_held("op-a"), now=0.0)
    assert lead.observe(None, now=20.0).act is Act.CREATE
    assert lead.observe(_held("op-a"), now=21.0).act is Act.WAIT


def test_an_empty_identity_is_refused() -> None:
    with pytest.raises(ValueError, match="identity"):
        Leadership("")


@pytest.mark.parametrize(("last", "now", "lost"), [(0.0, 10.0, False), (0.0, 10.01, True), (5.0, 14.0, False)])
def test_a_leader_stops_once_it_could_not_renew_for_the_deadline(last: float, now: float, lost: bool) -> None:
    assert renewal_lost(last, now, renew_deadline_s=10.0) is lost
