"""One long-lived control stream from the controller to one host's sidecar.

Programs, launches and grants go down it in order; completions come back up,
batched by the host. Nothing here waits for an answer: `send` only queues, so
dispatching a program call to many hosts is parallel and never blocks on any
one of them.

The link opens the sidecar's gRPC `Control` stream; where the sidecar's first event
offers its control port (`HostEvent.control_port`), the link moves there: the same
stream as frames on raw TCP (`pathways_wire.session_frames`), presenting the slice's
token, with no gRPC thread between the link's threads and the socket. A port that
cannot be reached, or ``PATHWAYS_CONTROL_FRAMES=off`` (a network that admits only
the hosts' gRPC port), keeps the gRPC stream, which the link attaches first.

What only frees memory (a call's release, dropped objects) is sent with
`later=True`: it waits, up to `LATER_S`, to ride at the end of the next message,
so it may follow commands sent after it (a release or a drop frees only what no
later command can name: the values a client still holds are kept). A
client that runs small calls back to back otherwise paid for each call's
release as a message of its own through the controller, the sidecar and the
worker, on the same cores as its next call's launch (on 2 cores that release
crossed the hosts while the next call's Run was on its way to the controller).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import BinaryIO

import grpc

from pathways_wire import host_port
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire import session_frames as frames
from pathways_wire.command_batches import batches
from pathways_wire.corks import Together
from pathways_wire.slice_token import call_metadata
from pathways_wire.env_flags import switch_on

log = logging.getLogger(__name__)

LATER_S = 0.02
"""How long a command sent `later` waits for company, at most: how much longer a
finished call's values may stay on its hosts."""

_WAKE = pb.HostCommand()
"""Queued to wake the sender when a held command starts its wait; never sent."""

FRAMES_SWITCH = "PATHWAYS_CONTROL_FRAMES"


def control_frames_wanted(env: Mapping[str, str]) -> bool:
    """Whether `env` lets links move to the sidecars' control ports (default: on)."""
    return switch_on(env, FRAMES_SWITCH)


GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]


