"""One long-lived control stream from the controller to one host's sidecar.

Programs, launches and grants go down it in order; completions come back up,
batched by the host. Nothing here waits for an answer: `send` only queues, so
dispatching a program call to many hosts is parallel and never blocks on any
one of them.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.command_batches import batches
from pathways_wire.slice_token import call_metadata

log = logging.getLogger(__name__)

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
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"link-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, command: pb.HostCommand) -> None:
        self._queue.put(command)

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._queue.put(None)
            self._channel.close()

    def _commands(self) -> Iterator[pb.HostCommand]:
        """What is queued, a batch per message (`command_batches`)."""

        def poll() -> pb.HostCommand | None:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return None
            if item is None:
                self._queue.put(None)  # closing: the next take ends the stream
            return item

        return batches(
            self._queue.get, poll, lambda commands: pb.HostCommand(batch=pb.HostCommands(commands=commands))
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
