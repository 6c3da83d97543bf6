"""The dataflow IR: what `@pw.program` traces a Python function into.

A `Program` is a DAG of `Computation`s in topological order. Each computation is
one compiled SPMD function (a `jax.export` artifact: serialized StableHLO) that
runs on every host of one virtual slice; its inputs are outputs of earlier
computations or program inputs. The IR names slices only virtually: the
controller binds them to physical gangs of hosts when the program is loaded,
exactly as the Pathways resource manager maps virtual devices to physical ones.

The IR is plain frozen data. It converts to and from the wire protocol here and
nowhere else, so the rest of the code never touches protobuf objects for it.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

import numpy as np

from pathways_wire import pathways_pb2 as pb
from pathways_wire.host_blocks import AxisSpec

PROGRAM_INPUT = -1
"""`ValueRef.node` of a program input."""


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: object) -> str:
    return np.dtype(dtype).name  # type: ignore[call-overload,no-any-return]


@functools.lru_cache(maxsize=64)
def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a value. Made for every argument of every call, so the dtype's
    name and a spec's byte count are looked up once, not worked out by numpy each time."""

    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, shape: tuple[int, ...], dtype: object) -> TensorSpec:
        return cls(tuple(int(d) for d in shape), _dtype_name(dtype))

    @functools.cached_property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"

    def to_proto(self) -> pb.TensorSpec:
        return pb.TensorSpec(shape=list(self.shape), dtype=self.dtype)

    @classmethod
    def from_proto(cls, msg: pb.TensorSpec) -> TensorSpec:
        return cls(tuple(int(d) for d in msg.shape), msg.dtype)


@dataclass(frozen=True, order=True)
class ValueRef:
    """Output `index` of computation `node`; node == PROGRAM_INPUT for inputs."""

    node: int
    index: int

    @property
    def is_program_input(self) -> bool:
        return self.node == PROGRAM_INPUT

    def __str__(self) -> str:
        if self.is_program_input:
            return f"input[{self.index}]"
        return f"%{self.node}.{self.index}"

    def to_proto(self) -> pb.ValueRef:
        return pb.ValueRef(node=self.node, index=self.index)

    @classmethod
    def from_proto(cls, msg: pb.ValueRef) -> ValueRef:
        return cls(msg.node, msg.index)


@dataclass(frozen=True)
class SliceDecl:
    """A virtual slice as the program sees it: an id and a device count."""

    id: str
    name: str
    devices: int
    devices_per_host: int = 0
    island: str = ""

    def to_proto(self) -> pb.VirtualSliceSpec:
        return pb.VirtualSliceSpec(
            id=self.id,
            name=self.name,
            devices=self.devices,
            devices_per_host=self.devices_per_host,
            island=self.island,
        )

    @classmethod
    def from_proto(cls, msg: pb.VirtualSliceSpec) -> SliceDecl:
        return cls(msg.id, msg.name, msg.devices, msg.devices_per_host, msg.island)


@dataclass(frozen=True)
class Computation:
    index: int
    name: str
    slice: str
    artifact: bytes
    inputs: tuple[ValueRef, ...]
    input_specs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    mesh_shape: tuple[int, ...]
    mesh_axes: tuple[str, ...]
    input_axes: tuple[AxisSpec, ...] = ()
    """Per input, the mesh axes each dimension is split over, as the artifact declares
    (read at trace time, so that planning can cut routed values by the hosts reading
    them without jax); empty where not recorded: every reading host gets values whole."""

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.artifact).hexdigest()

    def axes_of(self, position: int) -> AxisSpec | None:
        """Input `position`'s sharding, or None where it was not recorded."""
        return self.input_axes[position] if position < len(self.input_axes) else None

    def describe(self) -> str:
        return f"computation {self.index} '{self.name}' on slice {self.slice}"

    def to_proto(self, with_artifact: bool = True) -> pb.Computation:
        return pb.Computation(
            index=self.index,
            name=self.name,
            slice=self.slice,
            artifact=self.artifact if with_artifact else b"",
            fingerprint=self.fingerprint,
            inputs=[v.to_proto() for v in self.inputs],
            outputs=[s.to_proto() for s in self.outputs],
            mesh_shape=list(self.mesh_shape),
            mesh_axes=list(self.mesh_axes),
            input_shardings=[
                pb.InputSharding(dims=[pb.MeshAxes(axes=list(axes)) for axes in spec])
                for spec in self.input_axes
            ],
        )


@dataclass(frozen=True)
class Program:
    name: str
    inputs: tuple[TensorSpec, ...]
    computations: tuple[Computation, ...]
    outputs: tuple[ValueRef, ...]
    slices: tuple[SliceDecl, ...]

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.name.encode())
        for spec in self.inputs:
            digest.update(str(spec).encode())
        for comp in self.computations:
            digest.update(f"{comp.index}:{comp.slice}:{comp.fingerprint}:{comp.inputs}".encode())
        digest.update(repr(self.outputs).encode())
        for decl in self.slices:
            digest.update(repr(decl).encode())
        return digest.hexdigest()

    def spec_of(self, ref: ValueRef) -> TensorSpec:
        if ref.is_program_input:
            return self.inputs[ref.index]
        return self.computations[ref.node].outputs[ref.index]

    def to_proto(self) -> pb.Program:
        return pb.Program(
            name=self.name,
            fingerprint=self.fingerprint,
            inputs=[s.to_proto() for s in self.inputs],
            computations=[c.to_proto() for c in self.computations],
            outputs=[v.to_proto() for v in self.outputs],
            slices=[s.to_proto() for s in self.slices],
        )

    @classmethod
    def from_proto(cls, msg: pb.Program) -> Program:
        comps = []
        for c in msg.computations:
            inputs = tuple(ValueRef.from_proto(v) for v in c.inputs)
            comps.append(
                Computation(
                    index=c.index,
                    name=c.name,
                    slice=c.slice,
                    artifact=c.artifact,
                    inputs=inputs,
                    input_specs=(),
                    outputs=tuple(TensorSpec.from_proto(s) for s in c.outputs),
                    mesh_shape=tuple(c.mesh_shape),
                    mesh_axes=tuple(c.mesh_axes),
                    input_axes=tuple(
                        tuple(tuple(d.axes) for d in sharding.dims) for sharding in c.input_shardings
                    ),
                )
            )
        program = cls(
            name=msg.name,
            inputs=tuple(TensorSpec.from_proto(s) for s in msg.inputs),
            computations=tuple(comps),
            outputs=tuple(ValueRef.from_proto(v) for v in msg.outputs),
            slices=tuple(SliceDecl.from_proto(s) for s in msg.slices),
        )
        # input specs are derivable from the graph; fill them for consumers
        filled = tuple(
            Computation(
                index=c.index,
                name=c.name,
                slice=c.slice,
                artifact=c.artifact,
                inputs=c.inputs,
                input_specs=tuple(program.spec_of(v) for v in c.inputs),
                outputs=c.outputs,
                mesh_shape=c.mesh_shape,
                mesh_axes=c.mesh_axes,
                input_axes=c.input_axes,
            )
            for c in comps
        )
        return cls(program.name, program.inputs, filled, program.outputs, program.slices)

    def consumers(self) -> dict[ValueRef, list[int]]:
        """Which computations read each value."""
        out: dict[ValueRef, list[int]] = {}
        for comp in self.computations:
            for ref in comp.inputs:
                out.setdefault(ref, []).append(comp.index)
        return out
