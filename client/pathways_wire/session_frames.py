"""A host's control sessions as frames over raw TCP: `Executor.Session` and `Dataflow.Control` without gRPC.

A sidecar and its worker (two containers of one pod), and the controller and each
host's sidecar, exchange a message for every call: its launch and grants in, its
completions out. Over a gRPC stream
each message passes through gRPC's threads on both sides (a writer thread taking
the request iterator, the completion-queue poller, the reader) before the thread
that acts on it sees it: about 0.3 ms per message on a busy 2-core machine, where a
loopback TCP round trip takes 0.06 ms. Here the sender writes the frame to the
socket itself and the receiver's reading thread acts on it.

The server offers its port in the first event of its gRPC stream
(`WorkerEvent.session_port`, `HostEvent.control_port`). The caller connects there
and sends a `SessionHello` with the slice's token; the server checks it (constant
time, `SessionPort`) and answers with that same first event, or closes the
connection. From then on the caller sends command frames (`WorkerCommand`,
`HostCommand`) and the server event frames (`WorkerEvent`, `HostEvent`), in order,
until either side closes. A caller that stays on gRPC sends `attach` first: the
server's gRPC stream takes no event before it, so none goes to a stream being left.

A frame is one kind byte (`S` hello, `C` command, `E` event), a 4-byte big-endian
length, then that many bytes of protobuf.
"""

from __future__ import annotations

import hmac
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import BinaryIO, TypeVar, cast

from google.protobuf.message import DecodeError, Message

from pathways_wire import host_port
from pathways_wire import pathways_pb2 as pb
from pathways_wire.port_connections import CallerCount, accept_each, awaiting_hello, served
from pathways_wire.transfer import TransferError

log = logging.getLogger(__name__)
T = TypeVar("T")

FRAME = struct.Struct("!BI")
HELLO, COMMAND, EVENT = b"S"[0], b"C"[0], b"E"[0]
MAX_FRAME_BYTES = 256 << 20
"""Bound on one frame: a program's load carries its compiled artifacts."""
HELLO_TIMEOUT_S = 5.0
"""How long either side waits for the other's whole first frame before giving up on the connection."""
MAX_HELLO_BYTES = 64 << 10
"""Bound on a hello, read before its sender is known: a token and a program's name."""
JOINED_BYTES = 64 << 10
"""A body up to this size goes in the same write as its header."""


def frame_bytes(kind: int, message: Message) -> bytes:
    """One frame, header and body, as bytes."""
    body = message.SerializeToString()
    return FRAME.pack(kind, len(body)) + body


def send_message(sock: socket.socket, kind: int, message: Message) -> None:
    """One frame; a small one in one write."""
    body = message.SerializeToString()
    header = FRAME.pack(kind, len(body))
    if len(body) <= JOINED_BYTES:
        sock.sendall(header + body)
    else:
        sock.sendall(header)
        sock.sendall(body)


def shared_writer(sock: socket.socket, kind: int) -> Callable[[Message], None]:
    """`send_message` of `kind` on `sock` for any thread: one frame at a time, whole."""
    writing = threading.Lock()

    def write(message: Message) -> None:
        with writing:
            send_message(sock, kind, message)

    return write


def read_message(stream: BinaryIO, kind: int, message: Message, max_bytes: int = MAX_FRAME_BYTES) -> bool:
    """Reads the next frame, of `kind` and at most `max_bytes`, into `message`; False when
    the peer closed the connection between frames. TransferError names what was wrong
    with a frame; ConnectionError, a connection that closed inside one."""
    header = stream.read(FRAME.size)
    if not header:
        return False
    if len(header) < FRAME.size:
        raise ConnectionError("connection closed inside a frame header")
    got, length = FRAME.unpack(header)
    if got != kind:
        raise TransferError("frame.kind", f"expected {chr(kind)!r}, got byte {got}")
    if length > max_bytes:
        raise TransferError("frame.length", f"{length} B exceeds {max_bytes} B per frame")
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


Serve = Callable[[socket.socket, BinaryIO, str], None]
"""Serves one admitted connection: the socket, its reader, and the peer as text."""
Admit = Callable[[pb.SessionHello, str], Serve | None]
"""A port's own check of a hello (and the peer as text): how to serve the connection, or
None to close it unanswered. Given, it replaces the comparison with the port's token."""


