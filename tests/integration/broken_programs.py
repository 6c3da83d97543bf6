"""Programs that no host can run: a traced program whose first computation's serialized
artifact is corrupted, so the controller accepts the call and its host fails it."""

from __future__ import annotations

import dataclasses

from pathways_wire import ir


def first_computation_corrupt(program: ir.Program) -> tuple[ir.Program, ir.Computation]:
    """`program` with its first computation's artifact overwritten past its 64th byte, and
    that computation as it was (its name is what the host's error names)."""
    first = program.computations[0]
    corrupt = dataclasses.replace(first, artifact=first.artifact[:64] + b"\x00" * 64)
    return dataclasses.replace(program, computations=(corrupt,) + program.computations[1:]), first
