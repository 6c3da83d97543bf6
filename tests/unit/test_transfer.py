"""Pieces, chunks and assembly of values (pathways_wire.transfer), without sockets."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from pathways_wire import transfer
from pathways_wire.host_blocks import HeldBlock
from pathways_wire import pathways_pb2 as pb


def ref(node: int = 0, index: int = 0) -> pb.ValueRef:
    return pb.ValueRef(node=node, index=index)


@dataclass(frozen=True)
class FakeShard:
    index: tuple[slice, ...]
    replica_id: int
    data: np.ndarray


@dataclass(frozen=True)
class FakeSharded:
    shape: tuple[int, ...]
    addressable_shards: list[FakeShard]


def shards_of(array: np.ndarray, rows: int, cols: int, replicas: int = 1) -> FakeSharded:
    """A 2-D array split into rows x cols blocks, each held `replicas` times."""
    shards = []
    r_step, c_step = array.shape[0] // rows, array.shape[1] // cols
    for r in range(rows):
        for c in range(cols):
            idx = (slice(r * r_step, (r + 1) * r_step), slice(c * c_step, (c + 1) * c_step))
            for rep in range(replicas):
                shards.append(FakeShard(idx, rep, array[idx]))
    return FakeSharded(array.shape, shards)


def assemble(chunks: Iterable[pb.BufferChunk], target: np.ndarray) -> transfer.PieceAssembler:
    assembler = transfer.PieceAssembler(target)
    writer: transfer.PieceWriter | None = None
    for chunk in chunks:
        if chunk.HasField("header"):
            info = transfer.check_header(chunk.header)
            writer = assembler.open(info) if info.has_piece else None
        if chunk.data:
            assert writer is not None
            writer.write(chunk.data)
    return assembler


def test_parse_spec_accepts_numeric_and_rejects_others() -> None:
    assert transfer.parse_spec(pb.TensorSpec(shape=[2, 3], dtype="float32")) == (
        (2, 3),
        np.dtype(np.float32),
    )
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, as jax does)

    assert transfer.parse_dtype("bfloat16").name == "bfloat16"
    for bad in ["object", "str", "U8", "V4", "nope", "", ">f4"]:
        with pytest.raises(transfer.TransferError, match="spec.dtype"):
            transfer.parse_spec(pb.TensorSpec(shape=[1], dtype=bad))
    with pytest.raises(transfer.TransferError, match=r"spec.shape\[1\]"):
        transfer.parse_spec(pb.TensorSpec(shape=[1, -2], dtype="int32"))


def test_a_value_from_its_wire_bytes_is_the_array_sent_in_native_byte_order() -> None:
    sent = np.arange(6, dtype=">i4").reshape(2, 3).T  # big-endian and not C-contiguous
    got = transfer.from_wire(transfer.spec_of(sent), transfer.wire_bytes(sent))
    np.testing.assert_array_equal(got, sent)
    assert got.dtype == np.dtype("int32") and got.shape == (3, 2)
    with pytest.raises(transfer.TransferError, match=r"data: 20 bytes are not a int32\[3, 2\]"):
        transfer.from_wire(transfer.spec_of(sent), transfer.wire_bytes(sent)[:20])


def test_a_spec_of_more_dimensions_than_an_array_can_have_is_refused_naming_the_shape() -> None:
    assert transfer.parse_spec(pb.TensorSpec(shape=[1] * transfer.MAX_RANK, dtype="uint8"))[0] == (1,) * 64
    with pytest.raises(transfer.TransferError, match=r"spec.shape: 70 dimensions"):
        transfer.parse_spec(pb.TensorSpec(shape=[1] * 69 + [16], dtype="uint8"))


def test_iter_chunks_puts_header_on_first_chunk_only() -> None:
    data = np.arange(1000, dtype=np.uint8)
    header = pb.BufferHeader(call_id="c", nbytes=1000)
    chunks = list(transfer.iter_chunks(header, data.data, chunk_bytes=300))
    assert [len(c.data) for c in chunks] == [300, 300, 300, 100]
    assert [c.HasField("header") for c in chunks] == [True, False, False, False]
    assert b"".join(c.data for c in chunks) == data.tobytes()
    empty = list(transfer.iter_chunks(header, memoryview(b""), chunk_bytes=300))
    assert len(empty) == 1 and empty[0].HasField("header") and not empty[0].data


def test_whole_value_roundtrip_through_assembler() -> None:
    array = np.random.default_rng(0).standard_normal((33, 17)).astype(np.float32)
    chunks = list(transfer.whole_value_chunks("call", ref(-1, 0), array, chunk_bytes=1000))
    first = chunks[0].header
    assert first.whole and first.last_from_sender and first.nbytes == array.nbytes
    assembler = assemble(chunks, np.zeros_like(array))
    assert assembler.complete
    np.testing.assert_array_equal(assembler.target, array)


@pytest.mark.parametrize("dtype", [">f4", ">i2", ">c8"])
def test_a_big_endian_array_travels_in_native_byte_order_as_its_spec_says(dtype: str) -> None:
    array = np.arange(-3, 9, dtype=dtype).reshape(3, 4)
    native = array.astype(np.dtype(dtype).newbyteorder("="))
    spec = transfer.spec_of(array)
    assert transfer.wire_bytes(array) == native.tobytes()
    assert transfer.wire_bytes(array[:, ::2]) == np.ascontiguousarray(native[:, ::2]).tobytes()
    chunks = list(transfer.whole_value_chunks("call", ref(-1, 0), array, chunk_bytes=10))
    assembled = assemble(chunks, np.zeros(*transfer.parse_spec(spec)))
    np.testing.assert_array_equal(assembled.target, native)
    header, data = transfer.block_piece("call", ref(-1, 0), array, (1, 0), (3, 4))
    assert bytes(data) == native[1:].tobytes()


def test_a_block_travels_as_its_piece_and_is_kept_as_a_value_of_its_own_shape() -> None:
    array = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    chunks = list(transfer.block_chunks("call", ref(-1, 0), array, (4, 0), (8, 6), chunk_bytes=40))
    first = chunks[0].header
    assert first.block and not first.whole and first.last_from_sender
    assert (list(first.spec.shape), list(first.start), list(first.stop)) == ([8, 6], [4, 0], [8, 6])
    assert sum(len(c.data) for c in chunks) == array[4:].nbytes, "only the block's bytes travel"
    info = transfer.check_header(first)
    assert info.block and info.shape == (8, 6)
    kept = transfer.as_block_value(info)
    assert (kept.shape, kept.start, kept.stop, kept.whole) == ((4, 6), (0, 0), (4, 6), True)
    assembler = transfer.PieceAssembler(np.zeros((4, 6), np.float32))
    writer = assembler.open(kept)
    for c in chunks:
        writer.write(c.data)
    assert assembler.complete
    np.testing.assert_array_equal(assembler.target, array[4:])


def test_a_held_block_is_never_sent_as_the_whole_value() -> None:
    held = HeldBlock((8, 6), (4, 0), np.zeros((4, 6), np.float32))
    with pytest.raises(transfer.TransferError, match=r"only the block \[4, 0\]..\[8, 6\] of a value of shape \[8, 6\]"):
        transfer.value_pieces(held)


@pytest.mark.parametrize(("rows", "cols"), [(4, 1), (1, 4), (2, 2)])
def test_sharded_pieces_skip_replicas_and_reassemble(rows: int, cols: int) -> None:
    array = np.arange(8 * 12, dtype=np.int64).reshape(8, 12)
    pieces = transfer.value_pieces(shards_of(array, rows, cols, replicas=2))
    assert len(pieces) == rows * cols
    spec = transfer.spec_of(array)
    chunks = transfer.pieces_chunks("c", ref(), spec, pieces, "host-0", chunk_bytes=40)
    assembler = assemble(chunks, np.zeros_like(array))
    assert assembler.complete
    np.testing.assert_array_equal(assembler.target, array)


def test_pieces_from_two_senders_and_a_sender_with_nothing() -> None:
    array = np.arange(16, dtype=np.float64).reshape(4, 4)
    sharded = shards_of(array, 2, 1)
    spec = transfer.spec_of(array)
    a = transfer.pieces_chunks("c", ref(), spec, transfer.value_pieces(
        FakeSharded(array.shape, sharded.addressable_shards[:1])), "a")
    b = transfer.pieces_chunks("c", ref(), spec, transfer.value_pieces(
        FakeSharded(array.shape, sharded.addressable_shards[1:])), "b")
    nobody = list(transfer.pieces_chunks("c", ref(), spec, [], "z"))
    assert len(nobody) == 1 and nobody[0].header.last_from_sender
    assert not transfer.check_header(nobody[0].header).has_piece
    assembler = assemble([*a, *nobody, *b], np.zeros_like(array))
    assert assembler.complete
    np.testing.assert_array_equal(assembler.target, array)


def test_scalar_and_empty_values() -> None:
    scalar = np.array(3.5, dtype=np.float32)
    assembler = assemble(transfer.whole_value_chunks("c", ref(-1, 1), scalar), np.zeros((), np.float32))
    assert assembler.complete and float(assembler.target) == 3.5
    empty = np.zeros((0, 3), np.int32)
    assembler = assemble(transfer.whole_value_chunks("c", ref(-1, 2), empty), np.zeros((0, 3), np.int32))
    assert assembler.complete


def test_scalar_shard_of_a_sharded_value() -> None:
    scalar = np.array(7, dtype=np.int32)
    pieces = transfer.value_pieces(FakeSharded((), [FakeShard((), 0, scalar), FakeShard((), 1, scalar)]))
    assert len(pieces) == 1 and pieces[0].start == () and pieces[0].data.nbytes == 4
    chunks = transfer.pieces_chunks("c", ref(), transfer.spec_of(scalar), pieces, "h")
    assembler = assemble(chunks, np.zeros((), np.int32))
    assert assembler.complete and int(assembler.target) == 7


def test_resent_piece_is_counted_once() -> None:
    array = np.arange(12, dtype=np.int32).reshape(3, 4)
    chunks = list(transfer.whole_value_chunks("c", ref(-1, 0), array))
    assembler = assemble([*chunks, *chunks], np.zeros_like(array))
    assert assembler.covered == 12 and assembler.complete


def header(**kw: object) -> pb.BufferHeader:
    h = pb.BufferHeader(call_id="c", sender="h", spec=pb.TensorSpec(shape=[4, 4], dtype="float32"))
    h.value.CopyFrom(ref())
    for k, v in kw.items():
        if k in ("start", "stop"):
            getattr(h, k).extend(v)
        elif k == "spec":
            h.spec.CopyFrom(v)  # type: ignore[arg-type]
        else:
            setattr(h, k, v)
    return h


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"start": [0, 0], "stop": [5, 4], "nbytes": 80}, "header.start/stop[0]"),
        ({"start": [0], "stop": [4], "nbytes": 16}, "header.start/stop"),
        ({"start": [0, 0], "stop": [2, 4], "nbytes": 31}, "header.nbytes"),
        ({"start": [0, 0], "stop": [2, 4], "nbytes": 32, "spec": pb.TensorSpec(shape=[4, 4], dtype="obj")}, "header.spec.dtype"),
        ({"call_id": ""}, "header.call_id"),
        ({"start": [0, 0], "stop": [2, 4], "nbytes": 32, "sender": ""}, "header.sender"),
        ({"whole": True, "start": [1, 0], "stop": [4, 4], "nbytes": 48}, "header.start/stop"),
        ({"whole": True, "block": True, "start": [0, 0], "stop": [4, 4], "nbytes": 64}, "header.block"),
    ],
)
def test_malformed_headers_name_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(transfer.TransferError) as err:
        transfer.check_header(header(**kw))
    assert err.value.field == field


def test_writer_rejects_excess_bytes_and_mismatched_spec() -> None:
    assembler = transfer.PieceAssembler(np.zeros((4, 4), np.float32))
    writer = assembler.open(transfer.check_header(header(start=[0, 0], stop=[1, 4], nbytes=16)))
    with pytest.raises(transfer.TransferError, match="data"):
        writer.write(b"x" * 17)
    other = transfer.check_header(header(
        start=[0, 0], stop=[1, 4], nbytes=32, spec=pb.TensorSpec(shape=[4, 4], dtype="float64")))
    with pytest.raises(transfer.TransferError, match="does not match"):
        assembler.open(other)


class FakeStub:
    """Plays one host's Dataflow.Fetch with a fixed chunk stream."""

    def __init__(self, chunks: list[pb.BufferChunk]) -> None:
        self.chunks = chunks
        self.requests: list[pb.FetchRequest] = []

    def Fetch(self, request: pb.FetchRequest, timeout: float) -> Iterator[pb.BufferChunk]:
        self.requests.append(request)
        return iter(self.chunks)


