"""A sidecar's session with its worker as frames over raw TCP: `Executor.Session` without gRPC.

The sidecar and its worker are two containers of one pod and exchange a message
for every call: its launch and grants in, its completions out. Over a gRPC stream
each message passes through gRPC's threads on both sides (a writer thread taking
the request iterator, the completion-queue poller, the reader) before the thread
that acts on it sees it: about 0.3 ms per message on a busy 2-core machine, where a
loopback TCP round trip takes 0.06 ms. Here the sender writes the frame to the
socket itself and the receiver's reading thread acts on it.

The worker offers the port in its gRPC session's `ready` event
(`WorkerEvent.session_port`). The sidecar connects there and sends a
`SessionHello` with the slice's token; the worker checks it (constant time) and
answers with its `ready` event, or closes the connection. From then on the
sidecar sends `WorkerCommand` frames and the worker `WorkerEvent` frames, in
order, until either side closes.

A frame is one kind byte (`S` hello, `C` command, `E` event), a 4-byte big-endian
length, then that many bytes of protobuf.
"""

from __future__ import annotations

import socket
import struct
from typing import BinaryIO, cast

from google.protobuf.message import DecodeError, Message

from pathways_wire.transfer import TransferError

FRAME = struct.Struct("!BI")
HELLO, COMMAND, EVENT = b"S"[0], b"C"[0], b"E"[0]
MAX_FRAME_BYTES = 256 << 20
"""Bound on one frame: a program's load carries its compiled artifacts."""
HELLO_TIMEOUT_S = 5.0
"""How long either side waits for the other's first frame before giving up on the connection."""
JOINED_BYTES = 64 << 10
"""A body up to this size goes in the same write as its header."""


def send_message(sock: socket.socket, kind: int, message: Message) -> None:
    """One frame; a small one in one write."""
    body = message.SerializeToString()
    header = FRAME.pack(kind, len(body))
    if len(body) <= JOINED_BYTES:
        sock.sendall(header + body)
    else:
        sock.sendall(header)
        sock.sendall(body)


def read_message(stream: BinaryIO, kind: int, message: Message) -> bool:
    """Reads the next frame, of `kind`, into `message`; False when the peer closed the
    connection between frames. TransferError names what was wrong with a frame;
    ConnectionError, a connection that closed inside one."""
    header = stream.read(FRAME.size)
    if not header:
        return False
    if len(header) < FRAME.size:
        raise ConnectionError("connection closed inside a frame header")
    got, length = FRAME.unpack(header)
    if got != kind:
        raise TransferError("frame.kind", f"expected {chr(kind)!r}, got byte {got}")
    if length > MAX_FRAME_BYTES:
        raise TransferError("frame.length", f"{length} B exceeds {MAX_FRAME_BYTES} B per frame")
    body = stream.read(length)
    if len(body) < length:
        raise ConnectionError(f"connection closed {length - len(body)} bytes before the end of a frame")
    try:
        message.ParseFromString(body)
    except DecodeError as err:
        raise TransferError("frame", f"not a {type(message).__name__}: {err}") from None
    return True


def reader(sock: socket.socket) -> BinaryIO:
    """A buffered reader of `sock`: a small frame costs one system call, not two."""
    return cast(BinaryIO, sock.makefile("rb", buffering=1 << 16))


def tuned(sock: socket.socket) -> socket.socket:
    """`sock` with Nagle off: a frame goes when written, not when the next one comes."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
