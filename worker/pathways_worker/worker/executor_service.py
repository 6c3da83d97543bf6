"""The executor's faces to its sidecar: the gRPC `Executor.Session` stream, and the same
session as frames on a raw TCP port (`pathways_wire.session_frames`).

Commands are applied by a reader thread in arrival order; the worker sends the
first event (`ready`, the host's name, and the session port where there is one)
and then whatever the executor's outbox accumulated, one batch per message. A new
session (the sidecar reconnected, or moved to the session port) replaces the old
one; the executor's state survives it.

Only the session the sidecar uses takes events from the outbox: a gRPC session
that offered the port waits for the sidecar's first command (`attach`, or any other)
before it takes any, so an event is never taken by a stream the sidecar is leaving.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import BinaryIO

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire import session_frames as frames
from pathways_worker.worker.executor import Executor
from pathways_worker.worker.outbox import WorkerOutbox

log = logging.getLogger(__name__)

TAKE_S = 0.25
"""How long a session waits on the outbox before it looks whether it is still the current one."""


class ExecutorService(pb_grpc.ExecutorServicer):
    def __init__(self, executor: Executor, host_name: str) -> None:
        self._executor = executor
        self._host_name = host_name
        self._lock = threading.Lock()
        self._session = 0
        self.session_port = 0
        """The raw session port offered in the ready event (`SessionPort`); 0: none."""

    @property
    def outbox(self) -> WorkerOutbox:
        return self._executor.outbox

    def open_session(self) -> int:
        """A new session, which replaces the one before."""
        with self._lock:
            self._session += 1
            return self._session

    def is_current(self, me: int) -> bool:
        return self._session == me

    def ready_event(self) -> pb.WorkerEvent:
        first = self._executor.outbox.stats_event()
        first.ready, first.host, first.session_port = True, self._host_name, self.session_port
        return first

    def events(self, me: int, active: Callable[[], bool], sending: bool = False) -> Iterator[pb.WorkerEvent]:
        """The outbox's events for session `me` while it is current and `active`; an event
        is taken only while `me` is current, so none goes to a session already replaced.
        With `sending`, each event is taken as `WorkerOutbox.take_event` does with it: the
        caller has written an event once it asks for the next one."""

        def current() -> bool:
            return self._session == me

        outbox = self._executor.outbox
        while active() and self._session == me:
            event = outbox.take_event(TAKE_S, current, sending)
            if event is None:
                continue
            try:
                yield event
            finally:
                if sending and outbox.carries_items(event):
                    outbox.sent()

    def apply(self, me: int, command: pb.WorkerCommand) -> bool:
        """Carries out one command of session `me`; False once `me` was replaced."""
        if self._session != me:
            return False
        try:
            self._executor.handle(command)
        except Exception:
            log.exception("command %s failed", command.WhichOneof("command"))
        return True

    def Session(
        self, request_iterator: Iterator[pb.WorkerCommand], context: grpc.ServicerContext
    ) -> Iterator[pb.WorkerEvent]:
        me = self.open_session()
        attached = threading.Event()
        if not self.session_port:
            attached.set()
        threading.Thread(
            target=self._read, args=(me, request_iterator, attached), name=f"session-{me}", daemon=True
        ).start()
        log.info("sidecar session %d opened", me)
        yield self.ready_event()
        while not attached.wait(TAKE_S):
            if not context.is_active() or self._session != me:
                return
        yield from self.events(me, context.is_active)

    def _read(self, me: int, commands: Iterator[pb.WorkerCommand], attached: threading.Event) -> None:
        try:
            for command in commands:
                attached.set()  # a sidecar that sends commands stays on this stream
                if command.WhichOneof("command") != "attach" and not self.apply(me, command):
                    return
        except Exception as err:  # the stream ended under us
            log.info("sidecar session %d ended: %s", me, err)


class SessionFrames:
    """The session on the worker's session port (`frames.SessionPort`): commands read
    and carried out on the connection's thread, events written by a thread of its own, or by
    the thread that has an urgent one (`WorkerOutbox.attach`)."""

    def __init__(self, service: ExecutorService) -> None:
        self._service = service

    def serve(self, conn: socket.socket, stream: BinaryIO, peer: str) -> None:
        service = self._service
        me = service.open_session()
        log.info("sidecar session %d opened on the session port from %s", me, peer)
        ended = threading.Event()
        write: Callable[[pb.WorkerEvent], None] = frames.shared_writer(conn, frames.EVENT)
        writer = threading.Thread(target=self._write, args=(write, conn, me, ended), name=f"session-{me}-out",
                                  daemon=True)
        outbox = service.outbox
        try:
            write(service.ready_event())
            writer.start()
            outbox.attach(write)
            command = pb.WorkerCommand()
            while frames.read_message(stream, frames.COMMAND, command):
                if not service.apply(me, command):
                    return
                command = pb.WorkerCommand()
        except (OSError, ValueError) as err:
            log.info("sidecar session %d on the session port ended: %s", me, err)
        finally:
            outbox.detach(write)
            ended.set()
            if writer.is_alive():
                writer.join(2 * TAKE_S)

    def _write(
        self, write: Callable[[pb.WorkerEvent], None], conn: socket.socket, me: int, ended: threading.Event
    ) -> None:
        """The outbox's events, a frame each, until the session is replaced or its
        connection ends; a failed write ends the connection. The threads that put urgent
        events write them too (`WorkerOutbox.attach`), with the same `write`."""
        try:
            for event in self._service.events(me, lambda: not ended.is_set(), sending=True):
                write(event)
        except OSError as err:
            log.info("sidecar session %d: sending on the session port failed: %s", me, err)
            frames.shut(conn)
