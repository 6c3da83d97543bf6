"""One long-lived control stream from the controller to one host's sidecar.

Programs, launches and grants go down it in order; completions come back up,
batched by the host. Nothing here waits for an answer: `send` only queues, so
dispatching a program call to many hosts is parallel and never blocks on any
one of them.

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
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.command_batches import batches
from pathways_wire.slice_token import call_metadata

log = logging.getLogger(__name__)

LATER_S = 0.02
"""How long a command sent `later` waits for company, at most: how much longer a
finished call's values may stay on its hosts."""

_WAKE = pb.HostCommand()
"""Queued to wake the sender when a held command starts its wait; never sent."""

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
    ) -> None:
        """`slice_id`: the gang the host belongs to, so events find their slice
        without a search; `token`: the host's slice token, presented on the
        control stream."""
        self.address = address
        self.slice_id = slice_id
        self._metadata = call_metadata(token)
        self.name = name
        self._on_event = on_event
        self._on_broken = on_broken
        self._queue: queue.SimpleQueue[pb.HostCommand | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._held: list[pb.HostCommand] = []
        self._held_since = 0.0
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"link-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, command: pb.HostCommand, later: bool = False) -> None:
        """Queues `command`. With `later`, holds it until the next message goes, at the
        end of that message, or until `LATER_S` passed, whichever comes first."""
        if not later:
            self._queue.put(command)
            return
        with self._lock:
            self._held.append(command)
            if len(self._held) > 1:
                return
            self._held_since = time.monotonic()
        self._queue.put(_WAKE)  # the sender starts the wait

    def _take(self) -> pb.HostCommand | None:
        """The next command to send, waiting for one; a held one once its wait is up."""
        while True:
            with self._lock:
                wait = self._held_since + LATER_S - time.monotonic() if self._held else None
                if wait is not None and wait <= 0:
                    return self._held.pop(0)
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                continue
            if item is not _WAKE:
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

    def _commands(self) -> Iterator[pb.HostCommand]:
        """What is queued, a batch per message (`command_batches`), held commands last."""
        return batches(
            self._take, self._poll, lambda commands: pb.HostCommand(batch=pb.HostCommands(commands=commands))
        )

    def _run(self) -> None:
        stub = pb_grpc.DataflowStub(self._channel)
        try:
            for event in stub.Control(self._commands(), metadata=self._metadata):
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
        if not self._closed.is_set():
            self._on_broken(self, f"host {self.name} ({self.address}) closed its control stream")
