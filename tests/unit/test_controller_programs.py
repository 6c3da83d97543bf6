"""Loading a program: its virtual slices checked against live slices, and its id."""

from __future__ import annotations

import pytest

from pathways_wire import ir
from pathways_operator.controller.errors import ControllerError
from pathways_operator.controller.programs import Programs, ProgramRecord, check_bindings, program_id
from tests.unit.controller_builders import F32, INPUT_0, comp, two_slice_program

LIVE = {"a-1": ir.SliceDecl("a", "a", 8), "b-2": ir.SliceDecl("b", "b", 4)}


def test_a_program_bound_to_live_slices_of_its_sizes_loads_under_a_stable_id() -> None:
    programs = Programs()
    first = programs.load(two_slice_program(), {"a": "a-1", "b": "b-2"}, LIVE.get)
    again = programs.load(two_slice_program(), {"b": "b-2", "a": "a-1"}, LIVE.get)
    assert first == again and first.startswith("p-")
    assert programs.get(first).bindings == {"a": "a-1", "b": "b-2"}


def test_the_same_program_on_other_slices_gets_another_id() -> None:
    assert program_id(two_slice_program(), {"a": "a-1", "b": "b-2"}) != program_id(
        two_slice_program(), {"a": "a-3", "b": "b-2"}
    )


def test_a_virtual_slice_bound_to_no_live_slice_is_refused_naming_it() -> None:
    with pytest.raises(ControllerError) as err:
        check_bindings(two_slice_program(), {"a": "a-1", "b": "b-9"}, LIVE.get)
    assert err.value.code == "INVALID_ARGUMENT"
    assert "virtual slice 'b' is bound to 'b-9', which is not a live slice; create it first" in str(err.value)


def test_a_virtual_slice_bound_to_a_slice_of_another_size_is_refused_with_both_sizes() -> None:
    live = {"a-1": ir.SliceDecl("a", "big", 16), "b-2": LIVE["b-2"]}
    with pytest.raises(ControllerError) as err:
        check_bindings(two_slice_program(), {"a": "a-1", "b": "b-2"}, live.get)
    assert "slice 'a' needs 8 devices but is bound to 'big' with 16" in str(err.value)


def test_an_unknown_program_is_not_found() -> None:
    with pytest.raises(ControllerError) as err:
        Programs().get("p-0")
    assert err.value.code == "NOT_FOUND"


def test_the_schedule_binds_each_computation_to_its_slice_and_its_producers_once() -> None:
    prec = ProgramRecord("prog", two_slice_program(), {"a": "a-1", "b": "b-2"})
    schedule = prec.scheduled()
    assert [(c.node, c.slice_id, c.deps) for c in schedule] == [(0, "a-1", ()), (1, "b-2", (0,)), (2, "a-1", (1,))]
    assert prec.scheduled() is schedule


def test_each_program_input_is_read_by_the_slices_of_its_computations_found_once() -> None:
    program = ir.Program(
        name="p",
        inputs=(F32, F32),
        computations=(comp(0, "a", INPUT_0), comp(1, "b", ir.ValueRef(ir.PROGRAM_INPUT, 1), INPUT_0),
                      comp(2, "a", ir.ValueRef(1, 0))),
        outputs=(ir.ValueRef(2, 0),),
        slices=(ir.SliceDecl("a", "a", 8), ir.SliceDecl("b", "b", 4)),
    )
    prec = ProgramRecord("prog", program, {"a": "a-1", "b": "b-2"})
    readers = prec.readers_of_inputs()
    assert readers == {0: frozenset({"a", "b"}), 1: frozenset({"b"})}
    assert prec.readers_of_inputs() is readers
