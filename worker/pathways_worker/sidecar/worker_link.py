"""The sidecar's one stream to its worker (`Executor.Session`).

Commands are queued and sent in order; events come back batched. The worker
may still be starting (importing jax, joining its slice's JAX job), so the
link tries again every `STARTING_RETRY_S` until the worker first answers with
its `ready` event: the gang is reported ready only after every link is, so a
longer wait here would add straight to the slice's start-up. Commands queued
meanwhile wait and are sent once it is. If the worker goes away the link says
so (`ready` clears) and reconnects with a backoff capped at one second.
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

SESSION_MESSAGE_BYTES = 256 << 20
MAX_BACKOFF_S = 1.0
STARTING_RETRY_S = 0.05


class WorkerLink:
    def __init__(
        self, address: str, on_event: Callable[[pb.WorkerEvent], None], token: str = ""
    ) -> None:
        self.address = address
        self._metadata = call_metadata(token)
        self._on_event = on_event
        self._commands: queue.SimpleQueue[pb.WorkerCommand] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self.worker_host = ""
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
        self._commands.put(command)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = STARTING_RETRY_S
        seen = False
        options = [
            ("grpc.max_send_message_length", SESSION_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", SESSION_MESSAGE_BYTES),
        ]
        while not self._stop.is_set():
            channel = grpc.insecure_channel(self.address, options=options)
            opened = threading.Event()
            ended = threading.Event()
            try:
                events = pb_grpc.ExecutorStub(channel).Session(
                    self._requests(opened, ended), metadata=self._metadata
                )
                for event in events:
                    if event.ready and not opened.is_set():
                        self.worker_host = event.host
                        log.info("worker %s at %s is ready", event.host, self.address)
                        opened.set()
                        self._ready.set()
                        backoff, seen = STARTING_RETRY_S, True
                    self.store_bytes, self.store_limit = event.store_bytes, event.store_limit
                    self._on_event(event)
            except grpc.RpcError as err:
                if opened.is_set():
                    log.error("stream to worker %s broke: %s", self.address, err.details() if hasattr(err, "details") else err)
            finally:
                ended.set()
                self._ready.clear()
                channel.close()
            self._stop.wait(backoff)
            if seen:
                backoff = min(2 * backoff, MAX_BACKOFF_S)

    def _requests(self, opened: threading.Event, ended: threading.Event) -> Iterator[pb.WorkerCommand]:
        """Commands for one stream, only once the worker said it is ready."""
        while not opened.wait(0.1):
            if ended.is_set() or self._stop.is_set():
                return

        def take() -> pb.WorkerCommand | None:
            while not ended.is_set() and not self._stop.is_set():
                try:
                    return self._commands.get(timeout=0.2)
                except queue.Empty:
                    continue
            return None

        def poll() -> pb.WorkerCommand | None:
            try:
                return self._commands.get_nowait()
            except queue.Empty:
                return None

        yield from batches(
            take, poll, lambda commands: pb.WorkerCommand(batch=pb.WorkerCommands(commands=commands))
        )
