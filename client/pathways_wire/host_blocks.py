"""Which block of a client's input each host of a multi-host slice reads, and the block it holds.

A computation lays its slice's devices out as its mesh in global order
(`np.array(devices).reshape(mesh_shape)`), so flat mesh position k is device k of the
slice and belongs to host k // devices_per_host. Its input sharding (a PartitionSpec,
here as one tuple of mesh axis names per dimension) cuts the value into one block per
device; a host reads the union of its devices' blocks. The client sends each host only
that union (`host_needs`) when it is one rectangular block, and the whole value where it
is not (a host of a sharding that interleaves hosts along a dimension): correct, just not
minimal. An input several computations or slices read gets, per host, the union over
all of them, under the same rule.

A host then holds a `HeldBlock`: the block's data and where it sits in the value; its
computations read the global value through `local_index`, which refuses indices
outside the block. Pure: no jax, no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Shape = tuple[int, ...]
AxisSpec = tuple[tuple[str, ...], ...]
"""A PartitionSpec as data: per dimension of the value, the mesh axes it is split over
(major first); an empty tuple leaves the dimension whole. Dimensions past its end are whole."""


@dataclass(frozen=True)
class Block:
    """The elements [start, stop) of a value, per dimension."""

    start: Shape
    stop: Shape

    @staticmethod
    def whole(shape: Shape) -> Block:
        return Block((0,) * len(shape), tuple(shape))

    def is_whole(self, shape: Shape) -> bool:
        return self == Block.whole(shape)

    @property
    def shape(self) -> Shape:
        return tuple(b - a for a, b in zip(self.start, self.stop, strict=True))

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Reading:
    """One computation's read of an input: its slice's hosts in host-index order, the
    input's sharding and the computation's mesh."""

    hosts: tuple[str, ...]
    spec: AxisSpec
    mesh_shape: Shape
    mesh_axes: tuple[str, ...]


def device_blocks(shape: Shape, spec: AxisSpec, mesh_shape: Shape, mesh_axes: Sequence[str]) -> list[Block] | None:
    """The block each device reads, by flat mesh position; None where the spec does not cut
    `shape` into equal blocks (a dimension its shards do not divide, an unknown axis)."""
    if len(spec) > len(shape):
        return None
    sizes = dict(zip(mesh_axes, mesh_shape, strict=True))
    if any(axis not in sizes for axes in spec for axis in axes):
        return None
    padded = tuple(spec) + ((),) * (len(shape) - len(spec))
    for dim, axes in zip(shape, padded, strict=True):
        if dim % math.prod(sizes[a] for a in axes):
            return None
    position = {axis: i for i, axis in enumerate(mesh_axes)}
    blocks: list[Block] = []
    for coords in itertools.product(*(range(n) for n in mesh_shape)):
        start: list[int] = []
        stop: list[int] = []
        for dim, axes in zip(shape, padded, strict=True):
            shard = 0
            for axis in axes:
                shard = shard * sizes[axis] + coords[position[axis]]
            step = dim // math.prod(sizes[a] for a in axes)
            start.append(shard * step)
            stop.append(shard * step + step)
        blocks.append(Block(tuple(start), tuple(stop)))
    return blocks


def union(blocks: Iterable[Block], shape: Shape) -> Block:
    """The blocks' union where it is one rectangular block; the whole value where it is not
    (or where there are none)."""
    distinct = set(blocks)
    if not distinct:
        return Block.whole(shape)
    start = tuple(min(b.start[d] for b in distinct) for d in range(len(shape)))
    stop = tuple(max(b.stop[d] for b in distinct) for d in range(len(shape)))
    cover = Block(start, stop)
    if len(distinct) == 1 or _covers(distinct, cover):
        return cover
    return Block.whole(shape)


def _covers(blocks: set[Block], box: Block) -> bool:
    """Whether the blocks leave no element of `box` out: checked on the grid their edges
    cut it into (one cell per run of elements no edge splits)."""
    edges = [
        sorted({box.start[d], box.stop[d]} | {b.start[d] for b in blocks} | {b.stop[d] for b in blocks})
        for d in range(len(box.start))
    ]
    for cell in itertools.product(*(zip(e[:-1], e[1:], strict=True) for e in edges)):
        if not any(all(b.start[d] <= lo and hi <= b.stop[d] for d, (lo, hi) in enumerate(cell)) for b in blocks):
            return False
    return True


def host_blocks(shape: Shape, reading: Reading) -> tuple[Block, ...]:
    """The block each host of `reading` needs, in host-index order (see the module docstring)."""
    hosts = len(reading.hosts)
    devices = math.prod(reading.mesh_shape)
    blocks = device_blocks(shape, reading.spec, reading.mesh_shape, reading.mesh_axes)
    if blocks is None or hosts == 0 or devices % hosts:
        return (Block.whole(shape),) * hosts
    per_host = devices // hosts
    return tuple(union(blocks[h * per_host:(h + 1) * per_host], shape) for h in range(hosts))


def host_needs(shape: Shape, readings: Iterable[Reading]) -> dict[str, Block]:
    """Per host address, the block of an input of `shape` it must receive: the union of
    what every reading needs of it there (the whole value where that is not one block)."""
    needs: dict[str, list[Block]] = {}
    for reading in readings:
        for address, block in zip(reading.hosts, host_blocks(shape, reading), strict=True):
            needs.setdefault(address, []).append(block)
    return {address: union(blocks, shape) for address, blocks in needs.items()}


@dataclass(frozen=True)
class HeldBlock:
    """A value of `shape` of which a host holds only `data`, the block at `start`
    (a client input sent to each host as the block that host reads)."""

    shape: Shape
    start: Shape
    data: Any
    """The block itself, an array of shape `stop - start`."""

    @property
    def stop(self) -> Shape:
        return tuple(a + n for a, n in zip(self.start, self.data.shape, strict=True))

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def dtype(self) -> Any:
        return self.data.dtype

    def local_index(self, index: tuple[slice, ...]) -> tuple[slice, ...]:
        """The block's own index for `index` into the global value; a ValueError names
        both where `index` reaches outside the block."""
        local: list[slice] = []
        for d, dim in enumerate(self.shape):
            lo, hi, _ = (index[d] if d < len(index) else slice(None)).indices(dim)
            first, end = self.start[d], self.start[d] + self.data.shape[d]
            if lo < first or max(lo, hi) > end:
                wanted = [s.indices(n)[:2] for s, n in zip(index, self.shape, strict=False)]
                raise ValueError(
                    f"elements {wanted} of a value of shape {list(self.shape)} reach outside "
                    f"the block {list(self.start)}..{list(self.stop)} this host holds: the "
                    "client sent it the block another input sharding reads"
                )
            local.append(slice(lo - first, max(lo, hi) - first))
        return tuple(local)
