"""Names derived from users' names fit Kubernetes' limits, or the object is refused naming the field."""

from __future__ import annotations

import re

import pytest

from pathways_operator.core.object_names import (
    LABEL_VALUE_MAX,
    inline_slice_name,
    program_name_problem,
    slice_name_problem,
)
from pathways_operator.k8s.gang_pods import pod_name, token_secret_name

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
OBJECT_NAME_MAX = 253
MAX_HOSTS = 4096


def test_slice_name_up_to_a_label_value_is_served() -> None:
    assert slice_name_problem("s" * LABEL_VALUE_MAX) is None


def test_longer_slice_name_is_refused_naming_metadata_name_and_the_limit() -> None:
    problem = slice_name_problem("s" * 64)
    assert problem is not None
    assert "metadata.name" in problem and "64 characters" in problem and "at most 63" in problem
    assert "pathways.dev/slice" in problem and "shorter name" in problem


def test_program_name_up_to_a_label_value_with_refs_only_is_served() -> None:
    assert program_name_problem("p" * 63, []) is None


def test_longer_program_name_is_refused_naming_metadata_name_and_the_limit() -> None:
    problem = program_name_problem("p" * 64, [])
    assert problem is not None
    assert "metadata.name" in problem and "64 characters" in problem and "at most 63" in problem
    assert "pathways.dev/program" in problem


def test_template_slice_whose_derived_name_is_too_long_is_named_by_its_index() -> None:
    program = "p" * 50
    assert program_name_problem(program, [(0, "s" * 12)]) is None  # 50 + 1 + 12 = 63
    problem = program_name_problem(program, [(0, "short"), (2, "s" * 13)])
    assert problem is not None
    assert "metadata.name and spec.slices[2].name" in problem
    assert repr(inline_slice_name(program, "s" * 13)) in problem and "64 characters" in problem


@pytest.mark.parametrize("index", [0, 7, MAX_HOSTS - 1])
def test_names_derived_from_a_slice_name_at_the_limit_are_valid_object_names(index: int) -> None:
    longest = "s" * LABEL_VALUE_MAX
    for derived in (pod_name(longest, index), token_secret_name(longest), f"{'p' * LABEL_VALUE_MAX}-results"):
        assert len(derived) <= OBJECT_NAME_MAX and DNS_SUBDOMAIN.match(derived), derived
