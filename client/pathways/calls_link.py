"""The client's link to its controller's calls port (`pathways_wire.calls_frames`).

`CallsLink` has the port's methods as attributes shaped as gRPC's stub has them
(`link.Run(request, timeout=...)`, `link.WaitCall.future(request, timeout=...)`), so the
runtime and its ownership call either the same way. A failed call raises
`CallsPortError`, a `grpc.RpcError` with the status code and details the controller gave
(or UNAVAILABLE, DEADLINE_EXCEEDED as a gRPC channel would), which the runtime translates
as any other.

One connection: requests are written by the calling threads, under a lock, and answers
read by a thread of the link's own, which completes each request's future. A blocking
call waits on its future for its deadline; a future's deadline is kept by a thread that
looks once a second (`EXPIRY_TICK_S`). A connection that breaks fails every request
outstanding on it with UNAVAILABLE; the next request connects again. A link given the
controller's gRPC stub (`fallback`) sends a request there when it has to connect and
cannot: the port closes a new connection unanswered while a flood of connections that
never say their hello holds every place for one (`pathways_wire.port_connections`).
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, BinaryIO, Generic, TypeVar

import grpc
from google.protobuf.message import Message

from pathways_wire import calls_frames
from pathways_wire import host_port
from pathways_wire import pathways_pb2 as pb
from pathways_wire import session_frames as frames
from pathways_wire.driver_protocol import CLIENT_TOKEN_METADATA, PROGRAM_METADATA

log = logging.getLogger(__name__)

EXPIRY_TICK_S = 1.0
"""How often overdue futures are failed: a deadline is kept to within this."""

R = TypeVar("R", bound=Message)


class CallsPortError(grpc.RpcError):
    """A call on the calls port that failed: what a gRPC call would have raised."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _status(name: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN)


class SentFuture(Future[R]):
    """A future of a request's answer that knows the connection the request went on."""

    connection: socket.socket | None = None
    """The link's connection the request was written on (None: it was not written)."""


class _Method(Generic[R]):
    """One method of the port, callable as gRPC's stub's is, with its `future` form."""

    def __init__(self, link: CallsLink, name: str) -> None:
        self._link, self._name = link, name

    def __call__(self, request: Message, timeout: float | None = None) -> R:
        fallback = self._link.fallback_for(self._name)
        if fallback is not None:
            return fallback(request, timeout=timeout)  # type: ignore[no-any-return]
        return self._link.call(self._name, request, timeout)  # type: ignore[return-value]

    def future(self, request: Message, timeout: float | None = None) -> Future[R]:
        fallback = self._link.fallback_for(self._name)
        if fallback is not None:
            return fallback.future(request, timeout=timeout)  # type: ignore[no-any-return]
        return self._link.submit(self._name, request, timeout)  # type: ignore[return-value]


