"""The data channel's two ends on a host: receiving values, and pushing them to peers.

Python gRPC streaming reaches about a third of raw loopback TCP here (every
1 MiB chunk is a protobuf, copied four times), so routed values, and the inputs
clients put, travel on a plain socket instead (`pathways_wire.data_frames`: the
frames, and a sender's connection). Each sidecar listens on a data port next to
its gRPC port and advertises it in `HealthReply.data_address`; gRPC `Put` stays
as the fallback when a host has no data channel.

A connection starts with a `DataHello` frame (sender, and the receiving slice's
token, its client form `slice_token.client_token`, which clients hold, or its route
form `slice_token.route_token`, which the senders of cross-slice routes hold; compared
in constant time; a hello without one is refused), whole within
`session_frames.HELLO_TIMEOUT_S`; at most `port_connections.MAX_PENDING_HELLOS` connections
await theirs at once, and at most `port_connections.MAX_SERVED` are served, of which at
most `port_connections.MAX_CLIENTS_SERVED` are clients': the rest stays for the route
senders and the slice's own hosts. A connection past a bound is answered `BUSY`, and a
client then puts over gRPC. A server is made
without a token only for a host started with ``--insecure-no-token``.
Then each value is a run of piece frames, exactly what a Put stream would
carry: a `BufferHeader` (validated by `transfer.check_header`, like Put's)
followed by the piece's `nbytes` raw bytes, which the sender sends straight
from a mapping of the worker's piece file (`send_file`), or for a small piece that
left the worker inline in the same write as its header, and the receiver
reads straight into the value (a shared-memory file, or for a small value
memory: `inbox`). After the sender's last piece of
a value the receiver answers with a `PutReply` (an `error` and gRPC-style
`code` if something was wrong). A malformed frame gets such an answer naming
the field, and the connection is closed; the receiver keeps serving others.
A client's `FetchRequest` frame gets this host's pieces of the value back on the
same connection (`Fetcher`: the worker exports them, as for gRPC `Fetch`), sent
from their files and then removed.

On one machine the bytes need not travel at all. When the peer's advertised
node (boot id) and shared-memory device match the sender's, a header carries
the piece file's `path` (and its device and inode, which the receiver checks,
so a same-named file elsewhere is never taken). The receiver takes only a piece file
of another host's shared-memory directory beside its own, never a link, and nothing
while its file handover is off (`inbox.handover_refusal`): a holder of the slice's
token could otherwise name any file the sidecar can read. It copies the file into
the value's file in the kernel, or, when the piece is the whole value and has
no other destination (`movable`), renames the file itself into place.

Every read and write has a timeout.
"""

from __future__ import annotations

import hmac
import logging
import mmap
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from pathways_wire.data_frames import (
    BUSY,
    FETCH,
    HELLO,
    PIECE,
    REPLY,
    DataChannelError,
    DataConnection,
    read_frame,
    send_frame,
)
from pathways_wire import host_port
from pathways_wire.port_connections import (
    MAX_CLIENTS_SERVED, MAX_SERVED, accept_each, awaiting_hello, clients_served, served,
)
from pathways_wire.session_frames import read_hello, shut
from pathways_wire.slice_token import client_token, route_token
from pathways_wire.transfer import TransferError, check_header, exported_headers
from pathways_wire import pathways_pb2 as pb
from pathways_worker.shared_memory import KeptMaps, remove_pieces
from pathways_worker.warm_pool import MIN_WARM_BYTES
from pathways_worker.sidecar.byte_budget import BudgetError
from pathways_worker.sidecar.inbox import Inbox, Sink
from pathways_worker.sidecar.transfer_stats import TransferStats

log = logging.getLogger(__name__)

BOUNCE_BYTES = 4 << 20
FRAME_TIMEOUT_S = 60.0
"""Longest silence inside a frame or a piece's bytes."""
REFUSE_DRAIN_S = 1.0
IDLE_TIMEOUT_S = 300.0
"""An idle connection is closed after this; the sender opens a new one."""


