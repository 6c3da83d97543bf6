"""Bulk bytes between a host's two processes go through files in shared memory.

The worker and its sidecar mount the same directory (an `emptyDir` on
/dev/shm in a pod). The worker writes the pieces of values leaving the host
(one file per piece, raw C-order bytes); the sidecar writes each value arriving
from outside as one file of the whole global array. Whoever consumes a file
deletes it. Paths travel as absolute paths so each side may use its own
directory name as long as both see the same filesystem.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np

from pathways_wire.transfer import DEFAULT_CHUNK_BYTES, Piece, error_chunk, piece_header
from pathways_wire import pathways_pb2 as pb


class ShmDir:
    """Names, writes, maps and removes this process's shared-memory files."""

    def __init__(self, path: str, prefix: str) -> None:
        self.path = os.path.abspath(path)
        self.prefix = f"{prefix}{os.getpid()}"
        self._names = itertools.count()
        os.makedirs(self.path, exist_ok=True)

    def new_path(self, what: str) -> str:
        return os.path.join(self.path, f"{self.prefix}-{next(self._names)}-{what}.bin")

    def resolve(self, path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(self.path, path)

    def write_piece(self, piece: Piece) -> str:
        path = self.new_path("piece")
        with open(path, "wb") as f:
            f.write(piece.data.reshape(-1).view(np.uint8).data)
        return path

    def create_value(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[str, np.ndarray]:
        """A new file of the value's size, mapped writable as the global array."""
        path = self.new_path("value")
        nbytes = math.prod(shape) * dtype.itemsize
        with open(path, "wb") as f:
            f.truncate(nbytes)
        if nbytes == 0:
            return path, np.zeros(shape, dtype)
        target: np.ndarray = np.memmap(path, dtype=dtype, mode="r+", shape=shape)
        return path, target

    def cleanup(self) -> None:
        """Removes this process's files; the directory itself if it is empty."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith(self.prefix):
                remove(os.path.join(self.path, name))
        try:
            os.rmdir(self.path)
        except OSError:
            pass

    def remove_tree(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class FileWriter:
    """Positional writes into a value's file (what PieceAssembler.write_at wants)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR)

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written

    def copy_from(self, source_fd: int, nbytes: int, offset: int) -> None:
        """`nbytes` from the start of another file to `offset`, copied by the
        kernel (no pages of either file mapped here)."""
        done = 0
        while done < nbytes:
            n = os.copy_file_range(source_fd, self._fd, nbytes - done, done, offset + done)
            if n <= 0:
                raise ValueError(f"the source file ended {nbytes - done} bytes early")
            done += n

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def map_value(path: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """The file as a read-only array; removing the file keeps the mapping alive."""
    if math.prod(shape) * dtype.itemsize == 0:
        return np.zeros(shape, dtype)
    size = os.path.getsize(path)
    expected = math.prod(shape) * dtype.itemsize
    if size != expected:
        raise ValueError(
            f"shared-memory file {path} has {size} bytes; {dtype.name}{list(shape)} needs {expected}"
        )
    mapped: np.ndarray = np.memmap(path, dtype=dtype, mode="r", shape=shape)
    return mapped


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def piece_file_chunks(
    header: pb.BufferHeader, path: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[pb.BufferChunk]:
    """One piece read from its file as chunks, the header on the first."""
    remaining = header.nbytes
    with open(path, "rb") as f:
        first = True
        while first or remaining > 0:
            data = f.read(min(chunk_bytes, remaining)) if remaining > 0 else b""
            if remaining > 0 and not data:
                raise ValueError(f"{path} ended {remaining} bytes early")
            chunk = pb.BufferChunk(data=data)
            if first:
                chunk.header.CopyFrom(header)
                first = False
            remaining -= len(data)
            yield chunk


def exported_chunks(
    exported: pb.Exported, sender: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[pb.BufferChunk]:
    """A value the worker exported, as this sender's chunk stream: its pieces read
    from their files (the last flagged `last_from_sender`), a bare header if the
    host holds no piece, or an error header if the value failed."""
    if exported.error:
        yield error_chunk(exported.call_id, exported.value, exported.spec, sender, exported.error)
        return
    if not exported.pieces:
        yield pb.BufferChunk(
            header=piece_header(exported.call_id, exported.value, exported.spec, None, sender, True)
        )
        return
    last = len(exported.pieces) - 1
    for i, piece in enumerate(exported.pieces):
        header = piece_header(exported.call_id, exported.value, exported.spec, None, sender, i == last)
        header.start.extend(piece.start)
        header.stop.extend(piece.stop)
        header.nbytes = piece.nbytes
        yield from piece_file_chunks(header, piece.path, chunk_bytes)


def remove_pieces(exported: pb.Exported) -> None:
    for piece in exported.pieces:
        remove(piece.path)
