"""Bulk bytes between a host's two processes go through files in shared memory.

The worker and its sidecar mount the same directory (an `emptyDir` on
/dev/shm in a pod). The worker writes the pieces of values leaving the host
(one file per run of pieces, raw C-order bytes); the sidecar writes each value
arriving from outside as one file of the whole global array. Whoever consumes a
file deletes it, or leaves it as a spare for the next writer of its size. Paths
travel as absolute paths so each side may use its own directory name as long as
both see the same filesystem.

Each writer draws its files from a pool of warm ones (`WarmFiles`, planned by
`warm_pool`), whose pages were allocated off the transfer's path, and writes
them through a mapping populated in one call: one copy at memcpy speed, where a
fresh file costs a fault and a zeroed page per 4 KiB. Readers map files
populated too, and JAX adopts page-aligned blocks of such a mapping as device
buffers without copying them.

A file that goes back and forth (written here, handed over, read there, come
back as a spare) is written and read through the same two mappings each time
(`KeptMaps`): mapping 64 MiB populated and unmapping it cost 2.5 ms of a 12 ms
write, and mapping it populated to read costs about as much as one copy of it.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from pathways_wire.transfer import DEFAULT_CHUNK_BYTES, Piece, crop_piece, exported_headers
from pathways_wire import pathways_pb2 as pb
from pathways_worker.warm_pool import MIN_WARM_BYTES, WarmPlan, keep_spare

WARM_LIMIT_BYTES = 256 << 20
"""Default bound on the bytes one process keeps in warm files."""
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
MAX_KEPT_MAPS = 128
"""Mappings one `KeptMaps` keeps at most, whatever their bytes: each holds a descriptor."""
REFILL_NICENESS = 10
_SPARE = "-spare-"
FILE_SUFFIX = ".bin"
"""How every shared-memory file a host writes is named (`ShmDir.new_path`)."""
CLOSE_WAIT_S = 10.0
SWEEP_S = 0.05
"""How often at most `KeptMaps.mapping` looks for kept mappings whose files are gone:
a stat each, about 1 µs, so looking at every use cost 42 µs with 36 kept and 0.13 ms
at the bound of 128, more than copying a 1 MiB value into the mapping."""


def beside(directory: str, own_dir: str) -> bool:
    """Whether `directory` (absolute and normalized) is another host's shared-memory
    directory: a sibling of `own_dir` (the same), not `own_dir` itself. Compared as
    written: both are named from the machine's shared-memory root the same way."""
    return os.path.dirname(directory) == os.path.dirname(own_dir) and directory != own_dir