def test_fetch_value_assembles_from_several_hosts() -> None:
    array = np.arange(64, dtype=np.float32).reshape(8, 8)
    sharded = shards_of(array, 2, 2)
    spec = transfer.spec_of(array)
    stubs = []
    for h in range(2):
        pieces = transfer.value_pieces(FakeSharded(array.shape, sharded.addressable_shards[2 * h : 2 * h + 2]))
        stubs.append(FakeStub(list(transfer.pieces_chunks("c", ref(2, 0), spec, pieces, f"h{h}"))))
    got = transfer.fetch_value(stubs, "c", ref(2, 0), 5.0, release=True)  # type: ignore[arg-type]
    np.testing.assert_array_equal(got, array)
    assert stubs[0].requests[0].release and stubs[0].requests[0].value.node == 2


def test_fetch_value_reports_missing_pieces_and_errors() -> None:
    array = np.arange(16, dtype=np.float32).reshape(4, 4)
    sharded = shards_of(array, 2, 1)
    spec = transfer.spec_of(array)
    half = transfer.value_pieces(FakeSharded(array.shape, sharded.addressable_shards[:1]))
    stub = FakeStub(list(transfer.pieces_chunks("c", ref(), spec, half, "h0")))
    with pytest.raises(transfer.TransferError, match="cover 8 of 16"):
        transfer.fetch_value([stub], "c", ref(), 5.0)  # type: ignore[list-item]
    failing = FakeStub([transfer.error_chunk("c", ref(), spec, "h0", "boom")])
    with pytest.raises(RuntimeError, match="boom"):
        transfer.fetch_value([failing], "c", ref(), 5.0)  # type: ignore[list-item]