class CallsLink:
    """The connection to `host`:`port`, presenting `token` and `program` (see the module)."""

    def __init__(self, host: str, port: int, token: str, program: str, fallback: Any = None) -> None:
        self.address = host_port.join(host, port)
        self._host, self._port = host, port
        self._token, self._program = token, program
        self._fallback = fallback
        """The controller's gRPC stub, which a request goes to when the link has to connect
        and cannot (None: the request fails UNAVAILABLE)."""
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._write = threading.Lock()
        self._pending: dict[int, tuple[Future[Message], str, float, socket.socket]] = {}
        """Request id -> its future, method, deadline and the connection it went on."""
        self._sock: socket.socket | None = None
        self._closed = False
        self._expiry: threading.Thread | None = None
        self.answered = 0
        """Answers taken so far, over every connection."""
        self.Run: _Method[pb.RunReply] = _Method(self, "Run")
        self.WaitCall: _Method[pb.CallStatus] = _Method(self, "WaitCall")
        self.FinishCall: _Method[pb.CallStatus] = _Method(self, "FinishCall")

    def connect(self) -> None:
        """Connects now (it would at the first request): OSError or ValueError if the port
        cannot be had, or does not take this client's token."""
        self._connected()

    def fallback_for(self, method: str) -> Any:
        """The fallback's `method` when the link is not connected and cannot connect now: a
        port that already holds as many connections awaiting their hello as it may (a
        flood of connections that never say one) closes a new one unanswered. Nothing of
        the request was sent, so it goes to the controller over gRPC instead, the same
        request the same gate checks. None where the link is connected or connects, or has
        no fallback, or was closed."""
        if self._fallback is None:
            return None
        try:
            self._connected()
        except (OSError, ValueError) as err:
            with self._lock:
                if self._closed:
                    return None
            log.info("%s: the controller's calls port (%s) cannot be had (%s); calling over gRPC",
                     method, self.address, err)
            return getattr(self._fallback, method)
        return None

    def call(self, method: str, request: Message, timeout: float | None) -> Message:
        """`method`'s reply, waiting at most `timeout` seconds (None: until the link closes)."""
        answer = self.submit(method, request, None)
        try:
            return answer.result(timeout)
        except FutureTimeout:
            self._forget(answer)
            raise CallsPortError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{method}: the controller's calls port ({self.address}) did not answer within {timeout:g} s",
            ) from None

    def submit(self, method: str, request: Message, timeout: float | None) -> SentFuture[Message]:
        """A future of `method`'s reply, failed with DEADLINE_EXCEEDED once `timeout` is up;
        it names the connection the request went on (`carries_after`)."""
        answer: SentFuture[Message] = SentFuture()
        answer.set_running_or_notify_cancel()
        deadline = time.monotonic() + timeout if timeout is not None else float("inf")
        frame = pb.ControllerRequest(method=method, body=request.SerializeToString())
        sock: socket.socket | None = None
        try:
            sock = self._connected()
            with self._lock:
                frame.id = next(self._ids)
                self._pending[frame.id] = (answer, method, deadline, sock)
            with self._write:
                frames.send_message(sock, frames.COMMAND, frame)
            answer.connection = sock
        except (OSError, ValueError) as err:
            with self._lock:
                self._pending.pop(frame.id, None)
            if sock is not None:
                frames.shut(sock)  # its reader sees the end and fails what else is outstanding on it
            answer.set_exception(self._unavailable(method, err))
        return answer

    def carries_after(self, connection: object) -> bool:
        """Whether a request written now goes on `connection` (a `SentFuture`'s), so that the
        controller takes it after the request written there before: the port takes a
        connection's requests in the order they came. False once the link connected
        again, or closed, and for a request that went over gRPC (None)."""
        with self._lock:
            return connection is not None and connection is self._sock and not self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sock, self._sock = self._sock, None
        if sock is not None:
            frames.shut(sock)
        self._fail_all(None, "the client closed its link to the controller")

    # ------------------------------------------------------------ the connection

    def _connected(self) -> socket.socket:
        with self._lock:
            if self._closed:
                raise ConnectionError("the link to the controller's calls port is closed")
            if self._sock is not None:
                return self._sock
            first = pb.ControllerAnswer()
            sock, stream = frames.connect(self._host, self._port, self._token, first, self._program)
            self._sock = sock
            threading.Thread(target=self._read, args=(sock, stream), name="pw-calls-port", daemon=True).start()
            if self._expiry is None:
                self._expiry = threading.Thread(target=self._expire, name="pw-calls-expiry", daemon=True)
                self._expiry.start()
            return sock

    def _read(self, sock: socket.socket, stream: BinaryIO) -> None:
        why = "the controller closed its calls port"
        try:
            with stream:
                answer = pb.ControllerAnswer()
                while frames.read_message(stream, frames.EVENT, answer):
                    self._take(answer)
                    answer = pb.ControllerAnswer()
        except (OSError, ValueError) as err:
            why = f"the connection to the controller's calls port broke: {err}"
        with self._lock:
            if self._sock is sock:
                self._sock = None
        frames.shut(sock)
        sock.close()
        self._fail_all(sock, why)

    def _take(self, answer: pb.ControllerAnswer) -> None:
        with self._lock:
            self.answered += 1
            entry = self._pending.pop(answer.id, None)
        if entry is None:
            return  # its caller gave up on it (deadline)
        future, method, _, _ = entry
        if answer.code:
            future.set_exception(CallsPortError(_status(answer.code), answer.details))
            return
        try:
            future.set_result(calls_frames.METHODS[method][1].FromString(answer.body))
        except Exception as err:  # a reply that does not parse
            future.set_exception(CallsPortError(grpc.StatusCode.INTERNAL, f"{method}: bad reply: {err}"))

    def _fail_all(self, sock: socket.socket | None, why: str = "") -> None:
        """Fails every request outstanding on `sock` (None: on any connection)."""
        with self._lock:
            failed = [k for k, v in self._pending.items() if sock is None or v[3] is sock]
            entries = [self._pending.pop(k) for k in failed]
        for future, method, _, _ in entries:
            if not future.done():
                future.set_exception(CallsPortError(grpc.StatusCode.UNAVAILABLE, f"{method}: {why}"))

    def _forget(self, answer: Future[Message]) -> None:
        with self._lock:
            for key, (future, _, _, _) in list(self._pending.items()):
                if future is answer:
                    del self._pending[key]

    def _expire(self) -> None:
        while True:
            time.sleep(EXPIRY_TICK_S)
            now = time.monotonic()
            with self._lock:
                if self._closed:
                    return
                overdue = [(k, v) for k, v in self._pending.items() if v[2] <= now]
                for key, _ in overdue:
                    del self._pending[key]
            for _, (future, method, _, _) in overdue:
                future.set_exception(CallsPortError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"{method}: the controller's calls port ({self.address}) did not answer in time",
                ))

    def _unavailable(self, method: str, err: BaseException) -> CallsPortError:
        return CallsPortError(grpc.StatusCode.UNAVAILABLE,
                              f"{method}: cannot reach the controller's calls port ({self.address}): {err}")


def credentials_of(metadata: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    """(client token, program) from the metadata the client presents over gRPC."""
    found = dict(metadata)
    return found.get(CLIENT_TOKEN_METADATA, ""), found.get(PROGRAM_METADATA, "")
