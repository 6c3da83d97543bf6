"""Admission policy: system PriorityClasses are refused unless allowed; refused gangs back off."""

from __future__ import annotations

import pytest

from pathways_operator.core.admission_policy import priority_class_refusal, refused_backoff


@pytest.mark.parametrize("name", ["system-node-critical", "system-cluster-critical", "system-anything"])
def test_system_priority_classes_are_refused_naming_the_field_and_the_fix(name: str) -> None:
    message = priority_class_refusal(name, allow_system=False)
    assert message is not None
    assert f"spec.priorityClassName {name!r} is reserved for the cluster's own components" in message
    assert "kubectl create priorityclass" in message
    assert "operator.allowSystemPriorityClasses=true" in message


@pytest.mark.parametrize("name", ["", "team-high", "systemic", "my-system-class"])
def test_ordinary_priority_classes_are_allowed(name: str) -> None:
    assert priority_class_refusal(name, allow_system=False) is None


def test_the_allow_flag_lets_system_classes_through() -> None:
    assert priority_class_refusal("system-node-critical", allow_system=True) is None


def test_refused_gangs_back_off_exponentially_up_to_two_minutes() -> None:
    assert [refused_backoff(n) for n in range(0, 8)] == [0.0, 5.0, 10.0, 20.0, 40.0, 80.0, 120.0, 120.0]
    assert refused_backoff(10_000) == 120.0