class SessionPort:
    """A listening port whose connections are served once their `SessionHello` presents
    the token (compared in constant time), or passes the port's `admit`; one that does not,
    whose hello is over `MAX_HELLO_BYTES`, or that has not said all of it within
    `HELLO_TIMEOUT_S`, is closed unanswered. Without a token (the host runs with
    ``--insecure-no-token``) every connection is served, as its gRPC server does; an
    empty token otherwise is refused here, at construction."""

    def __init__(self, name: str, bind_host: str, token: str, serve: Serve | None, *, insecure: bool = False,
                 admit: Admit | None = None, per_caller: int | None = None, port: int = 0) -> None:
        """`per_caller`: on a port whose callers present tokens of their own (`admit`
        checks them), the most connections one token is served at once. `port`: the port to
        listen on (0: any free one); OSError where it cannot be had."""
        if serve is None and admit is None:
            raise ValueError(f"{name}: a session port needs a way to serve its connections")
        if not token and not insecure and admit is None:
            raise ValueError(f"{name}: refusing to serve a session port without a slice token "
                             "(start the host with --insecure-no-token to check no caller)")
        self._name = name
        self._token = token.encode()
        self._serve = serve
        self._admit_hello = admit
        host = bind_host.strip("[]")
        self._listener = socket.create_server((host, port), family=host_port.family(host))
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        self._pending = awaiting_hello(f"{name} port")
        self._served = served(f"{name} port")
        self._callers = None if per_caller is None else CallerCount(f"{name} port", per_caller)
        threading.Thread(
            target=accept_each, args=(self._listener, self._pending, self._admit, f"{name}-session",
                                      lambda: self._closed),
            name=f"{name}-port", daemon=True,
        ).start()

    @property
    def served(self) -> int:
        """Connections served now, their hello passed."""
        return self._served.held

    def close(self) -> None:
        self._closed = True
        shut(self._listener)  # wakes the accept loop
        self._listener.close()

    def _admit(self, conn: socket.socket, peer: str) -> None:
        """Serves `conn` once its hello passes, while the port serves fewer than
        `port_connections.MAX_SERVED` (and, with `per_caller`, its token fewer than that);
        the room it took among the connections awaiting their hello goes back as soon as the
        hello is read."""
        try:
            stream = reader(tuned(conn))
        except OSError:
            self._pending.give_back()
            conn.close()
            return
        with conn, stream:
            hello = pb.SessionHello()
            try:
                said = read_hello(conn, lambda: read_message(stream, HELLO, hello, MAX_HELLO_BYTES))
            except (OSError, ValueError) as err:
                log.warning("%s port: %s sent no valid hello (%s); closed", self._name, peer, err)
                return
            finally:
                self._pending.give_back()
            if not said:
                return
            serve: Serve | None = self._serve
            if self._admit_hello is not None:
                serve = self._admit_hello(hello, peer)
            elif self._token and not hmac.compare_digest(hello.token.encode(), self._token):
                serve = None
            if serve is None:
                log.warning("%s port: %s presented a wrong token; closed", self._name, peer)
                return
            caller = hello.token
            if self._callers is not None and not self._callers.take(caller):
                return  # closed unanswered, as past the port's own bound
            try:
                if not self._served.take():
                    return  # closed unanswered: a client then calls over gRPC, a host tries again
                try:
                    conn.settimeout(None)
                    serve(conn, stream, peer)
                finally:
                    self._served.give_back()
            finally:
                if self._callers is not None:
                    self._callers.give_back(caller)


def connect(address_host: str, port: int, token: str, first: Message,
            program: str = "") -> tuple[socket.socket, BinaryIO]:
    """A session with the port at `address_host`:`port`, once it took the token (and
    `program`, on the controller's calls port) and
    answered with its first event, read into `first`. OSError or ValueError (a
    TransferError) when it cannot be had; the connection is then closed."""
    sock = tuned(socket.create_connection((address_host.strip("[]"), port), timeout=HELLO_TIMEOUT_S))
    try:
        send_message(sock, HELLO, pb.SessionHello(token=token, program=program))
        stream = reader(sock)
        if not read_message(stream, EVENT, first):
            raise ConnectionError("the port closed without answering (a wrong slice token?)")
        sock.settimeout(None)
        return sock, stream
    except BaseException:
        sock.close()
        raise


def read_hello(conn: socket.socket, read: Callable[[], T]) -> T:
    """`read()`, the connection's first frame, within `HELLO_TIMEOUT_S` for the whole of
    it, not for each byte: a sender that trickles a byte every few seconds is cut off."""
    conn.settimeout(HELLO_TIMEOUT_S)
    deadline = threading.Timer(HELLO_TIMEOUT_S, shut, args=(conn,))
    deadline.daemon = True
    deadline.start()
    try:
        return read()
    finally:
        deadline.cancel()


def shut(sock: socket.socket) -> None:
    """Ends both directions of `sock` (a no-op where it is closed already), so the thread
    reading it, or waiting in a read, sees the end."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
