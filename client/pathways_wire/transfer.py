"""Moving values between processes as pieces of bytes.

A value (a global array of a program) leaves a host as *pieces*: the shards of it
that host holds (one per distinct shard, `replica_id == 0`), each tagged with
where it sits in the global array (`start`/`stop`). A piece travels as a run of
`BufferChunk`s: the first carries the `BufferHeader`, the following ones only
data, so one piece of any size streams in bounded messages. A sender marks its
last piece with `last_from_sender`; a sender that holds no piece of the value
sends a bare header (no start, no stop, no bytes) with that flag, so a receiver
counting senders never waits for a host that had nothing to say.

The receiving side writes pieces straight into a C-order numpy target (a
`np.memmap` in shared memory on the sidecar, a plain array in the client) and
tracks coverage, so "complete" means every element arrived exactly once.

This module is shared by the client and the host sidecar; it imports only numpy
and the wire protocol. It is one format, written and read: the specs, the pieces,
the framing and the assembly agree byte for byte, so they stay side by side in one
module of about 700 lines rather than split into halves that could drift apart.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.host_blocks import HeldBlock

DEFAULT_CHUNK_BYTES = 1 << 20
# The most data one BufferChunk may carry; receivers reject larger chunks.
MAX_CHUNK_BYTES = 4 << 20
# gRPC message limit both ends should configure: a chunk plus its header.
MAX_MESSAGE_BYTES = 8 << 20
INLINE_MOVE_BYTES = 32 << 10
"""A value up to this size moves between hosts without shared-memory files:
making, mapping and removing a file costs more than the copies it saves."""

Shape = tuple[int, ...]

# ml_dtypes' names (registered with numpy once ml_dtypes is imported, which jax does).
_ML_DTYPES = frozenset(
    {
        "bfloat16",
        "float8_e4m3fn",
        "float8_e4m3b11fnuz",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e3m4",
        "float8_e4m3",
        "float8_e8m0fnu",
        "float4_e2m1fn",
        "float6_e2m3fn",
        "float6_e3m2fn",
        "int2",
        "int4",
        "uint2",
        "uint4",
    }
)


class TransferError(ValueError):
    """A malformed spec, header or piece; `field` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def value_name(value: pb.ValueRef) -> str:
    """How errors name a value: program inputs by position, others by producer."""
    if value.node < 0:
        return f"program input {value.index}"
    return f"output {value.index} of computation {value.node}"


# ---------------------------------------------------------------- specs


@functools.lru_cache(maxsize=64)
def parse_dtype(name: str, field: str = "spec.dtype") -> np.dtype[Any]:
    """The numpy dtype for a wire dtype name; only plain numeric dtypes travel.
    Remembered per name: every inline value and arrival asks, with a handful of names."""
    if not name:
        raise TransferError(field, "empty dtype name")
    try:
        dtype = np.dtype(name)
    except TypeError:
        if name not in _ML_DTYPES:
            raise TransferError(field, f"unknown dtype '{name}'") from None
        dtype = _ml_dtype(name, field)
    if dtype.kind in "OSUMm" or dtype.names is not None or dtype.subdtype is not None:
        raise TransferError(field, f"dtype '{name}' is not a numeric array dtype")
    if dtype.kind == "V" and dtype.name not in _ML_DTYPES:
        raise TransferError(field, f"dtype '{name}' is not a numeric array dtype")
    if not dtype.isnative:
        raise TransferError(field, f"dtype '{name}' is not in native byte order")
    return dtype


def _ml_dtype(name: str, field: str) -> np.dtype[Any]:
    """One of ml_dtypes' types (bfloat16, the float8s), which numpy knows by name only once
    ml_dtypes is imported: imported here, on first use, so that a process that never sees
    one (a host's sidecar, most of the time) does not pay its import as a gang starts."""
    try:
        import ml_dtypes  # noqa: F401  (registers its types with numpy)
    except ImportError:
        raise TransferError(field, f"dtype '{name}' needs ml_dtypes, which is not installed here") from None
    return np.dtype(name)


def numeric_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether arrays of `dtype` can be values of a program: booleans, integers, floats,
    complex numbers and ml_dtypes' types (what `parse_dtype` takes, byte order aside)."""
    return dtype.names is None and dtype.subdtype is None and (
        dtype.kind in "biufc" or dtype.name in _ML_DTYPES
    )


MAX_RANK = 64
"""numpy's bound on an array's dimensions: a spec with more describes no value."""


def parse_spec(spec: pb.TensorSpec, field: str = "spec") -> tuple[Shape, np.dtype[Any]]:
    """Shape and dtype of a TensorSpec, or a TransferError naming the bad field."""
    dtype = parse_dtype(spec.dtype, f"{field}.dtype")
    if len(spec.shape) > MAX_RANK:
        raise TransferError(f"{field}.shape", f"{len(spec.shape)} dimensions; an array has at most {MAX_RANK}")
    shape = tuple(int(d) for d in spec.shape)
    for i, d in enumerate(shape):
        if d < 0:
            raise TransferError(f"{field}.shape[{i}]", f"negative dimension {d} in {list(shape)}")
    return shape, dtype


