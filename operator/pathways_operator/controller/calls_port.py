"""The controller's calls port: `Run`, `WaitCall` and the rest of a client's per-call methods as frames.

What goes over it, and why, is `pathways_wire.calls_frames`. Here the port is served:
each connection's hello names the client token and program, and is let in only if the
gate knows the token (`ClientGate`), at most `port_connections.MAX_SERVED_PER_CALLER` at
once per token; each request then goes through the same gate as a
gRPC call, to the same `ControllerService` method a gRPC call reaches. Every request
is taken on the connection's reading thread, in the order it came. One that waits for
a program call to end (`calls_frames.waits`: `WaitCall`, a `Run` with `wait`) is not
waited for there: the service starts it and leaves its answer to a function that runs
when the call ends (`ControllerService.run_then`, `wait_call_then`), on the thread that
ends it, so a call's end reaches its client with no thread woken in between, and the
connection's other requests go on meanwhile. The thread that answers writes the
answer under the connection's write lock, without blocking: what the socket does not
take at once (a client that stopped reading) is left to a thread of the connection's
own, so no controller thread ever waits on a client.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, NoReturn

import grpc
from google.protobuf.message import DecodeError, Message

from pathways_wire import calls_frames
from pathways_wire import pathways_pb2 as pb
from pathways_wire import session_frames as frames
from pathways_wire.driver_protocol import CLIENT_TOKEN_METADATA, PROGRAM_METADATA
from pathways_wire.env_flags import switch_on
from pathways_wire.port_connections import MAX_SERVED_PER_CALLER
from pathways_operator.controller.client_gate import ClientGate, Refused
from pathways_operator.controller.errors import ControllerError
from pathways_operator.controller.service import ControllerService

log = logging.getLogger(__name__)


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _Context:
    """What the service's methods use of a gRPC context: the caller's credentials, and abort."""

    def __init__(self, token: str, program: str) -> None:
        self._metadata = ((CLIENT_TOKEN_METADATA, token), (PROGRAM_METADATA, program))

    def invocation_metadata(self) -> Sequence[tuple[str, str]]:
        return self._metadata

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise _Aborted(code, details)


def _failed(call_id: int, method: str, err: Exception) -> pb.ControllerAnswer:
    """The answer to a request that failed: the gate's refusal, the service's abort or
    error, as a gRPC call would have ended; anything else is a bug, said as INTERNAL."""
    if isinstance(err, Refused):
        code, details = err.code, err.details
    elif isinstance(err, _Aborted):
        code, details = err.code.name, err.details
    elif isinstance(err, ControllerError):
        code, details = err.code, str(err)
    else:
        log.error("calls port: %s failed", method, exc_info=err)
        code, details = "INTERNAL", f"{method}: {type(err).__name__}: {err}"
    return pb.ControllerAnswer(id=call_id, code=code, details=details)


class CallsPort:
    """Serves `ControllerService`'s per-call methods on a port of their own."""

    def __init__(self, service: ControllerService, gate: ClientGate, bind_host: str, port: int = 0) -> None:
        """Listens on `port` of `bind_host` (0: any free port); OSError where it cannot."""
        self._service = service
        self._gate = gate
        self._port = frames.SessionPort("controller calls", bind_host, "", None, admit=self._admit,
                                        per_caller=MAX_SERVED_PER_CALLER, port=port)
        self.port = self._port.port

    def close(self) -> None:
        self._port.close()

    def _admit(self, hello: pb.SessionHello, peer: str) -> frames.Serve | None:
        """A connection whose token the gate knows; the rest are closed unanswered."""
        namespace, _, name = hello.program.partition("/")
        try:
            self._gate.authenticate("calls port", hello.token, (namespace, name))
        except Refused as refused:
            log.warning("calls port: %s refused: %s", peer, refused.details)
            return None
        return _Connection(self._service, self._gate, hello.token, hello.program).serve


