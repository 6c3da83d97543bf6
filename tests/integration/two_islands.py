"""A program that moves a value from a slice on island-a to a slice on island-b.

``move(v) = consume(produce(v))`` with ``produce = 3v`` sharded over the left slice and
``consume = v + 1`` on the right one, so the value crosses islands through the sidecars
between them; ``move(x) == 3x + 1`` says it arrived whole.
"""

from __future__ import annotations

from typing import NamedTuple

from jax.sharding import PartitionSpec as P

import pathways as pw


class CrossIsland(NamedTuple):
    left: pw.VirtualSlice
    right: pw.VirtualSlice
    move: pw.ProgramFunction


def cross_island_move(left_devices: int, right_devices: int) -> CrossIsland:
    ds = pw.make_virtual_device_set()
    left = ds.add_slice(devices=left_devices, island="island-a")
    right = ds.add_slice(devices=right_devices, island="island-b")
    produce = pw.jit(lambda v: v * 3.0, slice=left, in_shardings=P("x"), out_shardings=P("x"))
    consume = pw.jit(lambda v: v + 1.0, slice=right, in_shardings=P("x"), out_shardings=P())

    @pw.program
    def move(v):  # type: ignore[no-untyped-def]
        return consume(produce(v))

    return CrossIsland(left, right, move)
