"""The sidecar's one session with its worker: over the worker's session port, or `Executor.Session`.

The link opens the worker's gRPC session. The worker's first event (`ready`)
offers a session port (`pathways_wire.session_frames`): the link connects there,
presents the slice's token and, once the worker answers ready, leaves the gRPC
stream. Commands then go as frames written by the thread that sends them, and
events come back on the link's own thread, with no gRPC thread between. A worker
that offers no port, a port that cannot be reached, or a sidecar started with
``--session-frames off`` keeps the gRPC session, which the link then attaches
(`WorkerCommand.attach`) before its first command.

The worker may still be starting (importing jax, joining its slice's JAX job), so the
link tries again every `STARTING_RETRY_S` until the worker first answers with
its `ready` event: the gang is reported ready only after every link is, so a
longer wait here would add straight to the slice's start-up. The worker serves
only once it has joined, so each try first asks whether its port accepts
connections at all (`pathways_wire.port_probe`) and opens a gRPC session only
when it does: the worker's start-up shares its cores with this wait. Commands sent
meanwhile wait, in order, and go once it is. If the worker goes away the link says
so (`ready` clears) and reconnects with a backoff capped at one second.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import BinaryIO

import grpc

from pathways_wire import host_port
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire import session_frames as frames
from pathways_wire.command_batches import batches
from pathways_wire.corks import Together
from pathways_wire.port_probe import accepts
from pathways_wire.slice_token import call_metadata

log = logging.getLogger(__name__)

SESSION_MESSAGE_BYTES = 256 << 20
MAX_BACKOFF_S = 1.0
STARTING_RETRY_S = 0.05
TAKE_S = 0.2
"""How long the gRPC stream's sender waits for a command before it looks whether the stream ended."""