def _reader(data: bytes, step: int) -> tuple[list[int], Callable[[memoryview], int]]:
    """A read_into over `data` that hands out at most `step` bytes per call."""
    pos = [0]

    def read_into(view: memoryview) -> int:
        n = min(len(view), step, len(data) - pos[0])
        view[:n] = data[pos[0] : pos[0] + n]
        pos[0] += n
        return n

    return pos, read_into


@pytest.mark.parametrize("through_file", [False, True])
def test_fill_receives_pieces_in_place(through_file: bool) -> None:
    value = np.arange(48, dtype=np.float32).reshape(6, 8)
    target = np.zeros_like(value)
    flat = target.reshape(-1).view(np.uint8)

    def write_at(offset: int, data: bytes | memoryview) -> None:
        flat[offset : offset + len(data)] = np.frombuffer(data, np.uint8)

    assembler = transfer.PieceAssembler(target, write_at if through_file else None)
    for piece in transfer.value_pieces(shards_of(value, 2, 2)):  # column blocks: not one run
        header = transfer.piece_header("c", ref(), transfer.spec_of(value), piece, "h0", False)
        writer = assembler.open(transfer.check_header(header))
        _, read_into = _reader(piece.data.tobytes(), 7)
        writer.fill(read_into, memoryview(bytearray(5)))
        assert writer.done
    assert assembler.complete
    np.testing.assert_array_equal(target, value)


