"""The data channel's frames, and a sender's connection: bulk bytes over raw TCP.

A sidecar listens on a data port beside its gRPC port (`HealthReply.data_address`).
Another host's sidecar pushes routed values there, and a client puts its inputs
there: Python gRPC streaming reaches about a third of raw loopback TCP (each 1 MiB
chunk is a protobuf, copied four times), while here a piece's bytes go from the
sender's buffer to the socket, and from the socket into the value.

A frame is one kind byte (`H`ello, `P`iece, `R`eply, `F`etch), a 4-byte big-endian
length, then that many bytes of protobuf. A connection opens with a `DataHello` (the
sender, and the receiving slice's token); then each value is a run of `BufferHeader`
piece frames, each followed by its `nbytes` raw bytes, and the receiver answers each
value with a `PutReply` (an `error` and gRPC-style `code` when it refused it). A client
may instead send a `FetchRequest`: the host answers with a `PutReply` saying how many
piece frames follow (or why none do), then its pieces of the value, each with its bytes.
A receiver that serves as many connections as it may answers a new one's first exchange
with a `PutReply` of code `BUSY` and closes it: the sender sends another way or later.
"""

from __future__ import annotations

import select
import socket
import struct
from collections.abc import Callable, Sequence

from google.protobuf.message import DecodeError, Message

from pathways_wire import host_port
from pathways_wire import pathways_pb2 as pb
from pathways_wire.session_frames import shut
from pathways_wire.transfer import FetchTarget, TransferError, receive_piece

FRAME = struct.Struct("!BI")
HELLO, PIECE, REPLY, FETCH = b"H"[0], b"P"[0], b"R"[0], b"F"[0]
MAX_FRAME_BYTES = 1 << 20
"""Bound on one frame's protobuf (a header is a few hundred bytes)."""
CONNECT_TIMEOUT_S = 5.0
JOINED_BYTES = 64 << 10
"""A piece up to this size goes in the same write as its header: one segment, not two."""
BUSY = "UNAVAILABLE"
"""The code of an answer that refuses the connection rather than a value: the receiver
serves as many as it may (`port_connections.MAX_SERVED`, `MAX_CLIENTS_SERVED`). Nothing
sent on it was taken, so the sender may send it all again another way (gRPC) or later."""


class DataChannelError(Exception):
    """The receiver refused a value (`code` as gRPC would say it), or answered nonsense."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError(f"connection closed {n - got} bytes before the end of a frame")
        got += k
    return bytes(buf)


def send_frame(sock: socket.socket, kind: int, message: Message, data: bytes | memoryview = b"") -> None:
    """One frame, and after it in the same write the `data` it announces (a
    small piece's bytes): one segment on the wire, not two."""
    body = message.SerializeToString()
    sock.sendall(b"".join((FRAME.pack(kind, len(body)), body, data)))


def read_frame(sock: socket.socket, kind: int, message: Message) -> None:
    """Reads one frame of `kind` into `message`; TransferError names what was wrong."""
    got, length = FRAME.unpack(recv_exact(sock, FRAME.size))
    if got != kind:
        raise TransferError("frame.kind", f"expected {chr(kind)!r}, got byte {got}")
    if length > MAX_FRAME_BYTES:
        raise TransferError("frame.length", f"{length} B exceeds {MAX_FRAME_BYTES} B per frame")
    try:
        message.ParseFromString(recv_exact(sock, length))
    except DecodeError as err:
        raise TransferError("frame", f"not a {type(message).__name__}: {err}") from None


class DataConnection:
    """One open connection to a host's data channel, used by one sender at a time."""

    def __init__(self, address: str, sender: str, token: str, timeout_s: float) -> None:
        self.address = address
        self.sender = sender
        self.sock = socket.create_connection(host_port.split(address, "data channel address"),
                                             timeout=CONNECT_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout_s)
        send_frame(self.sock, HELLO, pb.DataHello(sender=sender, token=token))

    def close(self) -> None:
        self.sock.close()

    def abort(self) -> None:
        """Ends the connection under whoever is sending or waiting on it."""
        shut(self.sock)

    def is_open(self) -> bool:
        """Whether the receiver still holds the connection: an idle one it closed
        reads as its end (or as stray bytes), an open one has nothing to read."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def send_pieces(self, pieces: Sequence[tuple[pb.BufferHeader, memoryview]]) -> None:
        """Piece frames, each followed by its bytes, without waiting for an answer."""
        for header, data in pieces:
            if data.nbytes <= JOINED_BYTES:
                send_frame(self.sock, PIECE, header, data)
            else:
                send_frame(self.sock, PIECE, header)
                self.sock.sendall(data)

    def answer(self) -> int:
        """The receiver's answer to the oldest value not yet answered: the pieces it received."""
        return int(self._reply().pieces)

    def _reply(self) -> pb.PutReply:
        """The receiver's next answer; its refusal raised as `DataChannelError`."""
        reply = pb.PutReply()
        try:
            read_frame(self.sock, REPLY, reply)
        except TransferError as err:
            raise DataChannelError("INTERNAL", f"bad answer from {self.address}: {err}") from None
        if reply.error:
            raise DataChannelError(reply.code or "UNKNOWN", reply.error)
        return reply

    def put(self, values: Sequence[Sequence[tuple[pb.BufferHeader, memoryview]]]) -> int:
        """Sends values (each its pieces, the last flagged as such) and waits for every
        answer; returns the pieces received."""
        def send() -> None:
            for pieces in values:
                self.send_pieces(pieces)

        return self.answered(send, len(values))

    def answered(self, send: Callable[[], object], values: int = 1) -> int:
        """`send()`, then the answers to the `values` it sent: the pieces received. A
        receiver that refuses a value answers why and closes, so a send that breaks
        off reads that answer before raising."""
        try:
            send()
        except OSError as err:
            try:
                self.answer()
            except (DataChannelError, OSError):
                raise
            raise err
        return sum(self.answer() for _ in range(values))

    def fetch(self, request: pb.FetchRequest, target: FetchTarget, host: str) -> None:
        """This host's pieces of a value, each read straight into `target`."""
        send_frame(self.sock, FETCH, request)
        finished = False
        for _ in range(self._reply().pieces):
            header = pb.BufferHeader()
            read_frame(self.sock, PIECE, header)
            finished = receive_piece(header, target, host, self.sock.recv_into)
        if not finished:
            raise TransferError("last_from_sender", f"{target.what}: host {host} ended its pieces early")