class _Connection:
    def __init__(self, service: ControllerService, gate: ClientGate, token: str, program: str) -> None:
        self._service, self._gate = service, gate
        self._token = token
        namespace, _, name = program.partition("/")
        self._program = (namespace, name)
        self._context = _Context(token, program)
        self._write = threading.Lock()
        self._backlog: deque[bytes] = deque()
        """Frames the socket did not take at once, in order, for the backlog's writer."""
        self._backlog_bytes = 0
        self._writer: threading.Thread | None = None
        self._conn: socket.socket | None = None

    def serve(self, conn: socket.socket, stream: BinaryIO, peer: str) -> None:
        self._conn = conn
        try:
            self._send(pb.ControllerAnswer())  # admitted
            request = pb.ControllerRequest()
            while frames.read_message(stream, frames.COMMAND, request):
                self._take(request)
                request = pb.ControllerRequest()
        except (OSError, ValueError) as err:
            log.info("calls port: the connection from %s ended: %s", peer, err)

    def _take(self, request: pb.ControllerRequest) -> None:
        method = request.method
        why = calls_frames.refusal(method)
        if why:
            self._send(pb.ControllerAnswer(id=request.id, code="UNIMPLEMENTED", details=why))
            return
        kind = calls_frames.METHODS[method][0]
        try:
            message = kind.FromString(request.body)
        except DecodeError as err:
            self._send(pb.ControllerAnswer(id=request.id, code="INVALID_ARGUMENT",
                                           details=f"{method}: the request is not a {kind.__name__}: {err}"))
            return
        if calls_frames.waits(method, message):
            self._answer_later(request.id, method, message)
        else:
            self._answer(request.id, method, message)

    def _answer_later(self, call_id: int, method: str, message: Message) -> None:
        """Starts a request that waits for a program call's end; its answer goes when that comes."""
        try:
            scope = self._gate.check(method, self._token, self._program, message)

            def answer(reply: Message) -> None:
                self._gate.record(method, scope, message, reply)
                self._send(pb.ControllerAnswer(id=call_id, body=reply.SerializeToString()))

            if isinstance(message, pb.RunRequest):
                self._service.run_then(message, answer)
            else:
                assert isinstance(message, pb.CallStatusRequest)
                self._service.wait_call_then(message, answer)
        except Exception as err:
            self._send(_failed(call_id, method, err))

    def _answer(self, call_id: int, method: str, message: Message) -> None:
        handler: Any = getattr(self._service, method)
        try:
            reply = self._gate.admit(method, self._token, self._program, message,
                                     lambda: handler(message, self._context))
        except Exception as err:
            self._send(_failed(call_id, method, err))
            return
        self._send(pb.ControllerAnswer(id=call_id, body=reply.SerializeToString()))

    def _send(self, answer: pb.ControllerAnswer) -> None:
        """Writes what the socket takes now; the rest goes from the backlog's writer."""
        conn = self._conn
        assert conn is not None
        frame = frames.frame_bytes(frames.EVENT, answer)
        with self._write:
            if not self._backlog:
                try:
                    sent = conn.send(frame, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                except OSError as err:
                    log.info("calls port: answering failed: %s", err)
                    return
                if sent == len(frame):
                    return
                frame = frame[sent:]
            if self._backlog_bytes + len(frame) > MAX_BACKLOG_BYTES:
                log.warning("calls port: a client read none of its last %d B of answers; closing its connection",
                            self._backlog_bytes)
                self._backlog.clear()
                self._backlog_bytes = 0
                frames.shut(conn)
                return
            self._backlog.append(frame)
            self._backlog_bytes += len(frame)
            if self._writer is None:
                self._writer = threading.Thread(target=self._drain, args=(conn,), name="calls-port-out", daemon=True)
                self._writer.start()

    def _drain(self, conn: socket.socket) -> None:
        """Writes the backlog, blocking, until it is empty (then the next answer writes itself)."""
        while True:
            with self._write:
                if not self._backlog:
                    self._writer = None
                    return
                frame = self._backlog[0]
            try:
                conn.sendall(frame)
            except OSError as err:
                log.info("calls port: answering failed: %s", err)
                with self._write:
                    self._backlog.clear()
                    self._backlog_bytes = 0
                    self._writer = None
                return
            with self._write:
                if self._backlog and self._backlog[0] is frame:
                    self._backlog_bytes -= len(self._backlog.popleft())


MAX_BACKLOG_BYTES = 64 << 20
"""Answers held for a client that reads none, at most: past it the connection is closed
(its outstanding calls fail UNAVAILABLE there, and it connects again), so a client that
only writes cannot grow the controller without bound."""

SWITCH = "PATHWAYS_CALLS_PORT"


def calls_port_wanted(env: Mapping[str, str]) -> bool:
    """Whether `env` lets the controller open its calls port (default: on); off, its
    clients make every call over gRPC."""
    return switch_on(env, SWITCH)
