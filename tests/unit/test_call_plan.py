"""How the controller plans one call: which host sends what where, and expects whom."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb
from pathways_wire.slice_token import client_token, route_token
from pathways_operator.controller.plans import (
    INLINE_OUTPUT_BYTES, call_launches, host_program, place_object, plan_call,
)
from pathways_operator.controller.programs import ProgramRecord
from tests.unit.controller_builders import F32, FakeHost, comp, slice_record, two_slice_program


def test_cross_slice_value_is_routed_to_every_consumer_host_and_expected_from_every_producer() -> None:
    inp = ir.ValueRef(ir.PROGRAM_INPUT, 0)
    program = ir.Program(
        name="p",
        inputs=(F32,),
        computations=(comp(0, "a", inp), comp(1, "b", ir.ValueRef(0, 0)), comp(2, "a", ir.ValueRef(1, 0))),
        outputs=(ir.ValueRef(2, 0), ir.ValueRef(1, 0), inp),
        slices=(ir.SliceDecl("a", "a", 8), ir.SliceDecl("b", "b", 4)),
    )
    slices = {"a": slice_record("a", 2), "b": slice_record("b", 1)}
    reply, launches = plan_call(program, "c1", "prog", slices)

    a_hosts = [h.sidecar_address for h in slices["a"].hosts]
    b_hosts = [h.sidecar_address for h in slices["b"].hosts]
    # the program input goes whole to both hosts of slice a
    assert list(reply.inputs[0].hosts) == a_hosts
    # outputs: %2 lives on a (2 hosts), %1 on b, the input is returned by the client
    assert list(reply.outputs[0].hosts) == a_hosts
    assert list(reply.outputs[1].hosts) == b_hosts
    assert list(reply.outputs[2].hosts) == []

    (a_launch, a_launch_1), (b_launch,) = launches["a"], launches["b"]
    assert a_launch == a_launch_1, "every host of a slice gets the same launch"
    assert [(r.value.node, list(r.destinations)) for r in a_launch.routes] == [(0, b_hosts)]
    assert [(r.value.node, list(r.destinations)) for r in b_launch.routes] == [(1, a_hosts)]
    # b expects %0 from both hosts of a; a expects %1 from b's single host
    assert [(e.value.node, e.senders) for e in b_launch.expects] == [(0, 2)]
    assert [(e.value.node, e.senders) for e in a_launch.expects] == [(1, 1)]
    assert [o.node for o in a_launch.outputs] == [2]
    assert [o.node for o in b_launch.outputs] == [1]


def test_each_input_lists_the_slices_reading_it_with_their_hosts_in_host_order() -> None:
    inp0, inp1 = ir.ValueRef(ir.PROGRAM_INPUT, 0), ir.ValueRef(ir.PROGRAM_INPUT, 1)
    program = ir.Program(
        name="p",
        inputs=(F32, F32),
        computations=(comp(0, "a", inp0, inp1), comp(1, "b", inp0), comp(2, "a", inp0)),
        outputs=(ir.ValueRef(0, 0), ir.ValueRef(1, 0), ir.ValueRef(2, 0)),
        slices=(ir.SliceDecl("a", "a", 8), ir.SliceDecl("b", "b", 12)),
    )
    slices = {"a": slice_record("a", 2), "b": slice_record("b", 3)}
    reply, _ = plan_call(program, "c1", "prog", slices)

    a_hosts = [h.sidecar_address for h in slices["a"].hosts]
    b_hosts = [h.sidecar_address for h in slices["b"].hosts]
    assert [(r.slice, list(r.hosts)) for r in reply.inputs[0].readers] == [("a", a_hosts), ("b", b_hosts)]
    assert [(r.slice, list(r.hosts)) for r in reply.inputs[1].readers] == [("a", a_hosts)]
    assert list(reply.inputs[0].hosts) == a_hosts + b_hosts


def test_values_consumed_on_their_own_slice_are_not_routed() -> None:
    inp = ir.ValueRef(ir.PROGRAM_INPUT, 0)
    program = ir.Program(
        name="chain",
        inputs=(F32,),
        computations=(comp(0, "a", inp), comp(1, "a", ir.ValueRef(0, 0))),
        outputs=(ir.ValueRef(1, 0),),
        slices=(ir.SliceDecl("a", "a", 4),),
    )
    _, launches = plan_call(program, "c", "p", {"a": slice_record("a", 1)})
    (launch,) = launches["a"]
    assert not launch.routes and not launch.expects
    assert [o.node for o in launch.outputs] == [1]


def test_small_inputs_ride_with_the_launches_of_the_slices_that_read_them() -> None:
    inp0, inp1 = ir.ValueRef(ir.PROGRAM_INPUT, 0), ir.ValueRef(ir.PROGRAM_INPUT, 1)
    program = ir.Program(
        name="p",
        inputs=(F32, F32),
        computations=(comp(0, "a", inp0), comp(1, "b", ir.ValueRef(0, 0), inp1)),
        outputs=(ir.ValueRef(1, 0),),
        slices=(ir.SliceDecl("a", "a", 8), ir.SliceDecl("b", "b", 4)),
    )
    prec = ProgramRecord("prog", program, {"a": "a-phys", "b": "b-phys"})
    slices = {"a": slice_record("a", 2), "b": slice_record("b", 1)}
    small = [
        pb.InlineValue(value=inp.to_proto(), spec=F32.to_proto(), data=bytes(16))
        for inp in (inp0, inp1)
    ]
    reply, launches = call_launches(prec, slices, "c1", small)
    assert [list(i.hosts) for i in reply.inputs] == [[], []]  # nothing left to Put
    assert [list(i.readers) for i in reply.inputs] == [[], []]
    assert {launch.call_id for per_host in launches.values() for launch in per_host} == {"c1"}
    assert [v.value.index for v in launches["a"][0].inputs] == [0]
    assert [v.value.index for v in launches["b"][0].inputs] == [1]
    # every slice sends small outputs back inline; on a multi-host one, host 0 those it holds whole
    assert launches["a"][0].inline_output_bytes == INLINE_OUTPUT_BYTES
    assert launches["b"][0].inline_output_bytes == INLINE_OUTPUT_BYTES

    # the plan is kept per program and gangs; the next call gets its own launches
    _, again = call_launches(prec, slices, "c2", [])
    assert again["a"][0].call_id == "c2" and not again["a"][0].inputs
    assert launches["a"][0].call_id == "c1"


def test_each_host_program_carries_only_its_own_slices_artifacts() -> None:
    msg = host_program(two_slice_program(), "prog", "b")
    assert (msg.program_id, msg.slice) == ("prog", "b")
    assert [(c.index, c.artifact) for c in msg.program.computations] == [(0, b""), (1, b"artifact-1"), (2, b"")]


def test_routes_carry_each_hosts_route_token_and_the_reply_its_client_token_never_its_slice_token() -> None:
    slices = {"a": slice_record("a", 2, token="tok-a"), "b": slice_record("b", 1, token="tok-b")}
    reply, launches = plan_call(two_slice_program(), "c1", "prog", slices)
    (a_route,) = launches["a"][0].routes
    (b_route,) = launches["b"][0].routes
    a, b = client_token("tok-a"), client_token("tok-b")
    assert list(a_route.destination_tokens) == [route_token("tok-b")]
    assert list(b_route.destination_tokens) == [route_token("tok-a")] * 2
    assert dict(reply.host_tokens) == {"10.0.a.0:1": a, "10.0.a.1:1": a, "10.0.b.0:1": b}
    assert not {"tok-a", "tok-b"} & {*reply.host_tokens.values(), *a_route.destination_tokens}


def test_a_new_gang_generation_gets_a_new_plan() -> None:
    prec = ProgramRecord("prog", two_slice_program(), {"a": "a-phys", "b": "b-phys"})
    slices = {"a": slice_record("a", 2), "b": slice_record("b", 1)}
    call_launches(prec, slices, "c1", [])
    first = prec.launch_plan
    slices["b"].hosts = [FakeHost("b/host-0", "10.0.b.9:1")]
    slices["b"].generation += 1
    _, launches = call_launches(prec, slices, "c2", [])
    assert prec.launch_plan is not first
    assert [list(r.destinations) for r in launches["a"][0].routes] == [["10.0.b.9:1"]]


def test_an_object_input_is_used_in_place_on_its_slice_and_sent_host_to_host_to_the_others() -> None:
    inp = ir.ValueRef(ir.PROGRAM_INPUT, 0)
    program = ir.Program(
        name="p", inputs=(F32,),
        computations=(comp(0, "a", inp), comp(1, "b", inp), comp(2, "c", inp)),
        outputs=(ir.ValueRef(0, 0),),
        slices=(ir.SliceDecl("a", "a", 4), ir.SliceDecl("b", "b", 8), ir.SliceDecl("c", "c", 4)),
    )
    holder = slice_record("h", 2, token="tok-h")
    slices = {"a": holder, "b": slice_record("b", 2, token="tok-b"), "c": slice_record("c", 1, token="tok-c")}
    obj = pb.ObjectRef(call_id="made", value=pb.ValueRef(node=3, index=1))

    placed = place_object(program, "c1", 0, obj, holder, slices)

    assert list(placed.aliases) == ["a"] and placed.aliases["a"].object == obj
    assert {vid: e.senders for vid, e in placed.expects.items()} == {"b": 2, "c": 2}, "from each holder host"
    forward = placed.forward
    assert forward is not None
    assert (forward.call_id, forward.input.node, forward.input.index, forward.object) == ("c1", -1, 0, obj)
    assert list(forward.destinations) == ["10.0.b.0:1", "10.0.b.1:1", "10.0.c.0:1"]
    assert list(forward.destination_tokens) == [route_token("tok-b")] * 2 + [route_token("tok-c")]
    assert forward.spec == F32.to_proto()


def test_an_object_read_only_on_its_own_slice_leaves_nothing_to_send() -> None:
    holder = slice_record("a", 1)
    slices = {"a": holder, "b": slice_record("b", 1)}
    placed = place_object(two_slice_program(), "c1", 0, pb.ObjectRef(call_id="made"), holder, slices)
    assert list(placed.aliases) == ["a"] and placed.expects == {} and placed.forward is None


ROWS = ir.TensorSpec((8, 4), "float32")


def sharded_comp(index: int, vslice: str, axes: tuple[tuple[str, ...], ...], *inputs: ir.ValueRef) -> ir.Computation:
    """A computation over a mesh of 8 devices on axis "x" whose inputs are split as `axes`."""
    return ir.Computation(
        index=index, name=f"f{index}", slice=vslice, artifact=f"artifact-{index}".encode(), inputs=inputs,
        input_specs=tuple(ROWS for _ in inputs), outputs=(ROWS,), mesh_shape=(8,), mesh_axes=("x",),
        input_axes=tuple(axes for _ in inputs),
    )


def routed_program(axes: tuple[tuple[str, ...], ...]) -> ir.Program:
    """%0 on slice a makes an 8x4 value that %1 on slice b reads split as `axes`."""
    inp = ir.ValueRef(ir.PROGRAM_INPUT, 0)
    return ir.Program(
        name="p", inputs=(ROWS,),
        computations=(sharded_comp(0, "a", (), inp), sharded_comp(1, "b", axes, ir.ValueRef(0, 0))),
        outputs=(ir.ValueRef(1, 0),),
        slices=(ir.SliceDecl("a", "a", 8), ir.SliceDecl("b", "b", 8)),
    )


def regions(blocks: Iterable[pb.Region]) -> list[tuple[list[int], list[int]]]:
    return [(list(b.start), list(b.stop)) for b in blocks]


def test_a_value_routed_to_hosts_that_split_it_by_rows_names_each_hosts_rows() -> None:
    slices = {"a": slice_record("a", 2), "b": slice_record("b", 2)}
    _, launches = plan_call(routed_program((("x",),)), "c1", "prog", slices)
    (route,) = launches["a"][0].routes
    assert list(route.destinations) == ["10.0.b.0:1", "10.0.b.1:1"]
    assert regions(route.destination_blocks) == [([0, 0], [4, 4]), ([4, 0], [8, 4])]
    assert [(e.value.node, e.senders) for e in launches["b"][0].expects] == [(0, 2)], "every producer host counts"


def test_a_value_its_readers_replicate_or_do_not_describe_is_routed_whole() -> None:
    slices = {"a": slice_record("a", 2), "b": slice_record("b", 2)}
    for axes in ((), ((), ())):
        _, launches = plan_call(routed_program(axes), "c1", "prog", slices)
        assert list(launches["a"][0].routes[0].destination_blocks) == [], axes
    unrecorded = routed_program((("x",),))
    unrecorded = ir.Program(
        unrecorded.name, unrecorded.inputs,
        (unrecorded.computations[0], dataclasses.replace(unrecorded.computations[1], input_axes=())),
        unrecorded.outputs, unrecorded.slices,
    )
    _, launches = plan_call(unrecorded, "c1", "prog", slices)
    assert list(launches["a"][0].routes[0].destination_blocks) == []


def test_the_input_axes_survive_the_program_proto() -> None:
    program = routed_program((("x",), ()))
    again = ir.Program.from_proto(program.to_proto())
    assert [c.input_axes for c in again.computations] == [((),), ((("x",), ()),)]
    assert again.fingerprint == program.fingerprint


def test_an_object_forwarded_to_a_slice_splitting_it_by_rows_names_each_hosts_rows() -> None:
    inp = ir.ValueRef(ir.PROGRAM_INPUT, 0)
    program = ir.Program(
        name="p", inputs=(ROWS,),
        computations=(sharded_comp(0, "b", (("x",),), inp), sharded_comp(1, "c", (("x",),), inp)),
        outputs=(ir.ValueRef(0, 0),),
        slices=(ir.SliceDecl("b", "b", 8), ir.SliceDecl("c", "c", 4)),
    )
    holder = slice_record("h", 2)
    slices = {"b": slice_record("b", 2), "c": slice_record("c", 1)}
    placed = place_object(program, "c1", 0, pb.ObjectRef(call_id="made"), holder, slices)
    assert placed.forward is not None
    assert list(placed.forward.destinations) == ["10.0.b.0:1", "10.0.b.1:1", "10.0.c.0:1"]
    assert regions(placed.forward.destination_blocks) == [([0, 0], [4, 4]), ([4, 0], [8, 4]), ([], [])]
