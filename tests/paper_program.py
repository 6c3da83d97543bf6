"""The program from the Pathways paper (§4.1), with pmap → pw.pmap, tpu_devices → devices.

``f(v) = (b(a(v)), a(c(a(v))))`` with ``a = 2x``, ``b = x + 1``, ``c = x / 2``, each on a
2-device slice of its own: the unit tier traces it, the integration tier runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pathways as pw


@dataclass(frozen=True)
class PaperProgram:
    a: pw.SliceFunction
    b: pw.SliceFunction
    c: pw.SliceFunction
    f: pw.ProgramFunction


def paper_program(get_devices: Callable[[int], Sequence[Any]]) -> PaperProgram:
    """The paper's three functions and its program, over devices from ``get_devices(n)``."""
    a = pw.pmap(lambda x: x * 2.0, devices=get_devices(2))
    b = pw.pmap(lambda x: x + 1.0, devices=get_devices(2))
    c = pw.pmap(lambda x: x / 2.0, devices=get_devices(2))

    @pw.program
    def f(v):  # type: ignore[no-untyped-def]
        x = a(v)
        y = b(x)
        z = a(c(x))
        return (y, z)

    return PaperProgram(a, b, c, f)
