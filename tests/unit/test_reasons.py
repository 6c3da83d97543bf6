"""Conditions follow metav1: lastTransitionTime moves only when status changes."""

from __future__ import annotations

import pytest

from pathways_operator.core.reasons import (
    Condition,
    ConditionStatus,
    Reason,
    SliceConditionType,
    find_condition,
    is_condition_true,
    set_condition,
)

T0 = "2025-01-01T00:00:00Z"
T1 = "2025-01-01T00:05:00Z"


def admitted(status: ConditionStatus = "False", reason: Reason = Reason.INSUFFICIENT_DEVICES, msg: str = "") -> Condition:
    return Condition(SliceConditionType.ADMITTED, status, reason, msg, observed_generation=1)


def test_new_condition_is_appended_with_now() -> None:
    ready = Condition(SliceConditionType.READY, "False", Reason.GANG_LAUNCHING)
    out = set_condition([ready], admitted(), T0)
    assert [c.type for c in out] == ["Ready", "Admitted"]
    assert out[1].last_transition_time == T0


def test_same_status_keeps_transition_time_but_takes_new_message() -> None:
    first = set_condition([], admitted(msg="needs 8; 4 free"), T0)
    second = set_condition(first, admitted(msg="needs 8; 6 free"), T1)
    assert second[0].last_transition_time == T0
    assert second[0].message == "needs 8; 6 free"


def test_status_change_moves_transition_time() -> None:
    first = set_condition([], admitted(), T0)
    second = set_condition(first, admitted("True", Reason.ADMITTED), T1)
    assert second[0].status == "True"
    assert second[0].reason == "Admitted"
    assert second[0].last_transition_time == T1


def test_duplicate_types_in_stored_status_collapse_to_one() -> None:
    stale = [admitted(), admitted()]
    assert len(set_condition(stale, admitted("True", Reason.ADMITTED), T1)) == 1


def test_manifest_round_trip() -> None:
    cond = set_condition([], admitted(msg="m"), T0)[0]
    raw = cond.to_manifest()
    assert raw["lastTransitionTime"] == T0
    assert raw["observedGeneration"] == 1
    assert Condition.from_manifest(raw) == cond


def test_from_manifest_rejects_bad_status() -> None:
    with pytest.raises(ValueError, match="'Admitted' has status 'Maybe'"):
        Condition.from_manifest({"type": "Admitted", "status": "Maybe"})


def test_find_and_is_true() -> None:
    conds = set_condition([], admitted("True", Reason.ADMITTED), T0)
    assert find_condition(conds, "Admitted") is conds[0]
    assert find_condition(conds, "Ready") is None
    assert is_condition_true(conds, "Admitted")
    assert not is_condition_true(conds, "Ready")


def test_reasons_are_camel_case_and_unique() -> None:
    values = [str(r) for r in Reason]
    assert len(values) == len(set(values))
    assert all(v[0].isupper() and v.isalnum() for v in values)