class KeptMaps:
    """Populated mappings of files that come back, kept so the next use of the same file
    skips mapping it again: at most `limit_bytes` of them and `MAX_KEPT_MAPS`, the oldest
    let go first.

    A file goes back and forth between a writer and a reader on one machine (written,
    handed over, read, come back as a spare), so both sides keep theirs: mapping 64 MiB
    populated costs about as much as copying it once, and unmapping it more on top.
    `writable`: mapped for writing (a writer's), else read-only (a reader's).

    Each is kept with an open descriptor, so its inode cannot be reused while it is
    kept and a file at the same path with the same inode is the same file. One whose
    file this process removed is let go at once (`let_go`); one whose file another
    process removed, at the first use `SWEEP_S` or more after the last look, so it pins
    no pages for long; one still exported to an array is unmapped when the array goes. A
    mapping larger than `limit_bytes` alone is not kept: it is the caller's, unmapped when
    the arrays over it go."""

    def __init__(self, limit_bytes: int, writable: bool = True) -> None:
        self._limit = limit_bytes
        self._writable = writable
        self._lock = threading.Lock()
        self._kept: dict[int, tuple[int, mmap.mmap]] = {}  # inode -> (descriptor, mapping), oldest first
        self._next_sweep = 0.0

    def mapping(self, path: str, nbytes: int) -> mmap.mmap:
        """A populated mapping of the file of exactly `nbytes` at `path`, kept for next time."""
        st = os.stat(path)
        if not self._writable and st.st_size != nbytes:
            raise ValueError(f"shared-memory file {path} has {st.st_size} bytes; {nbytes} are expected")
        with self._lock:
            now = time.monotonic()
            if now >= self._next_sweep:
                self._next_sweep = now + SWEEP_S
                self._let_go(lambda fd, mapped: os.fstat(fd).st_nlink == 0)
            kept = self._kept.pop(st.st_ino, None)
            if kept is not None and len(kept[1]) == nbytes and os.path.samestat(os.fstat(kept[0]), st):
                self._kept[st.st_ino] = kept  # now the newest
                return kept[1]
            if kept is not None:
                _close_kept(*kept)
        fd = os.open(path, os.O_RDWR if self._writable else os.O_RDONLY)
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if self._writable else 0)
            mapped = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | _POPULATE, prot=prot)
        except BaseException:
            os.close(fd)
            raise
        if nbytes > self._limit:  # over the bound alone: the caller's, never closed under it
            os.close(fd)  # the mapping holds a descriptor of its own
            return mapped
        with self._lock:
            self._kept[st.st_ino] = (fd, mapped)
            total = sum(len(m) for _, m in self._kept.values())
            for inode in list(self._kept):
                if total <= self._limit and len(self._kept) <= MAX_KEPT_MAPS:
                    break
                total -= len(self._kept[inode][1])
                _close_kept(*self._kept.pop(inode))
        return mapped

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(len(m) for _, m in self._kept.values())

    def let_go(self, inode: int) -> None:
        """Lets go now of the mapping of a file this process removed (by the inode it had),
        pinning its pages no longer.

        Called from a value's finalizer, which may run on any thread at any point,
        this one's included while it holds the lock: then it leaves it to a later
        `mapping`'s look, instead of waiting for itself."""
        if not self._lock.acquire(blocking=False):
            self._next_sweep = 0.0
            return
        try:
            kept = self._kept.get(inode)
            if kept is not None and os.fstat(kept[0]).st_nlink == 0:
                _close_kept(*self._kept.pop(inode))
        finally:
            self._lock.release()

    def _let_go(self, gone: Callable[[int, mmap.mmap], bool]) -> None:
        for inode in [i for i, (fd, m) in self._kept.items() if gone(fd, m)]:
            _close_kept(*self._kept.pop(inode))

    def close(self) -> None:
        with self._lock:
            self._let_go(lambda fd, mapped: True)


def _close_kept(fd: int, mapped: mmap.mmap) -> None:
    try:
        mapped.close()
    except BufferError:
        pass  # an array still reads it: unmapped when the last such array goes
    os.close(fd)


class WarmFiles:
    """Warm files of a `ShmDir`, made on a thread of their own as the plan says."""

    def __init__(self, shm: ShmDir, limit_bytes: int) -> None:
        self._shm = shm
        self._plan = WarmPlan(limit_bytes)
        self._files: dict[int, list[str]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def take(self, nbytes: int) -> str | None:
        """A warm file of exactly `nbytes` (now the caller's): a spare if there
        is one, else one of the pool's; or None."""
        spare = self._shm.claim_spare(nbytes) if nbytes >= MIN_WARM_BYTES else None
        with self._lock:
            if self._closed:
                return spare
            warm = self._plan.take(nbytes, spare=spare is not None)
            path = spare if spare is not None else self._files[nbytes].pop() if warm else None
            if self._thread is None and nbytes >= MIN_WARM_BYTES:
                self._thread = threading.Thread(target=self._refill, name="warm-files", daemon=True)
                self._thread.start()
        self._wake.set()
        return path

    def _refill(self) -> None:
        """Makes warm files at a lower priority: on a busy machine the transfers
        they are for come first."""
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), REFILL_NICENESS)
        except (AttributeError, OSError):
            pass
        while True:
            self._wake.wait()
            self._wake.clear()
            while True:
                with self._lock:
                    if self._closed:
                        return
                    for nbytes in self._plan.unwanted():
                        remove(self._files[nbytes].pop())
                    nbytes_next = self._plan.next_to_make()
                if nbytes_next is None:
                    break
                path = self._shm.new_path("warm")
                ok = _allocate(path, nbytes_next)
                with self._lock:
                    self._plan.made(nbytes_next, ok)
                    if ok and not self._closed:
                        self._files.setdefault(nbytes_next, []).append(path)
                    else:
                        remove(path)

    def close(self) -> None:
        """Stops making files (waiting for one being made) and removes the warm ones."""
        with self._lock:
            self._closed = True
            paths = [p for files in self._files.values() for p in files]
            self._files.clear()
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_WAIT_S)
        for path in paths:
            remove(path)