class HostLink:
    def __init__(
        self,
        address: str,
        name: str,
        slice_id: str,
        on_event: Callable[[HostLink, pb.HostEvent], None],
        on_broken: Callable[[HostLink, str], None],
        token: str = "",
        frames_wanted: bool = True,
    ) -> None:
        """`slice_id`: the gang the host belongs to, so events find their slice
        without a search; `token`: the host's slice token, presented on the
        control stream; `frames_wanted`: move to the control port the sidecar offers."""
        self.address = address
        self.slice_id = slice_id
        self._token = token
        self._frames_wanted = frames_wanted
        self._sock: socket.socket | None = None
        self._write = threading.Lock()
        """Held by whoever writes to the control port, and by `send` deciding how to send."""
        self._direct: socket.socket | None = None
        """The control port's connection once what was queued before it went: `send` then
        writes there itself, no thread between (guarded by `_write`)."""
        self._corks = 0
        self._corked: list[pb.HostCommand] = []
        """What `send` was given inside `together` (guarded by `_write`)."""
        self.on_frames = False
        """Whether the stream runs on the sidecar's control port."""
        self._metadata = call_metadata(token)
        self.name = name
        self._on_event = on_event
        self._on_broken = on_broken
        self._queue: queue.SimpleQueue[pb.HostCommand | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._held: list[pb.HostCommand] = []
        self._held_since = 0.0
        self._sender_timed = False
        """Whether the sender is in a timed wait for a held command (not waiting for the
        queue alone, nor sending): a command held meanwhile needs no wake-up."""
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"link-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, command: pb.HostCommand, later: bool = False) -> None:
        """Queues `command`, or on the control port writes it at once, with the held
        commands after it. With `later`, holds it until the next message goes, at the
        end of that message, or until `LATER_S` passed, whichever comes first."""
        if not later:
            with self._write:
                if self._corks:
                    self._corked.append(command)
                else:
                    self._send_now([command])
            return
        with self._lock:
            self._held.append(command)
            if len(self._held) > 1:
                return
            self._held_since = time.monotonic()
            if self._sender_timed:
                return  # the sender wakes before this wait is up, and waits out the rest
        self._queue.put(_WAKE)  # the sender starts the wait

    def together(self) -> Together:
        """What `send` is given meanwhile, from any thread, goes in order as one message
        when the outermost `together` ends: a call's launch and its grants cost the link one
        write and the sidecar one read."""
        return Together((self,))

    def cork(self) -> None:
        """Holds what `send` is given until as many `uncork` (see `together`)."""
        with self._write:
            self._corks += 1

    def uncork(self) -> None:
        with self._write:
            self._corks -= 1
            if not self._corks and self._corked:
                commands, self._corked = self._corked, []
                self._send_now(commands)

    def _send_now(self, commands: list[pb.HostCommand]) -> None:
        """`commands`, then those held for later, written on the control port, or queued for
        the sender before the link moved there (the caller holds `_write`)."""
        sock = self._direct
        if sock is None:
            for command in commands:
                self._queue.put(command)
            return
        with self._lock:
            held, self._held = self._held, []
        try:
            frames.send_message(sock, frames.COMMAND, _message([*commands, *held]))
        except OSError as err:
            self._write_failed(sock, err)

    def _take(self) -> pb.HostCommand | None:
        """The next command to send, waiting for one; a held one once its wait is up."""
        while True:
            with self._lock:
                wait = self._held_since + LATER_S - time.monotonic() if self._held else None
                if wait is not None and wait <= 0:
                    self._sender_timed = False
                    return self._held.pop(0)
                self._sender_timed = wait is not None
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                continue
            if item is not _WAKE:
                with self._lock:
                    self._sender_timed = False
                return item

    def _poll(self) -> pb.HostCommand | None:
        """A command already queued, else a held one, else None."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # closing: the next take ends the stream
            if item is not _WAKE:
                return item
        with self._lock:
            return self._held.pop(0) if self._held else None

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._queue.put(None)
            self._channel.close()
            sock = self._sock
            if sock is not None:
                frames.shut(sock)

    def _commands(self) -> Iterator[pb.HostCommand]:
        """What is queued, a batch per message (`command_batches`), held commands last."""
        return batches(
            self._take, self._poll, lambda commands: pb.HostCommand(batch=pb.HostCommands(commands=commands))
        )

    def _run(self) -> None:
        stub = pb_grpc.DataflowStub(self._channel)
        opened = threading.Event()
        moved: tuple[socket.socket, BinaryIO, pb.HostEvent] | None = None
        try:
            for event in stub.Control(self._grpc_commands(opened), metadata=self._metadata):
                if not opened.is_set() and event.control_port and self._frames_wanted:
                    moved = self._connect_frames(event.control_port)
                    if moved is not None:
                        break  # closing the channel ends the gRPC stream
                opened.set()
                self._on_event(self, event)
        except grpc.RpcError as err:
            if not self._closed.is_set():
                detail = f"{err.code().name}: {err.details()}" if hasattr(err, "code") else str(err)
                self._on_broken(self, f"control stream to {self.name} ({self.address}) broke: {detail}")
            return
        except Exception as err:  # a bug in an event handler must not go silent
            log.exception("control stream handler for %s failed", self.name)
            if not self._closed.is_set():
                self._on_broken(self, f"control stream handler for {self.name} failed: {err}")
            return
        finally:
            opened.set()  # the gRPC sender, if still waiting, looks at `moved`
        if moved is not None:
            self._channel.close()
            self._run_frames(*moved)
            return
        if not self._closed.is_set():
            self._on_broken(self, f"host {self.name} ({self.address}) closed its control stream")

    def _grpc_commands(self, opened: threading.Event) -> Iterator[pb.HostCommand]:
        """The gRPC stream's commands, once the link stays on it: the attach, then the queue's."""
        while not opened.wait(0.1):
            if self._closed.is_set():
                return
        if self.on_frames or self._sock is not None or self._closed.is_set():
            return
        yield pb.HostCommand(attach=pb.SessionAttach())
        yield from self._commands()

    def _connect_frames(self, port: int) -> tuple[socket.socket, BinaryIO, pb.HostEvent] | None:
        host = host_port.split(self.address)[0]
        first = pb.HostEvent()
        try:
            sock, stream = frames.connect(host, port, self._token, first)
        except (OSError, ValueError) as err:
            log.warning("host %s: control port %s not usable (%s); staying on gRPC", self.name,
                        host_port.join(host, port), err)
            return None
        self._sock, self.on_frames = sock, True
        return sock, stream, first

    def _run_frames(self, sock: socket.socket, stream: BinaryIO, first: pb.HostEvent) -> None:
        """The stream on the control port: commands written by a sender thread, events
        read and handled here, until either side closes."""
        sender = threading.Thread(target=self._send_frames, args=(sock,), name=f"link-{self.name}-out", daemon=True)
        broken = ""
        with sock, stream:
            try:
                if self._closed.is_set():
                    return
                sender.start()
                self._on_event(self, first)
                event = pb.HostEvent()
                while frames.read_message(stream, frames.EVENT, event):
                    self._on_event(self, event)
                    event = pb.HostEvent()
                broken = f"host {self.name} ({self.address}) closed its control connection"
            except (OSError, ValueError) as err:
                broken = f"control connection to {self.name} ({self.address}) broke: {err}"
            except Exception as err:  # a bug in an event handler must not go silent
                log.exception("control stream handler for %s failed", self.name)
                broken = f"control stream handler for {self.name} failed: {err}"
            finally:
                frames.shut(sock)
        if not self._closed.is_set():
            self._on_broken(self, broken)

    def _send_frames(self, sock: socket.socket) -> None:
        """What was queued before the move, then `send` writes itself; this thread
        goes on writing only the held commands whose wait is up."""
        try:
            with self._write:
                for message in batches(self._poll, self._poll, _message):  # ends with the queue
                    frames.send_message(sock, frames.COMMAND, message)
                self._direct = sock
            while (command := self._take()) is not None:
                with self._write:
                    frames.send_message(sock, frames.COMMAND, _message([command, *self._take_held()]))
        except OSError as err:
            self._write_failed(sock, err)

    def _take_held(self) -> list[pb.HostCommand]:
        with self._lock:
            held, self._held = self._held, []
        return held

    def _write_failed(self, sock: socket.socket, err: OSError) -> None:
        if not self._closed.is_set():
            log.warning("control connection to %s failed sending: %s", self.name, err)
        frames.shut(sock)


def links_together(links: Iterable[HostLink]) -> Together:
    """`HostLink.together` for each of `links`."""
    return Together(tuple(links))


def _message(commands: list[pb.HostCommand]) -> pb.HostCommand:
    return commands[0] if len(commands) == 1 else pb.HostCommand(batch=pb.HostCommands(commands=commands))