def boot_id() -> str:
    """This kernel's identity: two processes with the same one share a machine."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


# ---------------------------------------------------------------- receiving


@dataclass(frozen=True)
class Refusal:
    """Why a fetch gets nothing: a gRPC status code's name, and the reason."""

    code: str
    message: str


Fetcher = Callable[[pb.FetchRequest], "pb.Exported | Refusal"]
"""This host's pieces of a value a client fetches (their files the server's to send and
remove), or why there are none: `Dataflow.fetched`."""


class DataChannelServer:
    """Accepts data connections and feeds their pieces to the inbox."""

    def __init__(
        self, host: str, port: int, inbox: Inbox, host_name: str, token: str = "",
        transfers: TransferStats | None = None, *, insecure: bool = False,
        fetch: Fetcher | None = None,
    ) -> None:
        if not token and not insecure:
            raise ValueError(
                f"host {host_name}: refusing to open a data channel without a slice token "
                "(pass --insecure-no-token to check no sender)"
            )
        self._inbox = inbox
        self._fetch = fetch
        self._transfers = transfers or TransferStats()
        self._host_name = host_name
        self._token = token
        self._tokens = (token.encode(), client_token(token).encode(), route_token(token).encode())
        """What a hello may present: the slice token, its client form, or its route form."""
        self._listener = socket.create_server((host, port), family=host_port.family(host), backlog=64)
        self._closed = threading.Event()
        self.port = int(self._listener.getsockname()[1])
        self._pending = awaiting_hello(f"host {host_name}: data channel")
        self._served = served(f"host {host_name}: data channel")
        self._clients = clients_served(f"host {host_name}: data channel")
        threading.Thread(
            target=accept_each, args=(self._listener, self._pending, self._serve, "data-conn", self._closed.is_set),
            name="data-accept", daemon=True,
        ).start()

    @property
    def served(self) -> int:
        """Connections served now, their hello passed."""
        return self._served.held

    def close(self) -> None:
        self._closed.set()
        shut(self._listener)  # wakes the accept loop
        self._listener.close()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        """Serves a sender's connection once its hello presents a token; the room it took
        among the connections awaiting their hello goes back once the hello is read, whole
        within `HELLO_TIMEOUT_S`. Past `MAX_SERVED` connections served, or a client's past
        `MAX_CLIENTS_SERVED` clients' connections, one is refused (`BUSY`)."""
        with conn:
            try:
                hello = pb.DataHello()
                try:
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    read_hello(conn, lambda: read_frame(conn, HELLO, hello))
                finally:
                    self._pending.give_back()
                conn.settimeout(FRAME_TIMEOUT_S)
                presented = hello.token.encode()
                own, client, route = (
                    (hmac.compare_digest(presented, t) for t in self._tokens) if self._token else (True, False, False)
                )
                if not (own or client or route):
                    what = "presented another token" if hello.token else "presented no token"
                    raise TransferError(
                        "hello.token", f"sender {hello.sender or peer!r} {what}; only holders of this slice's token may send"
                    )
                busy = self._admit(client)
                if busy:
                    self._refuse(conn, BUSY, f"host {self._host_name}: {busy}; send on one of yours, over gRPC, "
                                             "or once one has closed")
                    return
                try:
                    bounce = memoryview(bytearray(BOUNCE_BYTES))
                    while self._value(conn, bounce, may_fetch=not route):
                        pass
                finally:
                    self._served.give_back()
                    if client:
                        self._clients.give_back()
            except TransferError as err:
                self._refuse(conn, "INVALID_ARGUMENT", f"host {self._host_name}: {err}")
            except BudgetError as err:
                self._refuse(conn, "RESOURCE_EXHAUSTED", f"host {self._host_name}: {err}")
            except (OSError, ConnectionError) as err:
                log.info("data connection from %s ended: %s", peer, err)
            except Exception as err:  # a bug, or an input no check foresaw: this sender's end only
                log.exception("data connection from %s failed", peer)
                self._refuse(conn, "INTERNAL", f"host {self._host_name}: {type(err).__name__}: {err}")

    def _admit(self, client: bool) -> str:
        """Takes room for one more connection served (and a client's among the clients'),
        or says which bound is reached ("" once admitted)."""
        if client and not self._clients.take():
            return (f"{MAX_CLIENTS_SERVED} clients' connections are served here already, the rest being "
                    "kept for the routes into its slice")
        if not self._served.take():
            if client:
                self._clients.give_back()
            return f"{MAX_SERVED} connections are served here already"
        return ""

    def _value(self, conn: socket.socket, bounce: memoryview, may_fetch: bool = True) -> bool:
        """Receives one value's pieces from this sender and answers; False at a clean end.
        A route sender (`may_fetch` False) only sends: its fetch is refused."""
        pieces = 0
        while True:
            conn.settimeout(IDLE_TIMEOUT_S if pieces == 0 else FRAME_TIMEOUT_S)
            try:
                head = conn.recv(1, socket.MSG_PEEK)
            except TimeoutError:
                return False
            if not head:
                if pieces:
                    raise TransferError("data", "the connection closed inside a value")
                return False
            conn.settimeout(FRAME_TIMEOUT_S)
            if head[0] == FETCH and not pieces:
                if not may_fetch:
                    raise TransferError("fetch", "a route's token opens sending values only, not fetching them")
                self._answer_fetch(conn)
                return True
            header = pb.BufferHeader()
            read_frame(conn, PIECE, header)
            info = check_header(header)
            sink = self._inbox.open(info, header)
            pieces += int(info.has_piece)
            if sink is not None:
                self._receive(conn, sink, header, bounce)
                self._transfers.add("in", "handover" if header.path else "data-channel", header.nbytes)
            if info.last_from_sender or info.whole or info.error:
                send_frame(conn, REPLY, pb.PutReply(pieces=pieces))
                return True

    def _answer_fetch(self, conn: socket.socket) -> None:
        """A client's fetch: a `PutReply` saying how many piece frames follow (or why
        none do), then this host's pieces of the value, as a Fetch stream would carry."""
        request = pb.FetchRequest()
        read_frame(conn, FETCH, request)
        if self._fetch is None:
            send_frame(conn, REPLY, pb.PutReply(
                error=f"host {self._host_name}: fetch over the data channel is not served here; use gRPC Fetch",
                code="UNIMPLEMENTED",
            ))
            return
        found = self._fetch(request)
        if isinstance(found, Refusal):
            send_frame(conn, REPLY, pb.PutReply(error=found.message, code=found.code))
            return
        try:
            headers = list(exported_headers(found, self._host_name))
            send_frame(conn, REPLY, pb.PutReply(pieces=len(headers)))
            send_headers(conn, headers)
            self._transfers.add("out", "data-channel", sum(p.nbytes for p in found.pieces))
        finally:
            remove_pieces(found)

    @staticmethod
    def _receive(conn: socket.socket, sink: Sink, header: pb.BufferHeader, bounce: memoryview) -> None:
        if header.path:
            sink.take_file(header.path, header.file_device, header.file_inode, header.movable)
        else:
            sink.fill(conn.recv_into, bounce)

    @staticmethod
    def _refuse(conn: socket.socket, code: str, message: str) -> None:
        """Answers with the error, then closes; what the sender still sends is
        drained for a moment so the answer is not lost to a reset."""
        log.warning("data channel: %s", message)
        try:
            send_frame(conn, REPLY, pb.PutReply(error=message, code=code))
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(REFUSE_DRAIN_S)
            scratch = bytearray(1 << 16)
            deadline = time.monotonic() + REFUSE_DRAIN_S
            while time.monotonic() < deadline and conn.recv_into(scratch):
                pass
        except OSError:
            pass


