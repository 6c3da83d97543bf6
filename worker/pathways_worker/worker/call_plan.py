"""What one program call means for one host, computed once at Launch.

A host receives its program once (HostProgram) and a Launch per call. What
depends only on the program — which computations are local, which values they
read, how many local readers each value has (so a value no one needs any more
is freed at once) — is laid out once per program (`layout_program`); each
Launch adds which values leave the host and for where, how many senders will
deliver each remote value, and which values the client will fetch. Pure: no
jax, no I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pathways_wire import pathways_pb2 as pb
from pathways_worker.value_ref import Ref, ref_of


@dataclass(frozen=True)
class LocalComputation:
    index: int
    name: str
    inputs: tuple[Ref, ...]
    num_outputs: int
    outputs: tuple[Ref, ...]
    distinct_inputs: frozenset[Ref]
    label: str
    """"program 'p' computation 'f' (index 3)", written once per program for its errors."""

    def where(self, call_id: str, host: str) -> str:
        """The computation in one call on one host, as its errors name it."""
        return f"{self.label} of call {call_id} on host {host}"


@dataclass(frozen=True)
class ProgramLayout:
    """The launch-independent part of every call of one program on this host."""

    program_id: str
    program_name: str
    slice: str
    computations: dict[int, LocalComputation]
    readers: dict[Ref, int]
    producer_slice: dict[int, str]


@dataclass(frozen=True)
class CallPlan:
    call_id: str
    program_id: str
    program_name: str
    slice: str
    computations: dict[int, LocalComputation]
    routes: dict[Ref, tuple[str, ...]]
    expects: dict[Ref, int]
    outputs: frozenset[Ref]
    readers: dict[Ref, int]          # local computations reading each value
    producer_slice: dict[int, str]   # node -> slice, for every computation

    def origin(self, ref: Ref) -> str:
        """Where a value comes from, for errors about a value that never arrived."""
        node = ref[0]
        if node < 0 and ref in self.expects:
            return f"the {self.expects[ref]} host(s) holding the object passed as this program input"
        if node < 0:
            return "the client (program input put to this host)"
        if node in self.computations:
            return f"this host (computation {node} of slice '{self.slice}')"
        senders = self.expects.get(ref)
        hosts = f"{senders} sender host(s)" if senders else "sender hosts unknown: no Expect"
        return f"slice '{self.producer_slice.get(node, '?')}' ({hosts})"


def layout_program(host_program: pb.HostProgram) -> ProgramLayout:
    program = host_program.program
    local: dict[int, LocalComputation] = {}
    for c in program.computations:
        if c.slice != host_program.slice:
            continue
        inputs = tuple(ref_of(v) for v in c.inputs)
        local[c.index] = LocalComputation(
            index=c.index,
            name=c.name,
            inputs=inputs,
            num_outputs=len(c.outputs),
            outputs=tuple((c.index, i) for i in range(len(c.outputs))),
            distinct_inputs=frozenset(inputs),
            label=f"program '{program.name}' computation '{c.name}' (index {c.index})",
        )
    readers: Counter[Ref] = Counter()
    for comp in local.values():
        readers.update(comp.distinct_inputs)
    return ProgramLayout(
        program_id=host_program.program_id,
        program_name=program.name,
        slice=host_program.slice,
        computations=local,
        readers=dict(readers),
        producer_slice={c.index: c.slice for c in program.computations},
    )


def plan_call(layout: ProgramLayout | pb.HostProgram, launch: pb.Launch) -> CallPlan:
    if isinstance(layout, pb.HostProgram):
        layout = layout_program(layout)
    return CallPlan(
        call_id=launch.call_id,
        program_id=launch.program_id,
        program_name=layout.program_name,
        slice=layout.slice,
        computations=layout.computations,
        routes={ref_of(r.value): tuple(r.destinations) for r in launch.routes},
        expects={ref_of(e.value): e.senders for e in launch.expects},
        outputs=frozenset(ref_of(v) for v in launch.outputs),
        readers=layout.readers,
        producer_slice=layout.producer_slice,
    )
