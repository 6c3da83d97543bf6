"""The controller's calls port: `Run`, `WaitCall` and the rest of a client's per-call methods as frames.

What goes over it, and why, is `pathways_wire.calls_frames`. Here the port is served:
each connection's hello names the client token and program, and is let in only if the
gate knows the token (`ClientGate`); each request then goes through the same gate as a
gRPC call, to the same `ControllerService` method a gRPC call reaches. A request that
may wait for a program call to end (`calls_frames.waits`) is answered on a thread of
the port's pool, so the connection's other requests (the client's next `Run`, its
`DropObjects`) go on meanwhile; every other request is answered on the connection's
reading thread, in the order it came. The thread that answers writes the answer,
under the connection's write lock.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from typing import Any, BinaryIO, NoReturn

import grpc
from google.protobuf.message import DecodeError, Message

from pathways_wire import calls_frames
from pathways_wire import pathways_pb2 as pb
from pathways_wire import session_frames as frames
from pathways_wire.driver_protocol import CLIENT_TOKEN_METADATA, PROGRAM_METADATA
from pathways_operator.controller.client_gate import ClientGate, Refused
from pathways_operator.controller.service import SERVER_THREADS, ControllerService

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


class CallsPort:
    """Serves `ControllerService`'s per-call methods on a port of their own."""

    def __init__(self, service: ControllerService, gate: ClientGate, bind_host: str) -> None:
        self._service = service
        self._gate = gate
        self._pool = futures.ThreadPoolExecutor(max_workers=SERVER_THREADS, thread_name_prefix="calls-port")
        self._port = frames.SessionPort("controller calls", bind_host, "", None, admit=self._admit)
        self.port = self._port.port

    def close(self) -> None:
        self._port.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _admit(self, hello: pb.SessionHello, peer: str) -> frames.Serve | None:
        """A connection whose token the gate knows; the rest are closed unanswered."""
        namespace, _, name = hello.program.partition("/")
        try:
            self._gate.authenticate("calls port", hello.token, (namespace, name))
        except Refused as refused:
            log.warning("calls port: %s refused: %s", peer, refused.details)
            return None
        return _Connection(self._service, self._gate, self._pool, hello.token, hello.program).serve


class _Connection:
    def __init__(self, service: ControllerService, gate: ClientGate, pool: futures.ThreadPoolExecutor,
                 token: str, program: str) -> None:
        self._service, self._gate, self._pool = service, gate, pool
        self._token = token
        namespace, _, name = program.partition("/")
        self._program = (namespace, name)
        self._context = _Context(token, program)
        self._write = threading.Lock()
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
            self._pool.submit(self._answer, request.id, method, message)
        else:
            self._answer(request.id, method, message)

    def _answer(self, call_id: int, method: str, message: Message) -> None:
        handler: Any = getattr(self._service, method)
        answer = pb.ControllerAnswer(id=call_id)
        try:
            reply = self._gate.admit(method, self._token, self._program, message,
                                     lambda: handler(message, self._context))
            answer.body = reply.SerializeToString()
        except Refused as refused:
            answer.code, answer.details = refused.code, refused.details
        except _Aborted as aborted:
            answer.code, answer.details = aborted.code.name, aborted.details
        except Exception as err:  # a bug: the client hears of it, as from a gRPC server
            log.exception("calls port: %s failed", method)
            answer.code, answer.details = "INTERNAL", f"{method}: {type(err).__name__}: {err}"
        try:
            self._send(answer)
        except OSError as err:
            log.info("calls port: answering %s failed: %s", method, err)

    def _send(self, answer: pb.ControllerAnswer) -> None:
        assert self._conn is not None
        with self._write:
            frames.send_message(self._conn, frames.EVENT, answer)


SWITCH = "PATHWAYS_CALLS_PORT"


def calls_port_wanted(env: Mapping[str, str]) -> bool:
    """Whether `env` lets the controller open its calls port (default: on); off, its
    clients make every call over gRPC."""
    value = env.get(SWITCH, "on").strip().lower()
    if value not in ("on", "off"):
        raise ValueError(f"{SWITCH}={env[SWITCH]!r} is neither on nor off; set it to on (the default) or off")
    return value == "on"