BLOCKS = [
    ((12, 10, 6), (2, 3, 1), (9, 7, 5)),  # every axis cut: no two rows are one run
    ((40, 6), (0, 2), (40, 5)),  # a column block
    ((5, 4, 8), (1, 0, 0), (4, 4, 8)),  # rows: one run
    ((3, 50), (1, 7), (2, 43)),  # a single row segment
]


@pytest.mark.parametrize("shape,start,stop", BLOCKS)
@pytest.mark.parametrize("limit", [8, 20, 100, 1 << 20])
def test_staged_parts_cover_a_block_in_its_own_order_within_the_limit(
    shape: tuple[int, ...], start: tuple[int, ...], stop: tuple[int, ...], limit: int
) -> None:
    value = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    block = value[tuple(slice(a, b) for a, b in zip(start, stop))]
    parts = list(transfer.staged_parts(start, stop, 4, limit))
    joined = np.concatenate([value[region].reshape(-1) for region, _ in parts])
    np.testing.assert_array_equal(joined, block.reshape(-1))  # the block's C order, each element once
    for region, part_shape in parts:
        assert value[region].shape == part_shape
        assert np.prod(part_shape) * 4 <= max(limit, 4)
    if block.nbytes <= limit:
        assert len(parts) == 1


def test_staged_parts_take_trailing_axes_whole_and_cut_the_one_before_into_ranges() -> None:
    # 3 columns of 4 B: 12 B a row; 100 B hold 8 rows, so 40 rows are 5 parts of 8
    parts = list(transfer.staged_parts((0, 2), (40, 5), 4, 100))
    assert [shape for _, shape in parts] == [(8, 3)] * 5
    assert parts[1][0] == (slice(8, 16), slice(2, 5))
    # a 2 x 10 x 3 block of 8 B elements within 64 B: rows of 24 B, 2 a part, walked per outer index
    parts = list(transfer.staged_parts((1, 0, 1), (3, 10, 4), 8, 64))
    assert [shape for _, shape in parts] == [(1, 2, 3)] * 10
    assert parts[5][0] == (slice(2, 3), slice(0, 2), slice(1, 4))


