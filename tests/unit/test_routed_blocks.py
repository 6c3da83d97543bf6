"""What a producer host sends a destination that reads only a block of a routed value
(`shared_memory.cropped_to`): its pieces' parts inside the block, from their files where
a part is one run of a file's bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pathways_wire import pathways_pb2 as pb
from pathways_worker.shared_memory import cropped_to, exported_chunks

VALUE = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)


def exported(*pieces: pb.Piece) -> pb.Exported:
    return pb.Exported(
        call_id="call", value=pb.ValueRef(node=0, index=0),
        spec=pb.TensorSpec(shape=[8, 6], dtype="float32"), pieces=pieces,
    )


def region(start: list[int], stop: list[int]) -> pb.Region:
    return pb.Region(start=start, stop=stop)


def part_bytes(piece: pb.Piece) -> bytes:
    if not piece.path:
        return piece.data
    with open(piece.path, "rb") as f:
        f.seek(piece.offset)
        return f.read(piece.nbytes)


def test_a_destination_reading_the_whole_value_gets_the_export_itself() -> None:
    value = exported(pb.Piece(start=[0, 0], stop=[4, 6], nbytes=96, data=VALUE[:4].tobytes()))
    assert cropped_to(value, pb.Region()) is value


def test_rows_of_a_piece_file_stay_in_the_file_from_an_offset(tmp_path: Path) -> None:
    path = tmp_path / "rows"
    path.write_bytes(VALUE[4:].tobytes())
    value = exported(pb.Piece(start=[4, 0], stop=[8, 6], nbytes=96, path=str(path)))
    copy = cropped_to(value, region([6, 0], [8, 6]))
    (part,) = copy.pieces
    assert (list(part.start), list(part.stop), part.path, part.offset) == ([6, 0], [8, 6], str(path), 48)
    assert part_bytes(part) == VALUE[6:8].tobytes()
    assert list(copy.block.start) == [6, 0] and list(copy.block.stop) == [8, 6]


def test_columns_of_a_piece_get_bytes_of_their_own(tmp_path: Path) -> None:
    path = tmp_path / "top"
    path.write_bytes(VALUE[:4].tobytes())
    value = exported(
        pb.Piece(start=[0, 0], stop=[4, 6], nbytes=96, path=str(path)),
        pb.Piece(start=[4, 0], stop=[8, 6], nbytes=96, data=VALUE[4:].tobytes()),
    )
    copy = cropped_to(value, region([0, 3], [8, 6]))
    assert [(list(p.start), list(p.stop), p.path) for p in copy.pieces] == [
        ([0, 3], [4, 6], ""), ([4, 3], [8, 6], ""),
    ]
    assert [part_bytes(p) for p in copy.pieces] == [VALUE[:4, 3:].tobytes(), VALUE[4:, 3:].tobytes()]


def test_a_host_with_no_piece_in_the_block_still_says_it_has_nothing() -> None:
    value = exported(pb.Piece(start=[0, 0], stop=[4, 6], nbytes=96, data=VALUE[:4].tobytes()))
    copy = cropped_to(value, region([4, 0], [8, 6]))
    assert not copy.pieces
    (chunk,) = exported_chunks(copy, "h0")
    header = chunk.header
    assert header.last_from_sender and not header.nbytes
    assert (list(header.block_start), list(header.block_stop)) == ([4, 0], [8, 6])
