"""Values arriving at a host, assembled in shared memory before the worker sees them.

Pieces come from Put streams: the client's whole program inputs, or the pieces
each host of a producer slice holds of a routed value. The first piece of a
value reserves its size in the byte budget (waiting if the store is full) and
creates one shared-memory file of the global array (a warm one from the pool,
unless a file handed over on this machine will replace it), or for a small
value (`transfer.moves_inline`) an array in memory that goes to the worker
inside its Arrival; every piece is written at its place in it. A value is complete when its whole piece arrived,
or when as many distinct senders as the call's Launch expects have sent their
last piece. A Put may overtake its Launch: the value then waits, held, until
the Launch says how many senders to count. A host that reads only a block of a
value (`PieceInfo.held`: a client input's block, or a routed value cut by the hosts
reading it) assembles just that block, and its Arrival says where it sits.
Complete values, and values a sender reported as failed, go to the worker as an `Arrival`.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pathways_wire.transfer import (
    PieceAssembler, PieceInfo, PieceWriter, TransferError, as_block_value, moves_inline, value_name,
)
from pathways_wire import pathways_pb2 as pb
from pathways_worker.shared_memory import FILE_SUFFIX, FileWriter, ShmDir, beside, remove
from pathways_worker.sidecar.byte_budget import ByteBudget
from pathways_worker.value_ref import Ref, ref_of

log = logging.getLogger(__name__)

Key = tuple[str, Ref]
RELEASED_MEMORY = 4096
ORPHAN_S = 120.0
"""How long values of a call no Launch has named are held. The controller sends a call's
launches before it tells the client where to put the inputs, so a put overtakes its
launch by the time between two connections at most; values whose call never comes
(a client that put for a call id it made up) would otherwise hold their room in the
store for good (`Inbox.orphaned`)."""


ReadInto = Callable[[memoryview], int]


class Sink(Protocol):
    """Where the bytes of one piece go: chunks from a Put stream (`write`), a
    data channel's socket reading in place (`fill`), or a file on this machine
    (`take_file`)."""

    @property
    def done(self) -> bool: ...

    def write(self, data: bytes) -> bool: ...

    def fill(self, read_into: ReadInto, bounce: memoryview) -> None: ...

    def take_file(self, path: str, device: int, inode: int, movable: bool) -> bool:
        """The piece from the file at `path` (checked to be device:inode);
        True if the file itself became the value's (moved, not copied)."""
        ...


def handover_refusal(path: str, own_dir: str) -> str:
    """Why the file a header names may not be taken over by the host whose shared-memory
    directory is `own_dir` ("" if it may).

    Only a sender on this machine names a file, and only the piece files of its own host's
    directory: a sibling of the receiver's under the machine's shared-memory root. The
    receiver reads the file, and may move it into its own directory, so whatever a holder of
    the slice's token names anywhere else is refused before it is opened: a file of another
    tree (a secret of the receiver's container), one of the receiver's own values, or a
    file that is no piece (``*.bin``). The check is on the path as written, normalized;
    `open_checked` then opens the directory and the file without following a link, so a
    sibling that is a link to elsewhere is refused too. (Resolving each path instead cost
    a few lstat calls in Python per piece, which a pipeline's many small moves felt.)"""
    if not os.path.isabs(path) or os.path.normpath(path) != path:
        return f"{path!r} is not an absolute, normalized path"
    if not path.endswith(FILE_SUFFIX):
        return f"{path} is not a piece file (*{FILE_SUFFIX})"
    own = os.path.normpath(own_dir)
    if not beside(os.path.dirname(path), own):
        return f"{path} is not in another host's shared-memory directory beside {own}"
    return ""


