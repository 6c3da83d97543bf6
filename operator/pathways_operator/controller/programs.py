"""Programs the controller has loaded: a program's IR bound to live slices.

Loading checks every virtual slice against the live slice it is bound to and
names the program by its fingerprint and bindings, so loading the same program
onto the same slices again gives the same id. A record keeps what every call
of the program shares: the island scheduler's view of it and its launch plan
(`controller.plans`).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb
from pathways_operator.controller.errors import ControllerError
from pathways_operator.core.grant_order import grant_order
from pathways_operator.core.island_scheduler import ScheduledComputation

PlanKey = tuple[tuple[str, str, int], ...]
"""The gangs a plan was made for: (virtual slice, slice id, generation), sorted."""


@dataclass
class ProgramRecord:
    program_id: str
    program: ir.Program
    bindings: dict[str, str]
    schedule: list[ScheduledComputation] | None = None
    """The scheduler's view of a call, the same for every call."""
    launch_plan: tuple[PlanKey, pb.RunReply, dict[str, list[pb.Launch]]] | None = None
    """Launches for the gangs they were planned for."""
    input_readers: dict[int, frozenset[str]] | None = None
    """Program input index -> the virtual slices whose computations read it."""

    def readers_of_inputs(self) -> dict[int, frozenset[str]]:
        """Which virtual slices read each program input, made once: a call's inline
        inputs ride with the launches of those slices only."""
        if self.input_readers is None:
            readers: dict[int, set[str]] = defaultdict(set)
            for c in self.program.computations:
                for v in c.inputs:
                    if v.is_program_input:
                        readers[v.index].add(c.slice)
            self.input_readers = {index: frozenset(vids) for index, vids in readers.items()}
        return self.input_readers

    def scheduled(self) -> list[ScheduledComputation]:
        """The program's computations in the order they are granted (`core.grant_order`),
        made once."""
        if self.schedule is None:
            self.schedule = grant_order([
                ScheduledComputation(
                    node=c.index,
                    slice_id=self.bindings[c.slice],
                    deps=tuple(sorted({v.node for v in c.inputs if not v.is_program_input})),
                )
                for c in self.program.computations
            ])
        return self.schedule


def check_bindings(
    program: ir.Program, bindings: Mapping[str, str], live: Callable[[str], ir.SliceDecl | None]
) -> None:
    """Every virtual slice bound to a live slice of its size, every computation on a declared slice.

    `live` gives the declaration of a live slice by its id, or None."""
    for decl in program.slices:
        physical = bindings.get(decl.id)
        bound = live(physical) if physical else None
        if bound is None:
            raise ControllerError(
                "INVALID_ARGUMENT",
                f"program '{program.name}': virtual slice '{decl.name}' is bound to "
                f"{physical!r}, which is not a live slice; create it first",
            )
        if bound.devices != decl.devices:
            raise ControllerError(
                "INVALID_ARGUMENT",
                f"program '{program.name}': slice '{decl.name}' needs {decl.devices} "
                f"devices but is bound to '{bound.name}' with {bound.devices}",
            )
    for comp in program.computations:
        if comp.slice not in bindings:
            raise ControllerError(
                "INVALID_ARGUMENT",
                f"program '{program.name}': {comp.describe()} names an undeclared slice",
            )


def program_id(program: ir.Program, bindings: Mapping[str, str]) -> str:
    """The same program on the same slices gets the same id."""
    digest = hashlib.sha256(program.fingerprint.encode())
    for k in sorted(bindings):
        digest.update(f"{k}={bindings[k]};".encode())
    return f"{program.name}-{digest.hexdigest()[:16]}"


class Programs:
    """Loaded programs by id; the caller holds the controller's lock."""

    def __init__(self) -> None:
        self._programs: dict[str, ProgramRecord] = {}

    def load(
        self, program: ir.Program, bindings: dict[str, str], live: Callable[[str], ir.SliceDecl | None]
    ) -> str:
        check_bindings(program, bindings, live)
        pid = program_id(program, bindings)
        self._programs[pid] = ProgramRecord(pid, program, dict(bindings))
        return pid

    def get(self, program_id: str) -> ProgramRecord:
        prec = self._programs.get(program_id)
        if prec is None:
            raise ControllerError("NOT_FOUND", f"program {program_id} is not loaded")
        return prec
