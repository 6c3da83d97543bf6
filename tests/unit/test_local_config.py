"""The embedded cluster's islands and devices per host: checked before any process starts."""

from __future__ import annotations

import pytest

from pathways_wire.island_config import (
    DEFAULT_DEVICES_PER_HOST,
    DEFAULT_ISLANDS,
    check_islands,
    local_config,
    parse_islands,
)


def test_defaults_without_arguments_or_environment() -> None:
    assert local_config(None, None, {}) == (DEFAULT_ISLANDS, DEFAULT_DEVICES_PER_HOST)


def test_environment_islands_and_devices_per_host_are_read() -> None:
    env = {"PATHWAYS_LOCAL_ISLANDS": "a:8, b:16", "PATHWAYS_DEVICES_PER_HOST": "8"}
    assert local_config(None, None, env) == ({"a": 8, "b": 16}, 8)


def test_arguments_win_over_the_environment() -> None:
    env = {"PATHWAYS_LOCAL_ISLANDS": "a:8", "PATHWAYS_DEVICES_PER_HOST": "8"}
    assert local_config({"x": 4}, 2, env) == ({"x": 4}, 2)


def test_zero_devices_per_host_from_the_environment_is_named() -> None:
    with pytest.raises(ValueError) as info:
        local_config(None, None, {"PATHWAYS_DEVICES_PER_HOST": "0"})
    assert "PATHWAYS_DEVICES_PER_HOST='0'" in str(info.value)
    assert "at least 1" in str(info.value)


@pytest.mark.parametrize("value", [0, -4, "four", 2.5, True])
def test_bad_devices_per_host_argument_is_named(value: object) -> None:
    with pytest.raises(ValueError) as info:
        local_config({"a": 8}, value, {})
    assert f"devices_per_host=...)={value!r}" in str(info.value)


def test_island_name_with_a_separator_is_refused_with_the_rule() -> None:
    with pytest.raises(ValueError) as info:
        local_config({"a,b:3": 8}, 4, {})
    text = str(info.value)
    assert "'a,b:3'" in text and "letters, digits" in text


@pytest.mark.parametrize("name", ["", "-a", "a b", "a:b", "x" * 64, "ünï"])
def test_island_names_that_are_not_label_values_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="is not allowed"):
        check_islands({name: 4}, 4, "islands")


def test_island_given_twice_in_the_environment_names_both_sizes() -> None:
    with pytest.raises(ValueError) as info:
        local_config(None, None, {"PATHWAYS_LOCAL_ISLANDS": "a:4,a:8"})
    text = str(info.value)
    assert "'a' is given twice (4 and 8 devices)" in text
    assert "PATHWAYS_LOCAL_ISLANDS='a:4,a:8'" in text


def test_empty_islands_mapping_is_refused_not_replaced_by_defaults() -> None:
    with pytest.raises(ValueError) as info:
        local_config({}, None, {})
    text = str(info.value)
    assert "islands={}" in text and "names no island" in text


@pytest.mark.parametrize("count", [-4, 0, "8", 4.0, None])
def test_island_sizes_that_are_not_positive_whole_numbers_are_named(count: object) -> None:
    with pytest.raises(ValueError) as info:
        local_config({"a": count}, 4, {})
    text = str(info.value)
    assert f"island 'a' has {count!r} devices" in text
    assert "Node" not in text  # the embedded runtime has no Kubernetes Nodes to label


def test_negative_size_in_the_environment_is_named() -> None:
    with pytest.raises(ValueError, match=r"island 'a' has -8 devices"):
        local_config(None, None, {"PATHWAYS_LOCAL_ISLANDS": "a:-8"})


def test_size_not_a_multiple_of_devices_per_host_says_both() -> None:
    with pytest.raises(ValueError) as info:
        local_config({"a": 6}, 4, {})
    assert "6 devices, not a multiple of 4 devices per host" in str(info.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a:4,", "entry 2 is empty"),
        ("a", "has no ':DEVICES'"),
        ("a:many", "has 'many' devices"),
        ("a,b:3", "entry 'a' has no ':DEVICES'"),
    ],
)
def test_malformed_environment_entries_are_named(text: str, words: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_islands(text, "PATHWAYS_LOCAL_ISLANDS")
    assert words in str(info.value)
    assert f"PATHWAYS_LOCAL_ISLANDS={text!r}" in str(info.value)


def test_connect_refuses_a_bad_island_before_starting_anything() -> None:
    import pathways as pw

    with pytest.raises(ValueError, match=r"island name 'a,b:3' is not allowed"):
        pw.connect(islands={"a,b:3": 8}, devices_per_host=4)
    with pytest.raises(ValueError, match=r"devices_per_host=...\)=0"):
        pw.connect(islands={"a": 8}, devices_per_host=0)