@pytest.mark.parametrize("through", ["write", "fill"])
def test_a_piece_that_is_no_one_run_is_received_through_a_bounded_stage(through: str) -> None:
    value = np.arange(12 * 10 * 6, dtype=np.int32).reshape(12, 10, 6)
    target = np.zeros_like(value)
    assembler = transfer.PieceAssembler(target, stage_bytes=40)
    start, stop = (2, 3, 1), (9, 7, 5)
    region = tuple(slice(a, b) for a, b in zip(start, stop))
    piece = transfer.Piece(start, stop, np.ascontiguousarray(value[region]))
    header = transfer.piece_header("c", ref(), transfer.spec_of(value), piece, "h", True)
    writer = assembler.open(transfer.check_header(header))
    assert writer.file_offset is None  # no one run of the value
    assert writer._stage is not None and writer._stage.nbytes == 40  # not the piece's 448 B
    data = piece.data.tobytes()
    if through == "write":
        for i in range(0, len(data), 13):
            assert writer.write(data[i : i + 13]) == (i + 13 >= len(data))
    else:
        _, read_into = _reader(data, 7)
        writer.fill(read_into)
    assert writer.done and assembler.complete is False
    expected = np.zeros_like(value)
    expected[region] = value[region]
    np.testing.assert_array_equal(target, expected)
    assert assembler.covered == piece.data.size