def open_checked(path: str, device: int, inode: int, nbytes: int, own_dir: str) -> int:
    """A read descriptor on a sender's piece file, if it may be taken (`handover_refusal`)
    and is the file it claims to be: its directory and the file itself opened without
    following links, the file a regular one. A refusal never says which file is there
    instead: that would let a sender learn a device and inode, and name the file again."""
    why = handover_refusal(path, own_dir)
    if why:
        raise TransferError("header.path", f"{why}; only another host's piece files are taken over")
    try:
        directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=directory)
        finally:
            os.close(directory)
    except OSError as err:
        raise TransferError("header.path", f"cannot open {path}: {err.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (device, inode) or st.st_size < nbytes:
        os.close(fd)
        raise TransferError(
            "header.path",
            f"{path} is not the file the sender means ({device}:{inode}, a regular file of at "
            f"least {nbytes} B) here: not the same filesystem",
        )
    return fd


class DiscardSink:
    """Swallows a piece nobody needs any more (value already failed or released)."""

    def __init__(self, nbytes: int) -> None:
        self.remaining = nbytes

    @property
    def done(self) -> bool:
        return self.remaining == 0

    def write(self, data: bytes) -> bool:
        if len(data) > self.remaining:
            raise TransferError("data", f"{len(data)} bytes beyond the piece's end")
        self.remaining -= len(data)
        return self.done

    def fill(self, read_into: ReadInto, bounce: memoryview) -> None:
        while self.remaining:
            n = read_into(bounce[: min(len(bounce), self.remaining)])
            if n <= 0:
                raise TransferError("data", f"the source ended {self.remaining} bytes early")
            self.remaining -= n

    def take_file(self, path: str, device: int, inode: int, movable: bool) -> bool:
        self.remaining = 0
        return False


@dataclass
class InboundValue:
    call_id: str
    ref: Ref
    spec: pb.TensorSpec
    path: str = ""
    target: np.ndarray | None = None
    file: FileWriter | None = None
    assembler: PieceAssembler | None = None
    reserved: int = 0
    senders_done: set[str] = field(default_factory=set)
    whole_done: bool = False
    delivered: bool = False
    spare_dir: str = ""
    in_memory: bool = False
    """A small value (`transfer.moves_inline`): assembled in memory, it goes to
    the worker inline in its Arrival, with no file."""
    block: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    """Where the block sits in the value (`spec`), when only a block of it comes."""

    @property
    def name(self) -> str:
        return f"{value_name(pb.ValueRef(node=self.ref[0], index=self.ref[1]))} of call {self.call_id}"


class InboxPiece:
    """A piece being written; tells the inbox when it is complete."""

    def __init__(self, inbox: Inbox, entry: InboundValue, info: PieceInfo, writer: PieceWriter) -> None:
        self._inbox, self._entry, self._info, self._writer = inbox, entry, info, writer
        if writer.done:
            inbox._piece_done(entry, info)

    @property
    def done(self) -> bool:
        return self._writer.done

    def write(self, data: bytes) -> bool:
        if self._writer.write(data):
            self._inbox._piece_done(self._entry, self._info)
            return True
        return False

    def fill(self, read_into: ReadInto, bounce: memoryview) -> None:
        self._writer.fill(read_into, bounce)
        self._inbox._piece_done(self._entry, self._info)

    def take_file(self, path: str, device: int, inode: int, movable: bool) -> bool:
        if not self._inbox.handover:
            raise TransferError(
                "header.path", f"host {self._inbox.host_name} takes no files over (--file-handover off); send the bytes"
            )
        fd = open_checked(path, device, inode, self._info.nbytes, self._inbox.shm_dir)
        moved = False
        try:
            offset = self._writer.file_offset
            file = self._entry.file
            if movable and self._info.nbytes == self._entry.reserved and self._entry.path:
                os.rename(path, self._entry.path)  # replaces the empty file made for the value
                self._entry.spare_dir = os.path.dirname(path)
                moved = True
                self._writer.placed()
            elif offset is not None and file is not None:
                file.copy_from(fd, self._info.nbytes, offset)
                self._writer.placed()
            else:
                self._writer.fill(lambda view: os.readv(fd, [view]))
        finally:
            os.close(fd)
        self._inbox._piece_done(self._entry, self._info)
        return moved


class Inbox:
    def __init__(
        self,
        shm: ShmDir,
        budget: ByteBudget,
        deliver: Callable[[pb.Arrival], None],
        host_name: str,
        wait_s: float,
        handover: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._shm = shm
        self.handover = handover
        """Whether a sender on this machine may name a piece file instead of sending its bytes."""
        self._budget = budget
        self._deliver = deliver
        self.host_name = host_name
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._values: dict[Key, InboundValue] = {}
        self._expects: dict[Key, int] = {}
        self._keys_of: dict[str, set[Key]] = {}
        """Each call's keys in `_values` and `_expects`, so its release touches only its own."""
        self._released: set[str] = set()
        self._released_order: deque[str] = deque()
        self._launched: set[str] = set()
        """Calls a Launch named, until they are released."""
        self._unlaunched: dict[str, float] = {}
        """Calls with values here that no Launch named yet -> when the first came (`clock`)."""
        self._clock = clock

    @property
    def shm_dir(self) -> str:
        """The shared-memory directory values are assembled in."""
        return self._shm.path

    # ------------------------------------------------------------ from the controller

    def expect(self, call_id: str, expects: Sequence[pb.Expect]) -> None:
        with self._lock:
            self._launched.add(call_id)
            self._unlaunched.pop(call_id, None)
            for e in expects:
                key = (call_id, ref_of(e.value))
                self._expects[key] = e.senders
                self._keys_of.setdefault(call_id, set()).add(key)
                entry = self._values.get(key)
                if entry is not None:
                    self._check(entry)

    def release_call(self, call_id: str) -> None:
        with self._lock:
            self._launched.discard(call_id)
            self._unlaunched.pop(call_id, None)
            self._released.add(call_id)
            self._released_order.append(call_id)
            while len(self._released_order) > RELEASED_MEMORY:
                self._released.discard(self._released_order.popleft())
            for key in self._keys_of.pop(call_id, ()):
                self._expects.pop(key, None)
                entry = self._values.pop(key, None)
                if entry is not None and not entry.delivered and entry.path:
                    self._close(entry)
                    remove(entry.path)
        self._budget.release_call(call_id)

    def orphaned(self, max_age_s: float = ORPHAN_S) -> list[str]:
        """Calls whose values came more than `max_age_s` ago and that no Launch has named:
        the caller releases them as the controller would (`Dataflow.release_orphans`)."""
        now = self._clock()
        with self._lock:
            return [call_id for call_id, since in self._unlaunched.items() if now - since > max_age_s]

    def pending(self) -> list[str]:
        with self._lock:
            return [e.name for e in self._values.values() if not e.delivered]

    # ------------------------------------------------------------ from Put streams

    def open(self, info: PieceInfo, header: pb.BufferHeader) -> Sink | None:
        """Starts a piece; returns where its data goes (None: the header carried no data).
        May wait for room in the byte budget (raises BudgetError)."""
        key: Key = (info.call_id, info.value)
        if info.error:
            self._fail(key, header)
            return None
        with self._lock:
            if info.call_id in self._released:
                return DiscardSink(info.nbytes)
            entry = self._values.get(key)
        block = info.held
        if block is not None:
            info = as_block_value(info)
        if entry is None:
            entry = self._create(key, info, header, block)
        elif entry.block != block and not entry.delivered:
            holds = f"the block {entry.block}" if entry.block else "the whole value"
            came = f"the block {block}" if block else "a piece of the whole value"
            raise TransferError(
                "header.block", f"{entry.name}: this host receives {holds}, but {came} came; "
                "the senders put either one block or the whole value on a host",
            )
        with self._lock:
            if entry.delivered or entry.assembler is None:
                return DiscardSink(info.nbytes)
            assembler = entry.assembler
        if not info.has_piece:
            self._piece_done(entry, info)
            return None
        return InboxPiece(self, entry, info, assembler.open(info))

    def _create(
        self, key: Key, info: PieceInfo, header: pb.BufferHeader,
        block: tuple[tuple[int, ...], tuple[int, ...]] | None,
    ) -> InboundValue:
        name = f"{value_name(header.value)} of call {info.call_id}"
        nbytes = info.value_nbytes
        self._budget.reserve(info.call_id, nbytes, self._wait_s, f"{name} ({header.spec.dtype}{list(info.shape)})")
        try:
            return self._make(key, info, header, block, nbytes)
        except BaseException:  # no value made: its room goes back, whatever went wrong
            self._budget.release(info.call_id, nbytes)
            raise

    def _make(
        self, key: Key, info: PieceInfo, header: pb.BufferHeader,
        block: tuple[tuple[int, ...], tuple[int, ...]] | None, nbytes: int,
    ) -> InboundValue:
        """`_create`'s value, its room in the budget reserved (and given back here where
        another sender made it first, or its call was released)."""
        with self._lock:
            existing = self._values.get(key)
            if existing is not None or info.call_id in self._released:
                self._budget.release(info.call_id, nbytes)
                if existing is not None:
                    return existing
                return InboundValue(info.call_id, key[1], header.spec, delivered=True)
            shape = list(header.spec.shape) if block else list(info.shape)
            spec = pb.TensorSpec(shape=shape, dtype=info.dtype.name)
            if moves_inline(nbytes):
                target = np.empty(info.shape, info.dtype)
                entry = InboundValue(
                    info.call_id, key[1], spec, target=target, assembler=PieceAssembler(target),
                    reserved=nbytes, in_memory=True, block=block,
                )
                self._hold(key, entry)
                return entry
            replaced = bool(header.movable and header.path) and info.nbytes == nbytes
            path, target = self._shm.create_value(info.shape, info.dtype, warm=not replaced)
            file = FileWriter(path)
            entry = InboundValue(
                call_id=info.call_id,
                ref=key[1],
                spec=spec,
                path=path,
                target=target,
                file=file,
                assembler=PieceAssembler(target, file.write_at, fill_in_place=not replaced),
                reserved=nbytes,
                block=block,
            )
            self._hold(key, entry)
            return entry

    def _hold(self, key: Key, entry: InboundValue) -> InboundValue:
        """Keeps `entry` as the value `key` (the caller holds the lock)."""
        self._values[key] = entry
        self._keys_of.setdefault(key[0], set()).add(key)
        if key[0] not in self._launched:
            self._unlaunched.setdefault(key[0], self._clock())
        return entry

    def _fail(self, key: Key, header: pb.BufferHeader) -> None:
        error = header.error
        with self._lock:
            if key[0] in self._released:
                return
            entry = self._values.get(key)
            if entry is None:
                entry = self._hold(key, InboundValue(key[0], key[1], header.spec))
            if entry.delivered:
                return
            sender = header.sender or "a sender"
            self._deliver_failure(entry, f"{error} (reported by {sender})" if sender not in error else error)

    def _piece_done(self, entry: InboundValue, info: PieceInfo) -> None:
        with self._lock:
            if info.whole:
                entry.whole_done = True
            if info.last_from_sender:
                entry.senders_done.add(info.sender)
            self._check(entry)

    # ------------------------------------------------------------ completion (lock held)

    def _check(self, entry: InboundValue) -> None:
        if entry.delivered or entry.assembler is None:
            return
        expected = self._expects.get((entry.call_id, entry.ref))
        if entry.whole_done and entry.assembler.complete:
            self._deliver_value(entry)
        elif expected is not None and len(entry.senders_done) >= expected:
            if entry.assembler.complete:
                self._deliver_value(entry)
            else:
                self._deliver_failure(
                    entry,
                    f"{entry.name} is incomplete on host {self.host_name}: senders "
                    f"{sorted(entry.senders_done)} finished but their pieces cover "
                    f"{entry.assembler.covered} of {entry.assembler.size} elements",
                )

    def _deliver_value(self, entry: InboundValue) -> None:
        data = entry.target.tobytes() if entry.in_memory and entry.target is not None else b""
        self._close(entry)
        entry.delivered = True
        arrival = pb.Arrival(
            call_id=entry.call_id, spec=entry.spec, path=entry.path, spare_dir=entry.spare_dir, data=data
        )
        if entry.block is not None:
            arrival.block_start.extend(entry.block[0])
            arrival.block_stop.extend(entry.block[1])
        arrival.value.node, arrival.value.index = entry.ref
        self._deliver(arrival)

    def _deliver_failure(self, entry: InboundValue, error: str) -> None:
        self._close(entry)
        if entry.path:
            remove(entry.path)
        if entry.reserved:
            self._budget.release(entry.call_id, entry.reserved)
            entry.reserved = 0
        entry.delivered = True
        arrival = pb.Arrival(call_id=entry.call_id, spec=entry.spec, error=error)
        arrival.value.node, arrival.value.index = entry.ref
        self._deliver(arrival)

    @staticmethod
    def _close(entry: InboundValue) -> None:
        target: Any = entry.target
        if isinstance(target, np.memmap):
            target.flush()
        if entry.file is not None:
            entry.file.close()
        entry.target = entry.file = None
        entry.assembler = None
