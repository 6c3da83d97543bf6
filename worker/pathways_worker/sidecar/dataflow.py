"""The sidecar's core: between the controller, the worker, peers and clients.

* Control: plans and grants from the controller go to the worker in the order
  received; each Launch's routes (where this host's values must go) and
  expects (how many hosts will send each value here) are remembered;
  completions from the worker go back up, batched.
* Put: pieces from clients and peer sidecars are assembled by the inbox and
  handed to the worker as arrivals.
* Data channel: peer sidecars send routed values over raw TCP
  (`pathways_worker.sidecar.data_channel`), or on the same machine hand over the
  files; its pieces go to the same inbox as Put's.
* Exports: a routed value the worker wrote to shared memory is pushed to its
  destinations; a fetched one is streamed back to the client. An object the
  controller forwards (`Forward`: another slice's call reads it) is routed
  the same way, once, as that call's program input.

Errors that a caller should see carry a gRPC status code (`HostError`); the
service turns them into the RPC's status.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import grpc

from pathways_wire import host_port
from pathways_wire.command_batches import each_alone
from pathways_wire.transfer import MAX_CHUNK_BYTES, TransferError, check_header, value_name
from pathways_wire import pathways_pb2 as pb
from pathways_worker import coordinator_file
from pathways_worker.batch_queue import BatchQueue
from pathways_worker.settings import SidecarSettings
from pathways_worker.shared_memory import ShmDir, exported_chunks, remove_pieces
from pathways_worker.sidecar.byte_budget import BudgetError, ByteBudget
from pathways_worker.sidecar.data_channel import DataChannelServer, Refusal, boot_id
from pathways_worker.sidecar.inbox import ORPHAN_S, Inbox, Sink
from pathways_worker.sidecar.peers import PeerPusher
from pathways_worker.sidecar.transfer_stats import TransferStats
from pathways_worker.sidecar.worker_link import WorkerLink
from pathways_worker.value_ref import Ref, ref_of

log = logging.getLogger(__name__)

DEFAULT_FETCH_TIMEOUT_S = 300.0
MAX_FETCH_TIMEOUT_S = 600.0
"""The longest a fetch waits for its value, whatever its request asks: a client fetches an
output once its call ended, and a serving thread is not held for longer."""
ORPHAN_SWEEP_S = 10.0
"""How often values whose call never came are looked for (`Dataflow.release_orphans`)."""
COMPLETION_LINGER_S = 0.0
"""The worker batches completions already (and sends a call's last one at once);
lingering here again only delays the end of every call."""
HEALTH_WAIT_MAX_S = 10.0
"""The longest a Health call waits for the worker to be ready (`HealthRequest.wait_ready_s`)."""
HEALTH_WAITERS = 4
"""Health calls that may wait at once. Health needs no token, so the waits are bounded:
beyond these, a call is answered at once, and no caller can hold the server's threads."""


class HostError(Exception):
    """An error for the caller of an RPC, with the status code it should get."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


Destinations = tuple[tuple[str, ...], tuple[pb.Region, ...]]
"""A routed value's destination addresses and, per address, the block it reads
(none: every one reads the whole value)."""


@dataclass
class _FetchWaiter:
    event: threading.Event = field(default_factory=threading.Event)
    exported: pb.Exported | None = None


class Dataflow:
    def __init__(self, settings: SidecarSettings) -> None:
        self.settings = settings
        self.host_name = settings.host_name
        self.advertise = settings.advertise or settings.listen
        self.shm = ShmDir(settings.shm_dir, "s")
        self.budget = ByteBudget(settings.store_limit_bytes)
        self.transfers = TransferStats()
        self.upstream: BatchQueue[pb.Completion] = BatchQueue()
        self._control_write: Callable[[pb.HostEvent], None] | None = None
        """Writes an event on the current control stream from any thread (`attach_control`)."""
        self.pusher = PeerPusher(
            sender=settings.host_name,
            shm_dir=self.shm.path,
            token=settings.data_token,
            data_channel=settings.data_channel,
            file_handover=settings.file_handover,
            transfers=self.transfers,
            done_with=self.shm.recycle_pieces,
            maps=self.shm.read_maps,
        )
        self._lock = threading.Lock()
        self._routes: dict[tuple[str, Ref], Destinations] = {}
        self._forwards: dict[tuple[str, Ref], Destinations] = {}
        """(reading call, its program input) -> destinations, until pushed once."""
        self._released: set[str] = set()
        self._fetches: dict[int, _FetchWaiter] = {}
        self._tokens = itertools.count(1)
        self._control = 0
        self.control_port = 0
        """The raw control port offered to the controller (`session_frames`); 0: none."""
        self.link = WorkerLink(settings.worker, self._on_worker_event, settings.slice_token,
                               frames_wanted=settings.session_frames)
        self._health_waiters = threading.BoundedSemaphore(HEALTH_WAITERS)
        self.inbox = Inbox(
            self.shm,
            self.budget,
            deliver=lambda arrival: self.link.send(pb.WorkerCommand(arrival=arrival)),
            host_name=settings.host_name,
            wait_s=settings.put_wait_s,
            handover=settings.file_handover,
        )
        self._closed = threading.Event()
        threading.Thread(target=self._sweep_orphans, name="orphan-sweep", daemon=True).start()
        self._node = boot_id()
        self._shm_device = os.stat(self.shm.path).st_dev
        self.data_server = DataChannelServer(
            host_port.split(settings.listen)[0], settings.data_port, self.inbox,
            settings.host_name, settings.data_token, self.transfers,
            insecure=settings.insecure_no_token, fetch=self.fetched,
        )

    def close(self) -> None:
        self._closed.set()
        self.data_server.close()
        self.link.stop()
        self.pusher.close()
        coordinator_file.remove(self.shm.path)
        self.shm.cleanup()

    def tell_coordinator(self, address: str) -> None:
        """The slice's JAX coordinator address, for a worker started without one
        (`pathways_worker.coordinator_file`); the same address again is a no-op."""
        try:
            if coordinator_file.write(self.shm.path, address):
                log.info("%s: JAX coordinator %s passed to the worker", self.host_name, address)
        except ValueError as err:
            raise HostError(grpc.StatusCode.INVALID_ARGUMENT, f"host {self.host_name}: {err}") from None
        except coordinator_file.CoordinatorConflict as err:
            raise HostError(grpc.StatusCode.FAILED_PRECONDITION, f"host {self.host_name}: {err}") from None

    def release_orphans(self, max_age_s: float = ORPHAN_S) -> list[str]:
        """Releases, here and in the worker, each call whose values came more than
        `max_age_s` ago but that no launch has named (`Inbox.orphaned`), as the
        controller's release would; the calls released."""
        orphans = self.inbox.orphaned(max_age_s)
        for call_id in orphans:
            log.warning("%s: values of call %s came, but no launch named the call within %g s; released",
                        self.host_name, call_id, max_age_s)
            self.command(pb.HostCommand(release=pb.ReleaseCall(call_id=call_id)))
        return orphans

    def _sweep_orphans(self) -> None:
        while not self._closed.wait(ORPHAN_SWEEP_S):
            try:
                self.release_orphans()
            except Exception:  # a bug: say so, and look again next time
                log.exception("%s: releasing orphaned values failed", self.host_name)

    # ------------------------------------------------------------ control stream

    def open_control(self) -> int:
        """A new controller stream; it replaces the previous one."""
        with self._lock:
            self._control += 1
            self._control_write = None  # the stream it replaces is written no more
            return self._control

    def is_current(self, control: int) -> bool:
        return self._control == control

    def command(self, command: pb.HostCommand) -> None:
        kind = command.WhichOneof("command")
        if kind == "batch":
            with self.link.together():
                each_alone(command.batch.commands, self.command, log, "control command")
        elif kind == "load":
            self.link.send(pb.WorkerCommand(load=command.load))
        elif kind == "launch":
            launch = command.launch
            with self._lock:
                for route in launch.routes:
                    self._routes[(launch.call_id, ref_of(route.value))] = (
                        tuple(route.destinations), tuple(route.destination_blocks),
                    )
                    self.pusher.learn_tokens(route.destinations, route.destination_tokens)
            self.link.send(pb.WorkerCommand(launch=launch))
            self.inbox.expect(launch.call_id, launch.expects)
        elif kind == "grants":
            self.link.send(pb.WorkerCommand(grants=command.grants))
        elif kind == "fail":
            self.link.send(pb.WorkerCommand(fail=command.fail))
        elif kind == "release":
            call_id = command.release.call_id
            self.link.send(pb.WorkerCommand(release=command.release))
            self.inbox.release_call(call_id)
            with self._lock:
                self._released.add(call_id)
                for key in [k for k in self._routes if k[0] == call_id]:
                    del self._routes[key]
                for key in [k for k in self._forwards if k[0] == call_id]:
                    del self._forwards[key]
        elif kind == "drop":
            self.link.send(pb.WorkerCommand(drop=command.drop))
        elif kind == "forward":
            forward = command.forward
            with self._lock:
                self._forwards[(forward.call_id, ref_of(forward.input))] = (
                    tuple(forward.destinations), tuple(forward.destination_blocks),
                )
                self.pusher.learn_tokens(forward.destinations, forward.destination_tokens)
            self.link.send(pb.WorkerCommand(forward=forward))
        else:
            log.warning("ignoring empty HostCommand")

    def take_completions(
        self, timeout_s: float, control: int | None = None, sending: bool = False
    ) -> list[pb.Completion]:
        """Completions for the controller; with `control`, only while that stream is the
        current one as they are taken; with `sending`, the caller calls `upstream.sent()`
        once it wrote what it took (see `BatchQueue.take`)."""
        owner = None if control is None else (lambda: self._control == control)
        return self.upstream.take(timeout_s, COMPLETION_LINGER_S, owner=owner, sending=sending)[0]

    def attach_control(self, control: int, write: Callable[[pb.HostEvent], None]) -> None:
        """Control stream `control` can be written from any thread with `write`: the worker
        link's thread then writes the completions it receives itself, unless others are
        being written, sparing the stream's writer thread a wake-up per message."""
        with self._lock:
            if self._control == control:
                self._control_write = write

    def detach_control(self, write: Callable[[pb.HostEvent], None]) -> None:
        with self._lock:
            if self._control_write is write:
                self._control_write = None

    def _upward(self, completions: list[pb.Completion]) -> None:
        """Completions to the controller: written here where the stream allows it and no
        other batch is being written, else queued for the stream's writer."""
        write = self._control_write
        self.upstream.put_or_write(
            completions, None if write is None else lambda taken: write(pb.HostEvent(completions=taken))
        )

    # ------------------------------------------------------------ worker events

    def _on_worker_event(self, event: pb.WorkerEvent) -> None:
        """Exports first: a consumer on another slice waits for a pushed value,
        while the completions riding with it only go to the controller's count."""
        for exported in event.exported:
            if exported.token == 0:
                self._push(exported)
            else:
                self._fetched(exported)
        if event.completions:
            self._upward(list(event.completions))

    def _push(self, exported: pb.Exported) -> None:
        key = (exported.call_id, ref_of(exported.value))
        with self._lock:
            destinations, blocks = self._routes.get(key) or self._forwards.pop(key, ((), ()))
            released = exported.call_id in self._released
        if released:
            remove_pieces(exported)
            return
        self.pusher.push(exported, destinations, blocks)

    def _fetched(self, exported: pb.Exported) -> None:
        with self._lock:
            waiter = self._fetches.pop(exported.token, None)
        if waiter is None:
            remove_pieces(exported)  # the fetch gave up already
            return
        waiter.exported = exported
        waiter.event.set()

    # ------------------------------------------------------------ Put

    def put(self, chunks: Iterator[pb.BufferChunk]) -> int:
        """Consumes one Put stream; returns the pieces received."""
        sink: Sink | None = None
        pieces = 0
        try:
            for chunk in chunks:
                if len(chunk.data) > MAX_CHUNK_BYTES:
                    raise TransferError(
                        "data", f"chunk of {len(chunk.data)} B exceeds {MAX_CHUNK_BYTES} B per BufferChunk"
                    )
                if chunk.HasField("header"):
                    if sink is not None and not sink.done:
                        raise TransferError("header", "a new piece started before the previous one was complete")
                    info = check_header(chunk.header)
                    sink = self.inbox.open(info, chunk.header)
                    pieces += int(info.has_piece)
                if chunk.data:
                    if sink is None:
                        raise TransferError("data", "data chunk without a piece header before it")
                    sink.write(chunk.data)
                    self.transfers.add("in", "grpc", len(chunk.data))
            if sink is not None and not sink.done:
                raise TransferError("data", "the stream ended inside a piece")
        except TransferError as err:
            raise HostError(grpc.StatusCode.INVALID_ARGUMENT, f"host {self.host_name}: {err}") from None
        except BudgetError as err:
            raise HostError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"host {self.host_name}: {err}") from None
        return pieces

    # ------------------------------------------------------------ Fetch

    def fetch(self, request: pb.FetchRequest) -> Iterator[pb.BufferChunk]:
        """Asks the worker for this host's pieces of a value, then streams them."""
        return self._stream(self.exported_for_fetch(request))

    def fetched(self, request: pb.FetchRequest) -> pb.Exported | Refusal:
        """`exported_for_fetch` for the data channel, which sends the pieces itself."""
        try:
            return self.exported_for_fetch(request)
        except HostError as err:
            return Refusal(err.code.name, str(err))

    def exported_for_fetch(self, request: pb.FetchRequest) -> pb.Exported:
        """Asks the worker for this host's pieces of a value and waits for them; the
        caller sends them and removes their files (`remove_pieces`)."""
        what = f"{value_name(request.value)} of call {request.call_id}"
        if not request.call_id:
            raise HostError(grpc.StatusCode.INVALID_ARGUMENT, "call_id: empty")
        timeout_s = min(request.timeout_s, MAX_FETCH_TIMEOUT_S) if request.timeout_s > 0 else DEFAULT_FETCH_TIMEOUT_S
        if not self.link.wait_ready(min(timeout_s, 5.0)):
            raise HostError(
                grpc.StatusCode.UNAVAILABLE, f"host {self.host_name}: its worker is not ready"
            )
        token = next(self._tokens)
        waiter = _FetchWaiter()
        with self._lock:
            self._fetches[token] = waiter
        export = pb.ExportRequest(call_id=request.call_id, token=token, release=request.release)
        export.value.CopyFrom(request.value)
        self.link.send(pb.WorkerCommand(export=export))
        if not waiter.event.wait(timeout_s):
            with self._lock:
                self._fetches.pop(token, None)
            raise HostError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{what} was not ready on host {self.host_name} within {timeout_s:g} s",
            )
        exported = waiter.exported
        assert exported is not None
        if exported.error:
            remove_pieces(exported)
            raise HostError(grpc.StatusCode.FAILED_PRECONDITION, exported.error)
        return exported

    def _stream(self, exported: pb.Exported) -> Iterator[pb.BufferChunk]:
        try:
            for chunk in exported_chunks(exported, self.host_name):
                yield chunk
                self.transfers.add("out", "grpc", len(chunk.data))
        finally:
            remove_pieces(exported)

    # ------------------------------------------------------------ Health

    def health(self, wait_ready_s: float = 0.0) -> pb.HealthReply:
        """The host's state; with ``wait_ready_s``, once the worker is ready or that many
        seconds passed (at most `HEALTH_WAIT_MAX_S`, for `HEALTH_WAITERS` callers at once):
        a forming gang's watch learns the moment the worker is ready, with one question
        where it would ask every few tens of milliseconds."""
        if wait_ready_s > 0 and not self.link.ready and self._health_waiters.acquire(blocking=False):
            try:
                self.link.wait_ready(min(wait_ready_s, HEALTH_WAIT_MAX_S))
            finally:
                self._health_waiters.release()
        return pb.HealthReply(
            host=self.host_name,
            worker_ready=self.link.ready,
            store_bytes=self.budget.used,
            store_limit=self.budget.limit,
            worker_store_bytes=self.link.store_bytes,
            worker_store_limit=self.link.store_limit,
            data_address=host_port.join(host_port.split(self.advertise)[0], self.data_server.port),
            node=self._node,
            shm_device=self._shm_device,
        )

    def routes_of(self, call_id: str) -> Sequence[tuple[Ref, tuple[str, ...]]]:
        with self._lock:
            return [(k[1], v[0]) for k, v in self._routes.items() if k[0] == call_id]
