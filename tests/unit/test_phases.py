"""The phase tables: legal moves pass, illegal ones name the object and both phases."""

from __future__ import annotations

import pytest

from pathways_operator.core.phases import (
    PROGRAM_TRANSITIONS,
    SLICE_TRANSITIONS,
    InvalidTransition,
    ProgramPhase,
    SlicePhase,
    check_transition,
    is_terminal,
)


def test_every_phase_has_a_row() -> None:
    assert set(SLICE_TRANSITIONS) == set(SlicePhase)
    assert set(PROGRAM_TRANSITIONS) == set(ProgramPhase)


def test_phase_values_are_the_api_strings() -> None:
    assert [str(p) for p in SlicePhase] == [
        "Pending", "Launching", "Ready", "Recovering", "Failed", "Suspended"
    ]
    assert [str(p) for p in ProgramPhase] == [
        "Pending", "Running", "Succeeded", "Failed", "Suspended"
    ]
    assert SlicePhase("Ready") is SlicePhase.READY


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (SlicePhase.PENDING, SlicePhase.LAUNCHING),
        (SlicePhase.LAUNCHING, SlicePhase.READY),
        (SlicePhase.READY, SlicePhase.RECOVERING),
        (SlicePhase.RECOVERING, SlicePhase.LAUNCHING),
        (SlicePhase.RECOVERING, SlicePhase.FAILED),
        (SlicePhase.READY, SlicePhase.SUSPENDED),
        (SlicePhase.SUSPENDED, SlicePhase.PENDING),
        (SlicePhase.READY, SlicePhase.READY),
    ],
)
def test_slice_life_cycle_moves_are_allowed(old: SlicePhase, new: SlicePhase) -> None:
    assert check_transition("train", old, new) is new


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (ProgramPhase.PENDING, ProgramPhase.RUNNING),
        (ProgramPhase.RUNNING, ProgramPhase.SUCCEEDED),
        (ProgramPhase.RUNNING, ProgramPhase.PENDING),
        (ProgramPhase.RUNNING, ProgramPhase.SUSPENDED),
        (ProgramPhase.SUSPENDED, ProgramPhase.PENDING),
        (ProgramPhase.PENDING, ProgramPhase.FAILED),
    ],
)
def test_program_life_cycle_moves_are_allowed(old: ProgramPhase, new: ProgramPhase) -> None:
    assert check_transition("job", old, new) is new


def test_illegal_slice_move_names_object_and_phases() -> None:
    with pytest.raises(InvalidTransition) as caught:
        check_transition("train", SlicePhase.FAILED, SlicePhase.READY)
    err = caught.value
    assert (err.kind, err.name, err.old, err.new) == ("VirtualSlice", "train", "Failed", "Ready")
    assert "VirtualSlice 'train'" in str(err)
    assert "from phase Failed to Ready" in str(err)
    assert "nothing (terminal)" in str(err)


def test_illegal_program_move_lists_what_is_allowed() -> None:
    with pytest.raises(InvalidTransition, match="PathwaysProgram 'job'.*Pending to Succeeded") as caught:
        check_transition("job", ProgramPhase.PENDING, ProgramPhase.SUCCEEDED)
    assert "Failed, Running, Suspended" in str(caught.value)


def test_pending_slice_cannot_skip_launching() -> None:
    with pytest.raises(InvalidTransition):
        check_transition("train", SlicePhase.PENDING, SlicePhase.READY)


def test_mixing_kinds_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="'x'"):
        check_transition("x", SlicePhase.PENDING, ProgramPhase.RUNNING)  # type: ignore[call-overload]


def test_terminal_phases() -> None:
    assert {p for p in SlicePhase if is_terminal(p)} == {SlicePhase.FAILED}
    assert {p for p in ProgramPhase if is_terminal(p)} == {ProgramPhase.SUCCEEDED, ProgramPhase.FAILED}