def test_a_staged_piece_cut_short_is_not_counted() -> None:
    value = np.arange(64, dtype=np.float64).reshape(8, 8)
    assembler = transfer.PieceAssembler(np.zeros_like(value), stage_bytes=32)
    piece = transfer.value_pieces(shards_of(value, 1, 2))[0]  # columns 0..3: no one run
    header = transfer.piece_header("c", ref(), transfer.spec_of(value), piece, "h", False)
    writer = assembler.open(transfer.check_header(header))
    _, read_into = _reader(piece.data.tobytes()[:100], 9)
    with pytest.raises(transfer.TransferError, match="ended 156 bytes before the end"):
        writer.fill(read_into)
    assert assembler.covered == 0


def test_fill_names_a_source_that_ends_early() -> None:
    value = np.arange(16, dtype=np.int32)
    assembler = transfer.PieceAssembler(np.zeros_like(value))
    header = transfer.piece_header("c", ref(), transfer.spec_of(value), transfer.value_pieces(value)[0], "h", True)
    writer = assembler.open(transfer.check_header(header))
    _, read_into = _reader(value.tobytes()[:10], 4)
    with pytest.raises(transfer.TransferError, match="ended 54 bytes before the end"):
        writer.fill(read_into)
    assert not assembler.complete


def test_placed_counts_a_run_written_by_other_means() -> None:
    value = np.arange(12, dtype=np.float64).reshape(4, 3)
    target = np.zeros_like(value)
    assembler = transfer.PieceAssembler(target, lambda offset, data: None)
    for piece in transfer.value_pieces(shards_of(value, 2, 1)):  # row blocks: one run each
        header = transfer.piece_header("c", ref(), transfer.spec_of(value), piece, "h", False)
        writer = assembler.open(transfer.check_header(header))
        assert writer.file_offset == piece.start[0] * 3 * 8
        writer.placed()
    assert assembler.complete
    column = transfer.value_pieces(shards_of(value, 1, 3))[1]
    header = transfer.piece_header("c", ref(), transfer.spec_of(value), column, "h", False)
    writer = transfer.PieceAssembler(np.zeros_like(value), lambda o, d: None).open(transfer.check_header(header))
    assert writer.file_offset is None
    with pytest.raises(transfer.TransferError, match="header.path"):
        writer.placed()


# ---------------------------------------------------------------- runs of pieces


def test_row_shards_of_one_host_form_one_run_covering_the_value() -> None:
    shape = (8, 4)
    bounds = [((4, 0), (6, 4)), ((0, 0), (2, 4)), ((6, 0), (8, 4)), ((2, 0), (4, 4))]
    runs = transfer.piece_runs(shape, bounds)
    assert runs == [[1, 3, 0, 2]]
    assert transfer.run_block(bounds, runs[0]) == ((0, 0), (8, 4))


def test_row_shards_with_a_gap_form_two_runs() -> None:
    shape = (8, 4)
    bounds = [((0, 0), (2, 4)), ((4, 0), (6, 4)), ((6, 0), (8, 4))]
    runs = transfer.piece_runs(shape, bounds)
    assert runs == [[0], [1, 2]]
    assert transfer.run_block(bounds, runs[1]) == ((4, 0), (8, 4))


def test_column_shards_stay_separate_pieces() -> None:
    shape = (4, 8)
    bounds = [((0, 0), (4, 4)), ((0, 4), (4, 8))]
    assert transfer.piece_runs(shape, bounds) == [[0], [1]]