# ---------------------------------------------------------------- sending


@dataclass(frozen=True)
class PeerData:
    """What a sender knows of a peer's data channel (from its HealthReply)."""

    address: str
    same_node: bool


class DataLink(DataConnection):
    """One open connection to a peer's data channel, used by one push at a time;
    `maps`: where piece files are read from (`send_file`)."""

    def __init__(
        self, address: str, sender: str, token: str, timeout_s: float, maps: KeptMaps | None = None
    ) -> None:
        super().__init__(address, sender, token, timeout_s)
        self.maps = maps

    def send(self, exported: pb.Exported, handover: bool, movable: bool) -> int:
        """Sends one value (its pieces' bytes, or on one machine their files) and
        waits for the receiver's answer; returns the pieces it received."""
        return self.answered(lambda: self.send_exported(exported, handover, movable))

    def send_exported(self, exported: pb.Exported, handover: bool, movable: bool) -> None:
        """The value's frames, without waiting for the answer (`answer`)."""
        send_exported(self.sock, exported, self.sender, handover, movable, self.maps)


def send_exported(
    sock: socket.socket, exported: pb.Exported, sender: str, handover: bool = False, movable: bool = False,
    maps: KeptMaps | None = None,
) -> None:
    """An exported value's piece frames, each followed by its bytes; on one machine
    (`handover`) a piece that starts its file goes as the file's path instead, the
    file itself given over (`movable`) when it is the whole value's only piece."""
    send_headers(sock, exported_headers(exported, sender), handover, movable and len(exported.pieces) == 1, maps)