def spec_of(array: np.ndarray) -> pb.TensorSpec:
    return pb.TensorSpec(shape=list(array.shape), dtype=array.dtype.name)


def moves_inline(nbytes: int) -> bool:
    """Whether a value (or a host's run of it) of `nbytes` travels in the
    messages between worker and sidecar rather than through files."""
    return nbytes <= INLINE_MOVE_BYTES


def spec_nbytes(spec: pb.TensorSpec) -> int:
    shape, dtype = parse_spec(spec)
    return math.prod(shape) * dtype.itemsize


def describe_spec(spec: pb.TensorSpec) -> str:
    return f"{spec.dtype}{list(spec.shape)}"


# ---------------------------------------------------------------- pieces


@dataclass(frozen=True)
class Piece:
    """One block of a value: `data` is the block itself, C-contiguous."""

    start: Shape
    stop: Shape
    data: np.ndarray


class ShardLike(Protocol):
    """What `value_pieces` needs of a jax.Array shard (this module imports no jax)."""

    @property
    def index(self) -> tuple[slice, ...]: ...

    @property
    def replica_id(self) -> int: ...

    @property
    def data(self) -> Any: ...


class ShardedLike(Protocol):
    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def addressable_shards(self) -> Sequence[ShardLike]: ...


def _c_order(array: np.ndarray) -> np.ndarray:
    """C-contiguous, in this machine's byte order (a spec names a dtype, not its byte
    order: `spec_of`), without the rank-0 -> rank-1 promotion of np.ascontiguousarray."""
    if not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="), order="C")
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def wire_bytes(array: np.ndarray) -> bytes:
    """An array's bytes as a value of its `spec_of` travels: C order, native byte order."""
    return _bytes_of(array).tobytes()


def from_wire(spec: pb.TensorSpec, data: bytes) -> np.ndarray:
    """The array whose `wire_bytes` are `data` and whose `spec_of` is `spec` (read-only, over
    `data`); a TransferError for a spec that does not parse or bytes that do not fit it."""
    shape, dtype = parse_spec(spec)
    try:
        return np.frombuffer(data, dtype).reshape(shape)
    except ValueError as err:
        raise TransferError("data", f"{len(data)} bytes are not a {dtype.name}{list(shape)}: {err}") from None


def _bounds(index: tuple[slice, ...], shape: Shape) -> tuple[Shape, Shape]:
    start: list[int] = []
    stop: list[int] = []
    for i, dim in enumerate(shape):
        s = index[i] if i < len(index) else slice(None)
        lo, hi, step = s.indices(dim)
        if step != 1:
            raise TransferError("index", f"strided shard index {index} of shape {list(shape)}")
        start.append(lo)
        stop.append(max(lo, hi))
    return tuple(start), tuple(stop)


def value_pieces(value: np.ndarray | HeldBlock | ShardedLike) -> list[Piece]:
    """This process's pieces of a value: a numpy array is one whole piece; a
    sharded array contributes each addressable shard with `replica_id == 0`
    (so the pieces of all processes cover the global value exactly once). A
    `HeldBlock` has none to give: the other hosts' blocks may overlap its own."""
    if isinstance(value, np.ndarray):
        shape = tuple(value.shape)
        return [Piece((0,) * len(shape), shape, _c_order(value))]
    if isinstance(value, HeldBlock):
        raise TransferError(
            "value",
            f"this host holds only the block {list(value.start)}..{list(value.stop)} of a value of "
            f"shape {list(value.shape)} (a program input split by the hosts reading it), which "
            "cannot be sent on or fetched as the whole value; its client holds the whole",
        )
    shape = tuple(value.shape)
    pieces: list[Piece] = []
    for shard in value.addressable_shards:
        if shard.replica_id != 0:
            continue
        start, stop = _bounds(shard.index, shape)
        pieces.append(Piece(start, stop, _c_order(np.asarray(shard.data))))
    return pieces


def piece_runs(shape: Shape, bounds: Sequence[tuple[Shape, Shape]]) -> list[list[int]]:
    """Groups pieces (by index into `bounds`) into runs that are each one block
    of the value and one contiguous run of its C-order bytes, so a run can be
    written as one file that is, byte for byte, that block.

    Pieces join a run when they span every dimension but the first whole and
    follow each other along the first (the shards of a value split by rows);
    any other piece is a run of its own. Runs come in order of their start."""
    order = sorted(range(len(bounds)), key=lambda i: bounds[i][0])
    runs: list[list[int]] = []
    end: Shape | None = None
    for i in order:
        start, stop = bounds[i]
        rows = len(shape) > 0 and start[1:] == (0,) * (len(shape) - 1) and stop[1:] == shape[1:]
        if rows and runs and end is not None and start[0] == end[0]:
            runs[-1].append(i)
        else:
            runs.append([i])
        end = stop if rows else None
    return runs