class WorkerLink:
    def __init__(
        self, address: str, on_event: Callable[[pb.WorkerEvent], None], token: str = "",
        frames_wanted: bool = True,
    ) -> None:
        self.address = address
        self._token = token
        self._metadata = call_metadata(token)
        self._on_event = on_event
        self._frames_wanted = frames_wanted
        self._cond = threading.Condition()
        self._pending: deque[pb.WorkerCommand] = deque()
        """Commands not yet sent, in order: while the link is not open, or it is on gRPC."""
        self._corks = 0
        self._corked: list[pb.WorkerCommand] = []
        """What `send` was given inside `together` (guarded by `_cond`)."""
        self._sock: socket.socket | None = None
        """The session port's connection while the link is open on it (guarded by `_cond`)."""
        self._ready = threading.Event()
        self._stop = threading.Event()
        self.worker_host = ""
        self.on_frames = False
        """Whether the open session is on the worker's session port."""
        self.store_bytes = 0
        self.store_limit = 0
        self._thread = threading.Thread(target=self._run, name="worker-link", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s)

    def send(self, command: pb.WorkerCommand) -> None:
        """Sends `command` after every one sent before it: at once on the session port,
        else through the gRPC stream's sender, or once the link opens."""
        with self._cond:
            if self._corks:
                self._corked.append(command)
            else:
                self._send_now(command)

    def together(self) -> Together:
        """What `send` is given meanwhile, from any thread, goes in order as one message
        when the outermost `together` ends: a batch from the controller costs the link
        one write and the worker one read."""
        return Together((self,))

    def cork(self) -> None:
        """Holds what `send` is given until as many `uncork` (see `together`)."""
        with self._cond:
            self._corks += 1

    def uncork(self) -> None:
        with self._cond:
            self._corks -= 1
            if not self._corks and self._corked:
                commands, self._corked = self._corked, []
                self._send_now(
                    commands[0] if len(commands) == 1
                    else pb.WorkerCommand(batch=pb.WorkerCommands(commands=commands))
                )

    def _send_now(self, command: pb.WorkerCommand) -> None:
        """`send` once nothing holds it back (the caller holds `_cond`)."""
        sock = self._sock
        if sock is not None:
            try:
                frames.send_message(sock, frames.COMMAND, command)
                return
            except OSError as err:
                log.error("session port of worker %s failed: %s", self.address, err)
                self._drop_frames(sock)
        self._pending.append(command)
        self._cond.notify()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            if self._sock is not None:
                self._drop_frames(self._sock)
            self._cond.notify_all()

    def _drop_frames(self, sock: socket.socket) -> None:
        """Ends the session port's connection (the caller holds `_cond`); its reader sees it."""
        self._sock = None
        frames.shut(sock)

    # ------------------------------------------------------------ the link's thread

    def _run(self) -> None:
        backoff = STARTING_RETRY_S
        seen = False
        while not self._stop.is_set():
            if accepts(self.address) and self._session():
                backoff, seen = STARTING_RETRY_S, True
            self._ready.clear()
            self._stop.wait(backoff)
            if seen:
                backoff = min(2 * backoff, MAX_BACKOFF_S)

    def _session(self) -> bool:
        """One session, from opening the gRPC stream until it (or the session port's
        connection) ends; whether the worker answered ready."""
        options = [
            ("grpc.max_send_message_length", SESSION_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", SESSION_MESSAGE_BYTES),
        ]
        channel = grpc.insecure_channel(self.address, options=options)
        opened = threading.Event()
        ended = threading.Event()
        moved: tuple[socket.socket, BinaryIO, pb.WorkerEvent] | None = None
        try:
            events = pb_grpc.ExecutorStub(channel).Session(
                self._requests(opened, ended), metadata=self._metadata
            )
            for event in events:
                if event.ready and not opened.is_set():
                    self.worker_host = event.host
                    moved = self._connect_frames(event.session_port) if event.session_port else None
                    if moved is not None:
                        break  # closing the channel ends the gRPC stream
                    log.info("worker %s at %s is ready", event.host, self.address)
                    self.on_frames = False
                    opened.set()
                    self._ready.set()
                self._take(event)
        except grpc.RpcError as err:
            if opened.is_set():
                log.error("stream to worker %s broke: %s", self.address, err.details() if hasattr(err, "details") else err)
        finally:
            ended.set()
            channel.close()
        if moved is not None:
            self._on_session_port(*moved)
            return True
        return opened.is_set()

    def _take(self, event: pb.WorkerEvent) -> None:
        self.store_bytes, self.store_limit = event.store_bytes, event.store_limit
        self._on_event(event)

    def _connect_frames(self, port: int) -> tuple[socket.socket, BinaryIO, pb.WorkerEvent] | None:
        """The session port's connection, once the worker took the token and said ready;
        None (the link stays on gRPC) when it is not wanted or cannot be had."""
        if not self._frames_wanted:
            return None
        host = host_port.split(self.address)[0]
        ready = pb.WorkerEvent()
        try:
            sock, stream = frames.connect(host, port, self._token, ready)
        except (OSError, ValueError) as err:
            log.warning("worker %s: session port %s:%d not usable (%s); staying on gRPC",
                        self.address, host, port, err)
            return None
        if not ready.ready:
            log.warning("worker %s: session port %s:%d answered no ready event; staying on gRPC",
                        self.address, host, port)
            sock.close()
            return None
        return sock, stream, ready

    def _on_session_port(self, sock: socket.socket, stream: BinaryIO, ready: pb.WorkerEvent) -> None:
        """The session on the port: waiting commands go first, then each as it is sent;
        events are read here until the connection ends."""
        with sock, stream:
            with self._cond:
                try:
                    while self._pending:
                        frames.send_message(sock, frames.COMMAND, self._pending[0])
                        self._pending.popleft()
                except OSError as err:
                    log.error("session port of worker %s failed: %s", self.address, err)
                    return
                if self._stop.is_set():
                    return
                self._sock = sock
            log.info("worker %s at %s is ready (session port)", ready.host, self.address)
            self.on_frames = True
            self._ready.set()
            self._take(ready)
            try:
                event = pb.WorkerEvent()
                while frames.read_message(stream, frames.EVENT, event):
                    self._take(event)
                    event = pb.WorkerEvent()
            except (OSError, ValueError) as err:
                if not self._stop.is_set():
                    log.error("session port of worker %s broke: %s", self.address, err)
            finally:
                with self._cond:
                    if self._sock is sock:
                        self._drop_frames(sock)
                self._ready.clear()

    def _requests(self, opened: threading.Event, ended: threading.Event) -> Iterator[pb.WorkerCommand]:
        """Commands for one gRPC stream, once the worker said it is ready and the link
        stays on the stream: first the attach, then each command in order."""
        while not opened.wait(0.1):
            if ended.is_set() or self._stop.is_set():
                return
        yield pb.WorkerCommand(attach=pb.SessionAttach())

        def take() -> pb.WorkerCommand | None:
            with self._cond:
                while not self._pending:
                    if ended.is_set() or self._stop.is_set():
                        return None
                    self._cond.wait(TAKE_S)
                return self._pending.popleft()

        def poll() -> pb.WorkerCommand | None:
            with self._cond:
                return self._pending.popleft() if self._pending else None

        yield from batches(
            take, poll, lambda commands: pb.WorkerCommand(batch=pb.WorkerCommands(commands=commands))
        )
