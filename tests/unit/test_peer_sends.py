"""Which pushed values a sidecar sends on the thread that got them from the worker."""

from __future__ import annotations

from pathways_wire import pathways_pb2 as pb
from pathways_worker.sidecar.peers import sends_at_once


def test_values_whose_pieces_are_all_inline_are_sent_at_once() -> None:
    inline = pb.Exported(pieces=[pb.Piece(nbytes=4, data=b"abcd"), pb.Piece(nbytes=0)])
    assert sends_at_once(inline)
    assert sends_at_once(pb.Exported(error="the producer failed"))


def test_a_value_with_a_piece_file_goes_to_the_pool() -> None:
    mixed = pb.Exported(pieces=[pb.Piece(nbytes=4, data=b"abcd"), pb.Piece(path="/dev/shm/x", nbytes=8)])
    assert not sends_at_once(mixed)


def test_a_large_value_of_inline_bytes_goes_to_the_pool() -> None:
    """Parts of pieces cut to a destination's block carry their bytes inline at any size."""
    large = pb.Exported(pieces=[pb.Piece(nbytes=1 << 20, data=bytes(1 << 20))])
    assert not sends_at_once(large)