def run_block(bounds: Sequence[tuple[Shape, Shape]], run: Sequence[int]) -> tuple[Shape, Shape]:
    """The block a run of pieces covers: the first piece's start, the last one's stop."""
    return bounds[run[0]][0], bounds[run[-1]][1]


@dataclass(frozen=True)
class Crop:
    """The part of a piece inside the block a destination reads."""

    start: Shape
    stop: Shape
    """Where the part sits in the value."""
    region: tuple[slice, ...]
    """Where it sits in the piece."""
    offset: int | None
    """Its first byte in the piece's C-order bytes, where it is one run of them (rows of
    a piece split by rows), else None: it needs bytes of its own."""
    whole: bool
    """The part is the whole piece (it goes as it is)."""


def crop_piece(start: Shape, stop: Shape, itemsize: int, block: tuple[Shape, Shape]) -> Crop | None:
    """The part of the piece [start, stop) inside `block`; None where they do not meet
    (the piece is not sent to that destination)."""
    lo = tuple(max(a, b) for a, b in zip(start, block[0], strict=True))
    hi = tuple(min(a, b) for a, b in zip(stop, block[1], strict=True))
    if any(a >= b for a, b in zip(lo, hi, strict=True)):
        return None
    shape = tuple(b - a for a, b in zip(start, stop, strict=True))
    local_start = tuple(a - s for a, s in zip(lo, start, strict=True))
    local_stop = tuple(b - s for b, s in zip(hi, start, strict=True))
    offset = _contiguous_offset(shape, local_start, local_stop)
    return Crop(
        lo, hi, tuple(slice(a, b) for a, b in zip(local_start, local_stop, strict=True)),
        None if offset is None else offset * itemsize, (lo, hi) == (start, stop),
    )


def piece_header(
    call_id: str,
    value: pb.ValueRef,
    spec: pb.TensorSpec,
    piece: Piece | None,
    sender: str,
    last_from_sender: bool,
) -> pb.BufferHeader:
    """Header of `piece`; None makes the bare "no piece from me" header."""
    header = pb.BufferHeader(
        call_id=call_id, sender=sender, last_from_sender=last_from_sender
    )
    header.value.CopyFrom(value)
    header.spec.CopyFrom(spec)
    if piece is not None:
        header.start.extend(piece.start)
        header.stop.extend(piece.stop)
        header.nbytes = piece.data.nbytes
    return header


