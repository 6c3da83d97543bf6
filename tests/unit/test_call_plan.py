"""How the controller plans one call: which host sends what where, and expects whom."""

from __future__ import annotations

from dataclasses import dataclass

from pathways_wire import ir
from pathways_operator.controller.plans import INLINE_OUTPUT_BYTES, call_launches, plan_call
from pathways_operator.controller.programs import ProgramRecord
from pathways_operator.controller.slices import SliceRecord
from pathways_operator.core.placement import HostAssignment, Placement

F32 = ir.TensorSpec((4,), "float32")


@dataclass(frozen=True)
class FakeHost:
    name: str
    sidecar_address: str


def slice_record(vid: str, hosts: int) -> SliceRecord:
    placement = Placement(
        vid, "island-a", tuple(HostAssignment(i, f"m{i}", 4) for i in range(hosts))
    )
    return SliceRecord(
        key=vid,
        slice_id=f"{vid}-phys",
        decl=ir.SliceDecl(vid, vid, 4 * hosts),
        placement=placement,
        hosts=[FakeHost(f"{vid}/host-{i}", f"10.0.{vid}.{i}:1") for i in range(hosts)],
    )


def comp(index: int, vslice: str, *inputs: ir.ValueRef) -> ir.Computation:
    return ir.Computation(
        index=index, name=f"f{index}", slice=vslice, artifact=b"x", inputs=inputs,
        input_specs=tuple(F32 for _ in inputs), outputs=(F32,), mesh_shape=(4,), mesh_axes=("x",),
    )


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
    from pathways_wire import pathways_pb2 as pb

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
    assert {launch.call_id for per_host in launches.values() for launch in per_host} == {"c1"}
    assert [v.value.index for v in launches["a"][0].inputs] == [0]
    assert [v.value.index for v in launches["b"][0].inputs] == [1]
    # only a single-host slice sends outputs back inline
    assert launches["a"][0].inline_output_bytes == 0
    assert launches["b"][0].inline_output_bytes == INLINE_OUTPUT_BYTES

    # the plan is kept per program and gangs; the next call gets its own launches
    _, again = call_launches(prec, slices, "c2", [])
    assert again["a"][0].call_id == "c2" and not again["a"][0].inputs
    assert launches["a"][0].call_id == "c1"