def _write_pieces(mapped: mmap.mmap, pieces: list[Piece]) -> None:
    """Pieces one after another from the start of the mapping."""
    target = np.frombuffer(mapped, np.uint8)
    offset = 0
    for piece in pieces:
        n = piece.data.nbytes
        target[offset : offset + n] = piece.data.reshape(-1).view(np.uint8)
        offset += n
    del target  # a mapping with a live export cannot be closed


def _allocate(path: str, nbytes: int) -> bool:
    """A file of `nbytes` whose pages exist and are zeroed already: tmpfs
    allocates pages on `fallocate` but zeroes each only on its first fault, so
    a populated mapping faults them all in now, off the transfer's path."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, nbytes)
            mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | _POPULATE).close()
        finally:
            os.close(fd)
        return True
    except (OSError, ValueError):
        return False


class ShmDir:
    """Names, writes, maps and removes this process's shared-memory files."""

    def __init__(self, path: str, prefix: str, warm_limit_bytes: int = WARM_LIMIT_BYTES) -> None:
        self.path = os.path.abspath(path)
        self.prefix = f"{prefix}{os.getpid()}"
        self._names = itertools.count()
        os.makedirs(self.path, exist_ok=True)
        self.warm_limit = warm_limit_bytes
        self.warm = WarmFiles(self, warm_limit_bytes)
        self.maps = KeptMaps(warm_limit_bytes)
        self.read_maps = KeptMaps(warm_limit_bytes, writable=False)

    def new_path(self, what: str) -> str:
        return os.path.join(self.path, f"{self.prefix}-{next(self._names)}-{what}{FILE_SUFFIX}")

    def new_file(self, what: str, nbytes: int, warm: bool = True) -> str:
        """A file of `nbytes` for a writer: a warm one renamed for `what` if the
        pool has one, else a fresh (sparse) one."""
        path = self.new_path(what)
        warm_path = self.warm.take(nbytes) if warm else None
        if warm_path is not None:
            os.rename(warm_path, path)
            return path
        with open(path, "wb") as f:
            f.truncate(nbytes)
        return path

    def write_run(self, pieces: list[Piece]) -> str:
        """Pieces that follow each other in C order (`transfer.piece_runs`) as one file."""
        nbytes = sum(p.data.nbytes for p in pieces)
        path = self.new_file("piece", nbytes)
        if nbytes == 0:
            return path
        if nbytes >= MIN_WARM_BYTES:  # it may come back as a spare: keep its mapping
            _write_pieces(self.maps.mapping(path, nbytes), pieces)
            return path
        fd = os.open(path, os.O_RDWR)
        try:
            with mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | _POPULATE) as mapped:
                _write_pieces(mapped, pieces)
        finally:
            os.close(fd)
        return path

    def resolve(self, path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(self.path, path)

    def own_file(self, path: str) -> str:
        """`path` (relative: in this directory) where it names a value file (``*.bin``)
        of this directory itself, as every file its sidecar hands the worker does; a
        ValueError naming it otherwise, so an Arrival never maps, and later removes or
        moves, a file elsewhere. The path is checked as written, normalized: the sidecar
        names its files from the same ``--shm-dir``."""
        full = os.path.normpath(self.resolve(path))
        if not full.endswith(FILE_SUFFIX) or os.path.dirname(full) != self.path:
            raise ValueError(f"{path} is not a value file of this host's shared-memory directory {self.path}")
        return full

    def sibling_dir(self, directory: str) -> str:
        """`directory` where it is another host's shared-memory directory beside this one
        (where a file handed over from it goes back as a spare); a ValueError otherwise."""
        named = os.path.normpath(directory)
        if not os.path.isabs(named) or not beside(named, self.path):
            raise ValueError(f"{directory} is not another host's shared-memory directory beside {self.path}")
        return named

    def recycle_pieces(self, exported: pb.Exported) -> None:
        """The piece files of a value sent on: kept as spares for the next
        writer of their size (their pages are warm), or removed."""
        for piece in exported.pieces:
            if piece.path:
                self.recycle(piece.path, piece.nbytes)

    def recycle(self, path: str, nbytes: int, into: str = "") -> None:
        """A file done with: kept as a spare (in this directory, or `into`
        another host's on this machine) if the plan says so, else removed."""
        if nbytes < MIN_WARM_BYTES:  # never a spare, and never mapped to be kept
            remove(path)
            return
        directory = into or self.path
        sizes = [int(n.rsplit(_SPARE, 1)[1][: -len(".bin")]) for n in self._spares(None, directory)]
        if keep_spare(nbytes, sizes.count(nbytes), sum(sizes), self.warm_limit):
            name = f"{self.prefix}-{next(self._names)}{_SPARE}{nbytes}.bin"
            try:
                os.rename(path, os.path.join(directory, name))
                return
            except OSError:
                pass
        try:
            inode = os.stat(path).st_ino
        except OSError:
            inode = -1
        remove(path)
        self.maps.let_go(inode)
        self.read_maps.let_go(inode)

    def map_arrived(
        self, path: str, shape: tuple[int, ...], dtype: np.dtype[Any], spare_dir: str = ""
    ) -> np.ndarray:
        """An arrived value mapped (`map_value`); its file is recycled once the
        array, and every view of it that JAX adopted, is gone: as a spare of
        the host whose file it was (`spare_dir`, on this machine), else here.
        A file that may come back (a spare's size) is mapped through `read_maps`,
        so when it does it is read through the same mapping."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < MIN_WARM_BYTES:
            value = _map(path, shape, dtype)[0]
            remove(path)
            return value
        # The array over the whole mapping is what every view of the value (and so every
        # array JAX adopted from one) keeps alive: numpy folds a view's base down to it,
        # not further, since its own base is a memoryview. It holds that memoryview's export
        # of the mapping, so a kept mapping evicted meanwhile is unmapped only after it.
        lease = np.frombuffer(self.read_maps.mapping(path, nbytes), np.uint8)
        weakref.finalize(lease, self.recycle, path, nbytes, spare_dir)
        return lease.view(dtype).reshape(shape)

    def claim_spare(self, nbytes: int) -> str | None:
        """A spare of `nbytes`, renamed so no other process can claim it too."""
        for name in self._spares(nbytes):
            claimed = self.new_path("claimed")
            try:
                os.rename(os.path.join(self.path, name), claimed)
            except FileNotFoundError:
                continue
            return claimed
        return None

    def _spares(self, nbytes: int | None = None, directory: str = "") -> list[str]:
        suffix = f"{_SPARE}{nbytes}.bin" if nbytes is not None else ".bin"
        try:
            return [n for n in os.listdir(directory or self.path) if _SPARE in n and n.endswith(suffix)]
        except FileNotFoundError:
            return []

    def write_piece(self, piece: Piece) -> str:
        return self.write_run([piece])

    def create_value(
        self, shape: tuple[int, ...], dtype: np.dtype[Any], warm: bool = True
    ) -> tuple[str, np.ndarray]:
        """A file of the value's size, mapped writable as the global array.
        `warm`: the bytes will be written here, so the file comes from the pool
        and its mapping is populated at once; otherwise it is mapped lazily."""
        nbytes = math.prod(shape) * dtype.itemsize
        path = self.new_file("value", nbytes, warm=warm)
        if nbytes == 0:
            return path, np.zeros(shape, dtype)
        if not warm:
            target: np.ndarray = np.memmap(path, dtype=dtype, mode="r+", shape=shape)
            return path, target
        if nbytes >= MIN_WARM_BYTES:  # it may come back as a spare: keep its mapping
            return path, np.frombuffer(self.maps.mapping(path, nbytes), dtype).reshape(shape)
        fd = os.open(path, os.O_RDWR)
        try:
            mapped = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | _POPULATE)
        finally:
            os.close(fd)
        return path, np.frombuffer(mapped, dtype).reshape(shape)

    def cleanup(self) -> None:
        """Removes this process's files and the directory's spares (whoever
        left them); the directory itself if it is empty."""
        self.warm.close()
        self.maps.close()
        self.read_maps.close()
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith(self.prefix) or _SPARE in name:
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
    """The file as a read-only array; removing the file keeps the mapping alive.

    The mapping is populated in one call (faulting 4 KiB at a time as a
    computation reads it costs more), and it is page-aligned, so JAX on CPU
    adopts its blocks as device buffers instead of copying them."""
    return _map(path, shape, dtype)[0]


def _map(path: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[np.ndarray, mmap.mmap | None]:
    expected = math.prod(shape) * dtype.itemsize
    if expected == 0:
        return np.zeros(shape, dtype), None
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size != expected:
            raise ValueError(
                f"shared-memory file {path} has {size} bytes; {dtype.name}{list(shape)} needs {expected}"
            )
        mapped = mmap.mmap(fd, expected, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return np.frombuffer(mapped, dtype).reshape(shape), mapped


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def piece_file_chunks(
    header: pb.BufferHeader, path: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, offset: int = 0
) -> Iterator[pb.BufferChunk]:
    """One piece read from its file (from `offset`) as chunks, the header on the first."""
    remaining = header.nbytes
    with open(path, "rb") as f:
        f.seek(offset)
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
    """A value the worker exported, as this sender's chunk stream (`exported_headers`),
    its pieces read from their files or sent from their inline bytes."""
    for header, piece in exported_headers(exported, sender):
        if piece is None:
            yield pb.BufferChunk(header=header)
        elif piece.path:
            yield from piece_file_chunks(header, piece.path, chunk_bytes, piece.offset)
        else:
            yield from _inline_chunks(header, piece.data, chunk_bytes)


def cropped_to(exported: pb.Exported, block: pb.Region) -> pb.Exported:
    """The copy of an exported value for a destination that reads only `block` of it
    (empty: the whole value, which gets `exported` itself): each piece's part inside the
    block, a piece outside it left out. A part that is one run of its piece's bytes stays
    in the piece's file, from an offset; any other gets bytes of its own."""
    if exported.error or not (block.start or block.stop):
        return exported
    out = pb.Exported(call_id=exported.call_id, token=exported.token)
    out.value.CopyFrom(exported.value)
    out.spec.CopyFrom(exported.spec)
    out.block.CopyFrom(block)
    bounds = (tuple(block.start), tuple(block.stop))
    for piece in exported.pieces:
        start, stop = tuple(piece.start), tuple(piece.stop)
        shape = tuple(b - a for a, b in zip(start, stop, strict=True))
        itemsize = piece.nbytes // max(math.prod(shape), 1)
        crop = crop_piece(start, stop, itemsize, bounds)
        if crop is None:
            continue
        if crop.whole:
            out.pieces.append(piece)
            continue
        nbytes = math.prod(b - a for a, b in zip(crop.start, crop.stop, strict=True)) * itemsize
        part = pb.Piece(start=crop.start, stop=crop.stop, nbytes=nbytes)
        if crop.offset is not None and piece.path:
            part.path, part.offset = piece.path, piece.offset + crop.offset
        elif crop.offset is not None:
            part.data = piece.data[crop.offset : crop.offset + nbytes]
        else:
            part.data = _piece_bytes(piece, shape, itemsize)[crop.region].tobytes()
        out.pieces.append(part)
    return out


def _piece_bytes(piece: pb.Piece, shape: tuple[int, ...], itemsize: int) -> np.ndarray:
    """A piece's bytes as an array of its shape (plus one axis of each element's bytes)."""
    full = (*shape, itemsize)
    if not piece.path:
        return np.frombuffer(piece.data, np.uint8).reshape(full)
    return np.memmap(piece.path, np.uint8, mode="r", offset=piece.offset, shape=full)


def _inline_chunks(header: pb.BufferHeader, data: bytes, chunk_bytes: int) -> Iterator[pb.BufferChunk]:
    """A piece that left the worker inline, as chunks, the header on the first."""
    view = memoryview(data)
    yield pb.BufferChunk(header=header, data=bytes(view[:chunk_bytes]))
    for at in range(chunk_bytes, len(view), chunk_bytes):
        yield pb.BufferChunk(data=bytes(view[at : at + chunk_bytes]))


def remove_pieces(exported: pb.Exported) -> None:
    for piece in exported.pieces:
        if piece.path:
            remove(piece.path)
