"""Small typed builders for the controller's records: programs, computations, gangs of fake hosts."""

from __future__ import annotations

from dataclasses import dataclass

from pathways_wire import ir
from pathways_operator.controller.slices import SliceRecord
from pathways_operator.core.placement import HostAssignment, Placement

F32 = ir.TensorSpec((4,), "float32")
INPUT_0 = ir.ValueRef(ir.PROGRAM_INPUT, 0)


@dataclass(frozen=True)
class FakeHost:
    name: str
    sidecar_address: str


def slice_record(vid: str, hosts: int, token: str = "") -> SliceRecord:
    """Slice ``vid`` (id ``<vid>-phys``) with ``hosts`` hosts of 4 devices at ``10.0.<vid>.<i>:1``,
    host ``i`` on machine ``island-a-m<i>``."""
    placement = Placement(
        vid, "island-a", tuple(HostAssignment(i, f"island-a-m{i}", 4) for i in range(hosts))
    )
    return SliceRecord(
        key=vid,
        slice_id=f"{vid}-phys",
        decl=ir.SliceDecl(vid, vid, 4 * hosts),
        placement=placement,
        hosts=[FakeHost(f"{vid}/host-{i}", f"10.0.{vid}.{i}:1") for i in range(hosts)],
        token=token,
    )


def comp(index: int, vslice: str, *inputs: ir.ValueRef) -> ir.Computation:
    return ir.Computation(
        index=index, name=f"f{index}", slice=vslice, artifact=f"artifact-{index}".encode(), inputs=inputs,
        input_specs=tuple(F32 for _ in inputs), outputs=(F32,), mesh_shape=(4,), mesh_axes=("x",),
    )


def two_slice_program(name: str = "p") -> ir.Program:
    """%0 on slice a reads the input, %1 on slice b reads %0, %2 on a reads %1."""
    return ir.Program(
        name=name,
        inputs=(F32,),
        computations=(comp(0, "a", INPUT_0), comp(1, "b", ir.ValueRef(0, 0)), comp(2, "a", ir.ValueRef(1, 0))),
        outputs=(ir.ValueRef(2, 0), ir.ValueRef(1, 0), INPUT_0),
        slices=(ir.SliceDecl("a", "a", 8), ir.SliceDecl("b", "b", 4)),
    )