def test_a_run_written_in_order_is_byte_for_byte_its_block() -> None:
    value = np.arange(48, dtype=np.float32).reshape(12, 4)
    shards = [FakeShard((slice(r, r + 3), slice(None)), 0, value[r : r + 3]) for r in (6, 0, 9, 3)]
    pieces = transfer.value_pieces(FakeSharded(value.shape, shards))
    bounds = [(p.start, p.stop) for p in pieces]
    (run,) = transfer.piece_runs(value.shape, bounds)
    written = np.concatenate([pieces[i].data.reshape(-1) for i in run])
    start, stop = transfer.run_block(bounds, run)
    assert np.array_equal(written.reshape(value.shape), value[start[0] : stop[0]])


def test_a_scalar_is_one_run_of_its_own() -> None:
    assert transfer.piece_runs((), [((), ())]) == [[0]]


def test_only_small_values_move_inline() -> None:
    assert transfer.moves_inline(0)
    assert transfer.moves_inline(4096)
    assert transfer.moves_inline(transfer.INLINE_MOVE_BYTES)
    assert not transfer.moves_inline(transfer.INLINE_MOVE_BYTES + 1)


def test_a_piece_is_cropped_to_a_block_as_the_rows_or_columns_inside_it() -> None:
    rows = transfer.crop_piece((0, 0), (4, 6), 4, ((2, 0), (6, 6)))
    assert rows is not None and (rows.start, rows.stop, rows.whole) == ((2, 0), (4, 6), False)
    assert rows.offset == 2 * 6 * 4, "rows of a piece are one run of its bytes"
    assert rows.region == (slice(2, 4), slice(0, 6))
    columns = transfer.crop_piece((0, 0), (4, 6), 4, ((0, 0), (8, 3)))
    assert columns is not None and (columns.start, columns.stop, columns.offset) == ((0, 0), (4, 3), None)
    inside = transfer.crop_piece((4, 0), (8, 6), 4, ((4, 0), (8, 6)))
    assert inside is not None and inside.whole and inside.offset == 0
    assert transfer.crop_piece((0, 0), (4, 6), 4, ((4, 0), (8, 6))) is None, "touching is not meeting"


def block_exported(block: tuple[list[int], list[int]], pieces: list[pb.Piece]) -> pb.Exported:
    return pb.Exported(
        call_id="call", value=ref(0, 0), spec=pb.TensorSpec(shape=[8, 6], dtype="float32"),
        pieces=pieces, block=pb.Region(start=block[0], stop=block[1]),
    )


def test_pieces_cut_to_a_block_from_two_senders_assemble_into_the_block() -> None:
    array = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    block = ([2, 0], [6, 6])
    senders = {
        "h0": [pb.Piece(start=[2, 0], stop=[4, 6], nbytes=48, data=array[2:4].tobytes())],
        "h1": [pb.Piece(start=[4, 0], stop=[6, 6], nbytes=48, data=array[4:6].tobytes())],
        "h2": [],
    }
    assembler = transfer.PieceAssembler(np.zeros((4, 6), np.float32))
    done: set[str] = set()
    for sender, pieces in senders.items():
        for header, piece in transfer.exported_headers(block_exported(block, pieces), sender):
            info = transfer.check_header(header)
            assert info.held == ((2, 0), (6, 6)), "every header, a bare one too, names the block"
            kept = transfer.as_block_value(info)
            assert kept.shape == (4, 6) and not kept.whole
            if piece is not None:
                assembler.open(kept).write(piece.data)
            if kept.last_from_sender:
                done.add(sender)
    assert done == set(senders) and assembler.complete
    np.testing.assert_array_equal(assembler.target, array[2:6])


def test_a_piece_outside_the_block_its_receiver_gets_is_refused_naming_both() -> None:
    exported = block_exported(([0, 0], [4, 6]), [pb.Piece(start=[2, 0], stop=[6, 6], nbytes=96)])
    ((header, _),) = transfer.exported_headers(exported, "h0")
    with pytest.raises(transfer.TransferError, match=r"\[2, 0\]\.\.\[6, 6\] reaches outside the block \[0, 0\]\.\.\[4, 6\]"):
        transfer.check_header(header)