def iter_chunks(
    header: pb.BufferHeader, data: memoryview, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[pb.BufferChunk]:
    """The chunks of one piece: the header rides on the first, data follows."""
    flat = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    n = flat.nbytes
    if n == 0:
        yield pb.BufferChunk(header=header)
        return
    for off in range(0, n, chunk_bytes):
        chunk = pb.BufferChunk(data=bytes(flat[off : off + chunk_bytes]))
        if off == 0:
            chunk.header.CopyFrom(header)
        yield chunk


def _bytes_of(array: np.ndarray) -> memoryview:
    contiguous = _c_order(array)
    return contiguous.reshape(-1).view(np.uint8).data


def pieces_chunks(
    call_id: str,
    value: pb.ValueRef,
    spec: pb.TensorSpec,
    pieces: Sequence[Piece],
    sender: str,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[pb.BufferChunk]:
    """All of one sender's pieces of a value, the last flagged `last_from_sender`."""
    if not pieces:
        yield pb.BufferChunk(header=piece_header(call_id, value, spec, None, sender, True))
        return
    for i, piece in enumerate(pieces):
        header = piece_header(call_id, value, spec, piece, sender, i == len(pieces) - 1)
        yield from iter_chunks(header, _bytes_of(piece.data), chunk_bytes)


def whole_value_piece(
    call_id: str, value_ref: pb.ValueRef, array: np.ndarray, sender: str = "client"
) -> tuple[pb.BufferHeader, memoryview]:
    """A whole value (a program input) as one piece: its header and its bytes."""
    array = _c_order(np.asarray(array))
    parse_dtype(array.dtype.name, "array.dtype")
    spec = spec_of(array)
    piece = Piece((0,) * array.ndim, tuple(array.shape), array)
    header = piece_header(call_id, value_ref, spec, piece, sender, True)
    header.whole = True
    return header, _bytes_of(array)


def block_piece(
    call_id: str, value_ref: pb.ValueRef, array: np.ndarray, start: Shape, stop: Shape, sender: str = "client"
) -> tuple[pb.BufferHeader, memoryview]:
    """The block [start, stop) of a program input, as all of it one host receives
    (`BufferHeader.block`: that host holds only the block): its header and its bytes."""
    parse_dtype(array.dtype.name, "array.dtype")
    region = tuple(slice(a, b) for a, b in zip(start, stop, strict=True))
    piece = Piece(tuple(start), tuple(stop), np.ascontiguousarray(array[region]))
    header = piece_header(call_id, value_ref, spec_of(array), piece, sender, True)
    header.block = True
    return header, _bytes_of(piece.data)


def whole_value_chunks(
    call_id: str,
    value_ref: pb.ValueRef,
    array: np.ndarray,
    sender: str = "client",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[pb.BufferChunk]:
    """`whole_value_piece` as the chunks of a `Dataflow.Put` stream."""
    yield from iter_chunks(*whole_value_piece(call_id, value_ref, array, sender), chunk_bytes)


def block_chunks(
    call_id: str,
    value_ref: pb.ValueRef,
    array: np.ndarray,
    start: Shape,
    stop: Shape,
    sender: str = "client",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[pb.BufferChunk]:
    """`block_piece` as the chunks of a `Dataflow.Put` stream."""
    yield from iter_chunks(*block_piece(call_id, value_ref, array, start, stop, sender), chunk_bytes)


def exported_headers(
    exported: pb.Exported, sender: str
) -> Iterator[tuple[pb.BufferHeader, pb.Piece | None]]:
    """The headers a value the worker exported travels under from `sender`, each with
    its piece (a file, or bytes inline): the last flagged `last_from_sender`, a bare
    header if the host has no piece for this receiver, an error header if it failed;
    each marked with the block the receiver gets (`Exported.block`), if it gets one."""
    value, spec = exported.value, exported.spec
    if exported.error:
        header = piece_header(exported.call_id, value, spec, None, sender, True)
        header.error = exported.error
        yield header, None
        return
    if not exported.pieces:
        header = piece_header(exported.call_id, value, spec, None, sender, True)
        set_held_block(header, exported.block)
        yield header, None
        return
    last = len(exported.pieces) - 1
    for i, piece in enumerate(exported.pieces):
        header = piece_header(exported.call_id, value, spec, None, sender, i == last)
        header.start.extend(piece.start)
        header.stop.extend(piece.stop)
        header.nbytes = piece.nbytes
        set_held_block(header, exported.block)
        yield header, piece


def error_chunk(
    call_id: str, value: pb.ValueRef, spec: pb.TensorSpec, sender: str, error: str
) -> pb.BufferChunk:
    """Tells a receiver the value could not be produced, so its consumers fail."""
    header = piece_header(call_id, value, spec, None, sender, True)
    header.error = error
    return pb.BufferChunk(header=header)


# ---------------------------------------------------------------- receiving


@dataclass(frozen=True)
class PieceInfo:
    """A validated BufferHeader."""

    call_id: str
    value: tuple[int, int]
    shape: Shape
    dtype: np.dtype[Any]
    start: Shape
    stop: Shape
    nbytes: int
    sender: str
    last_from_sender: bool
    whole: bool
    error: str
    block: bool = False
    """The piece is all of the value its receiver gets (`BufferHeader.block`)."""
    held: tuple[Shape, Shape] | None = None
    """The block of the value its receiver gets, where that is not the whole value: the
    piece itself (`block`), or the one its senders' pieces are cut to
    (`BufferHeader.block_start`/`block_stop`)."""

    @property
    def has_piece(self) -> bool:
        return bool(self.start or self.stop or self.nbytes or self.whole)

    @property
    def value_nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def check_header(header: pb.BufferHeader) -> PieceInfo:
    """Validates a header against its own spec; errors name the field."""
    if not header.call_id:
        raise TransferError("header.call_id", "empty")
    value = (header.value.node, header.value.index)
    if header.value.node < -1 or header.value.index < 0:
        raise TransferError("header.value", f"invalid value reference {value}")
    if header.error:
        shape: Shape = ()
        dtype: np.dtype[Any] = np.dtype(np.uint8)
        if header.spec.dtype:
            shape, dtype = parse_spec(header.spec, "header.spec")
        return PieceInfo(
            header.call_id, value, shape, dtype, (), (), 0, header.sender, True, False,
            header.error,
        )
    shape, dtype = parse_spec(header.spec, "header.spec")
    if not header.whole and not header.sender:
        raise TransferError(
            "header.sender", "empty; pieces from several hosts are counted by sender"
        )
    start = tuple(int(x) for x in header.start)
    stop = tuple(int(x) for x in header.stop)
    if header.nbytes < 0:
        raise TransferError("header.nbytes", f"negative ({header.nbytes})")
    if header.block and header.whole:
        raise TransferError("header.block", "a block piece is not the whole value; set one of block, whole")
    held = _held_block(header, shape)
    if header.whole:
        if not start and not stop:
            start, stop = (0,) * len(shape), shape
        if start != (0,) * len(shape) or stop != shape:
            raise TransferError(
                "header.start/stop",
                f"a whole piece must span the value {list(shape)}, got {list(start)}..{list(stop)}",
            )
    elif not start and not stop and header.nbytes == 0:
        return PieceInfo(
            header.call_id, value, shape, dtype, (), (), 0, header.sender,
            header.last_from_sender, False, "", held=held,
        )
    if len(start) != len(shape) or len(stop) != len(shape):
        raise TransferError(
            "header.start/stop",
            f"{len(start)}/{len(stop)} indices for a value of rank {len(shape)} {list(shape)}",
        )
    for i, (lo, hi, dim) in enumerate(zip(start, stop, shape, strict=True)):
        if not 0 <= lo <= hi <= dim:
            raise TransferError(
                f"header.start/stop[{i}]",
                f"[{lo}, {hi}) is outside dimension {i} of size {dim} (shape {list(shape)})",
            )
    expected = math.prod(b - a for a, b in zip(start, stop, strict=True)) * dtype.itemsize
    if header.nbytes != expected:
        raise TransferError(
            "header.nbytes",
            f"{header.nbytes} bytes for a {dtype.name} piece "
            f"{list(start)}..{list(stop)} that holds {expected}",
        )
    if held is not None and not all(
        a <= lo and hi <= b for lo, hi, a, b in zip(start, stop, held[0], held[1], strict=True)
    ):
        raise TransferError(
            "header.start/stop",
            f"the piece {list(start)}..{list(stop)} reaches outside the block "
            f"{list(held[0])}..{list(held[1])} its receiver gets",
        )
    if header.block:
        held = (start, stop)
    return PieceInfo(
        header.call_id, value, shape, dtype, start, stop, expected, header.sender,
        header.last_from_sender, header.whole, "", header.block, held,
    )


def _held_block(header: pb.BufferHeader, shape: Shape) -> tuple[Shape, Shape] | None:
    """`header.block_start`/`block_stop`, checked against the value's shape (None: unset)."""
    start = tuple(int(x) for x in header.block_start)
    stop = tuple(int(x) for x in header.block_stop)
    if not start and not stop:
        return None
    if header.block or header.whole:
        raise TransferError(
            "header.block_start", "a block or whole piece carries no block bounds; set one of them"
        )
    if len(start) != len(shape) or len(stop) != len(shape) or not all(
        0 <= lo <= hi <= dim for lo, hi, dim in zip(start, stop, shape, strict=True)
    ):
        raise TransferError(
            "header.block_start/block_stop",
            f"{list(start)}..{list(stop)} is not a block of a value of shape {list(shape)}",
        )
    return start, stop


def set_held_block(header: pb.BufferHeader, block: pb.Region) -> None:
    """Marks a header of a sender's pieces for a receiver that gets only `block`."""
    if block.start or block.stop:
        header.block_start.extend(block.start)
        header.block_stop.extend(block.stop)


def as_block_value(info: PieceInfo) -> PieceInfo:
    """A piece of a block its receiver gets (`info.held`) as a piece of a value of the
    block's own shape: what the receiver assembles and keeps (it records where the block
    sits). The block that came as one piece is that value's whole piece."""
    assert info.held is not None
    low, high = info.held
    shape = tuple(b - a for a, b in zip(low, high, strict=True))
    if info.block:
        return PieceInfo(
            info.call_id, info.value, shape, info.dtype, (0,) * len(shape), shape, info.nbytes,
            info.sender, True, True, "",
        )
    if not info.has_piece:
        return PieceInfo(
            info.call_id, info.value, shape, info.dtype, (), (), 0, info.sender,
            info.last_from_sender, False, "",
        )
    return PieceInfo(
        info.call_id, info.value, shape, info.dtype,
        tuple(a - b for a, b in zip(info.start, low, strict=True)),
        tuple(a - b for a, b in zip(info.stop, low, strict=True)),
        info.nbytes, info.sender, info.last_from_sender, False, "",
    )


def _contiguous_offset(shape: Shape, start: Shape, stop: Shape) -> int | None:
    """Element offset of a block that is one contiguous run in C order, else None."""
    dims = [b - a for a, b in zip(start, stop, strict=True)]
    if any(d == 0 for d in dims):
        return 0
    k = 0
    while k < len(dims) and dims[k] == 1:
        k += 1
    if any(dims[i] != shape[i] for i in range(k + 1, len(dims))):
        return None
    offset = 0
    for lo, dim in zip(start, shape, strict=True):
        offset = offset * dim + lo
    return offset


STAGE_BYTES = 4 << 20
"""The most memory a piece that is no one run of its value holds at once on its way in
(`staged_parts`): a receiver's memory per piece in flight stays bounded by this, like its
bounce buffer, rather than growing with the piece."""

Region = tuple[slice, ...]


def _copy_into(view: memoryview, data: np.ndarray) -> int:
    """What `read_into` does for bytes already in memory: as many as `view` holds."""
    n = min(len(view), len(data))
    np.frombuffer(view, np.uint8, count=n)[:] = data[:n]
    return n


def staged_parts(start: Shape, stop: Shape, itemsize: int, limit: int = STAGE_BYTES) -> Iterator[tuple[Region, Shape]]:
    """The block ``start``..``stop`` of a value as consecutive parts of its own C order,
    each a sub-block (its region in the value, its shape) of at most ``limit`` bytes
    (a single element, where one is larger), and each as large as that allows along
    the block's axes: the bytes of a piece that is no one run of its value arrive in
    this order, and each part is written into the value as soon as it is whole.

    The block's trailing axes that fit within ``limit`` are taken whole; the axis
    before them is cut into ranges that fit; the axes before that are walked one
    index at a time. So every part but the last of its range holds more than half of
    ``limit``, and a block of ``limit`` bytes or less is one part."""
    dims = [b - a for a, b in zip(start, stop, strict=True)]
    if math.prod(dims) * itemsize <= limit:
        yield tuple(slice(a, b) for a, b in zip(start, stop, strict=True)), tuple(dims)
        return
    cut, trailing = 0, math.prod(dims) * itemsize  # cut: the axis cut into ranges
    while trailing > limit and cut < len(dims):
        trailing //= dims[cut]
        cut += 1
    cut -= 1  # the last axis walked: the trailing ones after it fit whole
    step = max(1, limit // trailing)
    whole = tuple(slice(a, b) for a, b in zip(start[cut + 1 :], stop[cut + 1 :], strict=True))
    for outer in np.ndindex(*dims[:cut]):
        fixed = tuple(slice(a + i, a + i + 1) for a, i in zip(start, outer, strict=False))
        for lo in range(0, dims[cut], step):
            hi = min(lo + step, dims[cut])
            region = (*fixed, slice(start[cut] + lo, start[cut] + hi), *whole)
            yield region, (*(1,) * cut, hi - lo, *dims[cut + 1 :])


class PieceAssembler:
    """Pieces of one value written into a C-order numpy target, with coverage.

    Several streams (one per sender) may feed one assembler at once; each opens
    its own `PieceWriter`. Re-sent pieces (a retried stream) overwrite the same
    bytes and are counted once.
    """

    def __init__(
        self,
        target: np.ndarray,
        write_at: Callable[[int, bytes | memoryview], None] | None = None,
        fill_in_place: bool = False,
        stage_bytes: int = STAGE_BYTES,
    ) -> None:
        """`write_at(byte_offset, data)`, if given, receives contiguous runs instead
        of the target's memory (e.g. `os.pwrite` to the file behind a memmap, about
        twice as fast as faulting the mapping's pages in). `fill_in_place`: the
        target's pages are mapped already (a populated mapping of a warm file), so
        `PieceWriter.fill` reads straight into them rather than through `write_at`.
        `stage_bytes`: the most a piece that is no one run of the target holds in memory
        on its way in (`staged_parts`)."""
        if not target.flags.c_contiguous:
            raise ValueError("PieceAssembler needs a C-contiguous target")
        self.target = target
        self.write_at = write_at
        self.fill_in_place = fill_in_place
        self.stage_bytes = stage_bytes
        self.shape: Shape = tuple(target.shape)
        self.dtype: np.dtype[Any] = target.dtype
        self.size = math.prod(self.shape)
        self._flat = target.reshape(-1).view(np.uint8) if target.size else None
        self._lock = threading.Lock()
        self._done: set[tuple[Shape, Shape]] = set()
        self._covered = 0

    @property
    def covered(self) -> int:
        with self._lock:
            return self._covered

    @property
    def complete(self) -> bool:
        return self.covered == self.size

    def open(self, info: PieceInfo) -> PieceWriter:
        if info.shape != self.shape or info.dtype != self.dtype:
            raise TransferError(
                "header.spec",
                f"{info.dtype.name}{list(info.shape)} does not match the value's "
                f"{self.dtype.name}{list(self.shape)}",
            )
        return PieceWriter(self, info)

    def _counted(self, info: PieceInfo) -> None:
        """The piece's bytes are all in the target: counts its elements, once per piece."""
        key = (info.start, info.stop)
        with self._lock:
            if key not in self._done:
                self._done.add(key)
                self._covered += math.prod(b - a for a, b in zip(info.start, info.stop, strict=True))
            if self._covered > self.size:
                raise TransferError(
                    "header.start/stop",
                    f"pieces overlap: {self._covered} elements written to a value of {self.size}",
                )


class PieceWriter:
    """Receives the bytes of one piece, in order, into its assembler's target."""

    def __init__(self, assembler: PieceAssembler, info: PieceInfo) -> None:
        self.assembler = assembler
        self.info = info
        self.received = 0
        offset = _contiguous_offset(assembler.shape, info.start, info.stop)
        self._direct: np.ndarray | None = None
        self._stage: np.ndarray | None = None
        """A piece that is no one run of its value: its bytes land here, one part of it
        (`staged_parts`) at a time, each written into the value once whole."""
        self._parts: Iterator[tuple[Region, Shape]] = iter(())
        self._part: tuple[Region, Shape, int] | None = None
        self._staged = 0
        self._offset = -1
        if info.nbytes == 0:
            pass
        elif offset is not None and assembler.write_at is not None:
            self._offset = offset * assembler.dtype.itemsize
        elif offset is not None and assembler._flat is not None:
            lo = offset * assembler.dtype.itemsize
            self._direct = assembler._flat[lo : lo + info.nbytes]
        else:
            itemsize = assembler.dtype.itemsize
            self._parts = staged_parts(info.start, info.stop, itemsize, assembler.stage_bytes)
            self._next_part()
            self._stage = np.empty(max(itemsize, min(info.nbytes, assembler.stage_bytes)), np.uint8)
        if info.nbytes == 0:
            self._finish()

    @property
    def done(self) -> bool:
        return self.received == self.info.nbytes

    def write(self, data: bytes) -> bool:
        """Appends data; True once the piece is complete (and counted)."""
        n = len(data)
        if self.received + n > self.info.nbytes:
            raise TransferError(
                "data",
                f"{self.received + n} bytes received for a piece of {self.info.nbytes} "
                f"({list(self.info.start)}..{list(self.info.stop)})",
            )
        if self._offset >= 0:
            assert self.assembler.write_at is not None
            self.assembler.write_at(self._offset + self.received, data)
        elif self._direct is not None:
            self._direct[self.received : self.received + n] = np.frombuffer(data, np.uint8)
        else:
            given, at = np.frombuffer(data, np.uint8), 0
            while at < n:
                at += self._take(lambda view: _copy_into(view, given[at:]))
        self.received += n
        if self.done:
            self._finish()
            return True
        return False

    def fill(self, read_into: Callable[[memoryview], int], bounce: memoryview | None = None) -> None:
        """Receives the rest of the piece in place: `read_into(view)` (e.g. a
        socket's `recv_into`) writes up to len(view) bytes and returns how many;
        0 means the source ended early. With the assembler's `write_at` and a
        `bounce` buffer, runs land in the buffer and go on by `write_at` (into a
        fresh shared-memory file that is about twice as fast as faulting in the
        pages of its mapping); otherwise (or with `fill_in_place`) straight into
        the target's memory."""
        write_at = None if self.assembler.fill_in_place else self.assembler.write_at
        if self._offset >= 0 and write_at is not None and bounce is not None:
            while self.received < self.info.nbytes:
                n = read_into(bounce[: min(len(bounce), self.info.nbytes - self.received)])
                if n <= 0:
                    raise self._short()
                write_at(self._offset + self.received, bounce[:n])
                self.received += n
            self._finish()
            return
        if self._stage is not None:
            while self.received < self.info.nbytes:
                n = self._take(read_into)
                if n <= 0:
                    raise self._short()
                self.received += n
            self._finish()
            return
        dest = self._direct
        if dest is None and self._offset >= 0 and self.assembler._flat is not None:
            lo = self._offset
            dest = self.assembler._flat[lo : lo + self.info.nbytes]
        if dest is None:
            if self.info.nbytes:
                raise TransferError("data", "this piece's destination takes no in-place writes")
            return
        view = memoryview(dest)  # type: ignore[arg-type]
        while self.received < self.info.nbytes:
            n = read_into(view[self.received :])
            if n <= 0:
                raise self._short()
            self.received += n
        self._finish()

    def _short(self) -> TransferError:
        return TransferError(
            "data",
            f"the source ended {self.info.nbytes - self.received} bytes before the end "
            f"of piece {list(self.info.start)}..{list(self.info.stop)}",
        )

    @property
    def file_offset(self) -> int | None:
        """Where the piece's bytes start in the target's file, if they are one run
        there and the target is written through `write_at` (a file)."""
        return self._offset if self._offset >= 0 else None

    def placed(self) -> None:
        """The piece's bytes were put at `file_offset` by other means (a kernel
        copy between files, or the piece's file became the value's file)."""
        if self._offset < 0 and self.info.nbytes:
            raise TransferError("header.path", "this piece is not one run of the value's file")
        self.received = self.info.nbytes
        self._finish()

    def _next_part(self) -> None:
        part = next(self._parts, None)
        self._part = None if part is None else (*part, math.prod(part[1]) * self.assembler.dtype.itemsize)
        self._staged = 0

    def _take(self, read_into: Callable[[memoryview], int]) -> int:
        """Stages up to the rest of the current part through `read_into`; a part made
        whole is written into the value. How many bytes were taken (0: none came)."""
        assert self._stage is not None and self._part is not None
        region, shape, nbytes = self._part
        n = read_into(self._stage.data[self._staged : nbytes])
        if n > 0:
            self._staged += n
            if self._staged == nbytes:
                self.assembler.target[region] = self._stage[:nbytes].view(self.assembler.dtype).reshape(shape)
                self._next_part()
        return n

    def _finish(self) -> None:
        self.assembler._counted(self.info)


# ---------------------------------------------------------------- client helpers


def put_value(
    stub: pb_grpc.DataflowStub,
    call_id: str,
    value_ref: pb.ValueRef,
    array: np.ndarray,
    timeout_s: float,
    sender: str = "client",
) -> int:
    """Puts a whole value on one host; returns the pieces the host received."""
    reply: pb.PutReply = stub.Put(
        whole_value_chunks(call_id, value_ref, array, sender), timeout=timeout_s
    )
    return int(reply.pieces)


class FetchTarget:
    """The shared destination of a fetch from several hosts, made on the first header."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._lock = threading.Lock()
        self.assembler: PieceAssembler | None = None

    def assembler_for(self, info: PieceInfo) -> PieceAssembler:
        with self._lock:
            if self.assembler is None:
                self.assembler = PieceAssembler(np.empty(info.shape, info.dtype))
            return self.assembler


def _opened(header: pb.BufferHeader, target: FetchTarget, host: str) -> tuple[PieceWriter | None, bool]:
    """The writer of a piece a host sent (None for a header with no piece), and
    whether it was that host's last."""
    info = check_header(header)
    if info.error:
        raise RuntimeError(f"{target.what} failed on host {host}: {info.error}")
    assembler = target.assembler_for(info)
    return (assembler.open(info) if info.has_piece else None), info.last_from_sender


def receive_piece(
    header: pb.BufferHeader, target: FetchTarget, host: str, read_into: Callable[[memoryview], int]
) -> bool:
    """One piece a host sent over a data connection, its bytes read straight into the
    target; returns whether it was the host's last."""
    writer, last = _opened(header, target, host)
    if writer is not None and not writer.done:
        writer.fill(read_into)
    return last


def _receive(chunks: Iterable[pb.BufferChunk], target: FetchTarget, host: str) -> None:
    writer: PieceWriter | None = None
    finished = False
    for chunk in chunks:
        if chunk.HasField("header"):
            if writer is not None and not writer.done:
                raise TransferError(
                    "header", f"{target.what}: host {host} started a piece before finishing one"
                )
            writer, finished = _opened(chunk.header, target, host)
        if chunk.data:
            if writer is None:
                raise TransferError("data", f"{target.what}: host {host} sent data without a header")
            writer.write(chunk.data)
    if not finished or (writer is not None and not writer.done):
        raise TransferError("last_from_sender", f"{target.what}: host {host} ended its stream early")


Receive = Callable[[pb.FetchRequest, FetchTarget, str], None]
"""How one host's pieces of a fetched value reach the target: a gRPC Fetch stream
(`grpc_receive`), or a data connection (`DataConnection.fetch`)."""


def grpc_receive(stub: pb_grpc.DataflowStub) -> Receive:
    def receive(request: pb.FetchRequest, target: FetchTarget, host: str) -> None:
        _receive(stub.Fetch(request, timeout=request.timeout_s + 5.0), target, host)

    return receive


def fetch_value(
    stubs: pb_grpc.DataflowStub | Sequence[pb_grpc.DataflowStub],
    call_id: str,
    value_ref: pb.ValueRef,
    timeout_s: float,
    release: bool = False,
    hosts: Sequence[str] | None = None,
) -> np.ndarray:
    """Fetches a value's pieces from every host holding some (in parallel) over gRPC
    and assembles them into one numpy array (`fetch_from`)."""
    stub_list = [stubs] if isinstance(stubs, pb_grpc.DataflowStub) else list(stubs)
    names = list(hosts) if hosts is not None else [f"#{i}" for i in range(len(stub_list))]
    return fetch_from([grpc_receive(s) for s in stub_list], names, call_id, value_ref, timeout_s, release)


def fetch_from(
    sources: Sequence[Receive],
    hosts: Sequence[str],
    call_id: str,
    value_ref: pb.ValueRef,
    timeout_s: float,
    release: bool = False,
) -> np.ndarray:
    """Fetches a value's pieces from every host holding some (in parallel, each by its
    source) and assembles them into one numpy array. A source's errors propagate
    (grpc.RpcError, DataChannelError); pieces that do not cover the value raise
    TransferError."""
    what = f"{value_name(value_ref)} of call {call_id}"
    target = FetchTarget(what)
    request = pb.FetchRequest(call_id=call_id, timeout_s=timeout_s, release=release)
    request.value.CopyFrom(value_ref)
    errors: list[BaseException] = []

    def one(receive: Receive, host: str) -> None:
        try:
            receive(request, target, host)
        except BaseException as err:  # re-raised in the caller's thread
            errors.append(err)

    if len(sources) == 1:
        one(sources[0], hosts[0])
    else:
        threads = [
            threading.Thread(target=one, args=(s, h), daemon=True)
            for s, h in zip(sources, hosts, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    assembler = target.assembler
    if assembler is None:
        raise TransferError("hosts", f"{what}: no host was asked for it")
    if not assembler.complete:
        raise TransferError(
            "start/stop",
            f"{what}: pieces from {len(sources)} host(s) cover {assembler.covered} "
            f"of {assembler.size} elements",
        )
    return assembler.target