def send_headers(
    sock: socket.socket, headers: Iterable[tuple[pb.BufferHeader, pb.Piece | None]],
    handover: bool = False, movable: bool = False, maps: KeptMaps | None = None,
) -> None:
    """Piece frames (`transfer.exported_headers`), each followed by its bytes or, with
    `handover`, naming its file (`send_exported`)."""
    for header, piece in headers:
        path = piece.path if piece is not None else ""
        if path and handover and not piece_offset(piece):
            st = os.stat(path)
            header.path, header.file_device, header.file_inode = path, st.st_dev, st.st_ino
            header.movable = movable
            send_frame(sock, PIECE, header)
        elif piece is not None and not path:
            send_frame(sock, PIECE, header, piece.data)
        else:
            send_frame(sock, PIECE, header)
            send_file(sock, path, header.nbytes, piece_offset(piece), maps)


def piece_offset(piece: pb.Piece | None) -> int:
    """Where a piece's bytes start in its file: a piece cropped to a destination's block
    starts past the beginning, so it goes as bytes rather than as the file."""
    return piece.offset if piece is not None else 0


def send_file(
    sock: socket.socket, path: str, nbytes: int, offset: int = 0, maps: KeptMaps | None = None
) -> None:
    """`nbytes` of a piece file from `offset`, written to the socket from a mapping of it:
    with `maps`, for a file of a spare's size (it comes back: the worker writes its next
    piece of that size into it), the populated mapping kept from its last trip.

    `socket.sendfile` from /dev/shm to a loopback peer measured about three
    quarters of the speed of a fresh mapping here (1 MiB and 64 MiB files, the two
    alternated on one connection); a kept mapping sent 1 MiB in 99-152 µs where a
    fresh one took 233-250, and 16 MiB in 2.8 ms against 4.8-5.3 (medians of 300)."""
    if not nbytes:
        return
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < offset + nbytes:
            since = f" from byte {offset}" if offset else ""
            raise DataChannelError("INTERNAL", f"{path} holds {size} of the piece's {nbytes} bytes{since}")
        kept: memoryview | None = None
        if maps is not None and size >= MIN_WARM_BYTES:
            try:
                kept = memoryview(maps.mapping(path, size))
            except ValueError:  # closed by another sender's eviction meanwhile, or resized
                kept = None
        if kept is not None:
            with kept:
                sock.sendall(kept[offset:offset + nbytes])
            return
        with mmap.mmap(f.fileno(), offset + nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as mapped:
            with memoryview(mapped) as view:
                sock.sendall(view[offset:])
