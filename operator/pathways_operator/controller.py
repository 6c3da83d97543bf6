"""The controller: resource manager and island scheduler behind one lock.

It owns three tables — slices (gangs of hosts), programs (loaded IR bound to
slices) and calls (running program calls) — and turns client requests into
host commands:

* `create_slice` places a whole gang on one island (`core.placement`) before
  any host exists, then starts all of its hosts; a slice that does not fit
  waits, holding nothing, until room appears or its timeout passes.
* `run` computes each host's launch (which values it sends where, which it
  expects and from how many hosts — once per program and set of gangs, then
  stamped with each call's id), adds the call's small inputs to it, submits
  the call's computations to the island scheduler and streams every host its
  grants. From then on hosts run on their own; the controller only counts the
  batched completions that come back, keeps the small outputs they carry
  inline, and hands out more grants.
* `run_to_end` is the whole call in one round trip for a client whose inputs
  and outputs are small: it answers when the call ended, with the outputs,
  and frees the call itself.
* A host that dies fails the calls on its slice at once (every other host of
  those calls is told, so nothing waits forever) and the whole gang is
  relaunched, as JobSet recreates a job's pods.
* Every slice has a token (`pathways_wire.slice_token`) its hosts demand on
  every call: the controller makes one per embedded slice (the operator reads
  a VirtualSlice's from its Secret), presents it on its control streams, hands
  it to its clients in `SliceInfo` and `RunReply.host_tokens`, and puts the
  receiving slice's token on every `Route`, so a slice's hosts can push only
  where the program sends values.

The host launcher is pluggable: local processes for the embedded runtime,
pods on Kubernetes.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb
from pathways_wire.slice_token import new_token
from pathways_wire.wording import plural
from pathways_operator.core.call_tracking import CallProgress, CallState, GangState, check_gang_move
from pathways_operator.core.island_scheduler import Grant, IslandScheduler, ScheduledComputation
from pathways_operator.core.placement import GangRequest, Machine, Placement, Unplaceable, place_gang
from pathways_operator.host_link import HostLink

log = logging.getLogger(__name__)


class ControllerError(Exception):
    """A request the controller refuses; `code` maps onto a gRPC status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Host(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def sidecar_address(self) -> str: ...


@dataclass(frozen=True)
class HostRequest:
    """One host of a gang for a launcher to start."""

    slice_name: str
    slice_id: str
    index: int
    num_hosts: int
    devices: int
    machine: str
    token: str = ""
    """The slice token the host must demand of its callers."""


class HostLauncher(Protocol):
    def launch(self, requests: Sequence[HostRequest]) -> Sequence[Host]: ...

    def stop(self, hosts: Sequence[Host]) -> None: ...


@dataclass
class SliceRecord:
    key: str
    slice_id: str
    decl: ir.SliceDecl
    placement: Placement
    hosts: list[Host] = field(default_factory=list)
    links: list[HostLink] = field(default_factory=list)
    generation: int = 0
    clients: set[str] = field(default_factory=set)
    loaded: set[str] = field(default_factory=set)
    gang: GangState = "launching"
    failure: str = ""
    """Why the gang could not be launched again (gang ``failed``)."""
    token: str = ""

    @property
    def ready(self) -> bool:
        return self.gang == "ready"

    def move(self, new: GangState, failure: str = "") -> None:
        self.gang = check_gang_move(self.decl.name, self.gang, new)
        self.failure = failure

    def info(self) -> pb.SliceInfo:
        """What a client of the slice learns, its token included (`Describe` strips it)."""
        return pb.SliceInfo(
            slice_id=self.slice_id,
            token=self.token,
            name=self.decl.name,
            island=self.placement.island,
            devices=self.decl.devices,
            generation=self.generation,
            hosts=[
                pb.HostInfo(
                    index=i,
                    address=h.sidecar_address,
                    node=self.placement.hosts[i].machine,
                    devices=self.placement.hosts[i].devices,
                )
                for i, h in enumerate(self.hosts)
            ],
        )


@dataclass
class ProgramRecord:
    program_id: str
    program: ir.Program
    bindings: dict[str, str]
    schedule: list[ScheduledComputation] | None = None
    """The scheduler's view of a call, the same for every call."""
    launch_plan: tuple[tuple[tuple[str, str, int], ...], pb.RunReply, dict[str, list[pb.Launch]]] | None = None
    """Launches for the gangs (virtual slice, slice id, generation) they were planned for."""


@dataclass
class CallRecord:
    """A call in flight: its progress (decided in :mod:`core.call_tracking`) and its inline outputs."""

    program: ProgramRecord
    progress: CallProgress
    started: float = field(default_factory=time.monotonic)
    values: dict[tuple[int, int], pb.InlineValue] = field(default_factory=dict)
    """Outputs that came back inline with their completions."""

    @property
    def call_id(self) -> str:
        return self.progress.call_id

    def status(self, message: str = "") -> pb.CallStatus:
        p = self.progress
        return pb.CallStatus(call_id=p.call_id, state=_CALL_STATES[p.state], message=p.message or message,
                             completed=p.completed, total=p.total)


_CALL_STATES: dict[CallState, pb.CallStatus.State.ValueType] = {
    "running": pb.CallStatus.RUNNING,
    "succeeded": pb.CallStatus.SUCCEEDED,
    "failed": pb.CallStatus.FAILED,
}


def _gang_requests(record: SliceRecord) -> list[HostRequest]:
    return [
        HostRequest(
            slice_name=record.decl.name,
            slice_id=record.slice_id,
            index=a.index,
            num_hosts=len(record.placement.hosts),
            devices=a.devices,
            machine=a.machine,
            token=record.token,
        )
        for a in record.placement.hosts
    ]


SHARED_WINDOW = 8
"""Grants outstanding per slice while several calls compete for it: few enough
that a call re-entering after its previous call ended waits behind little, so
stride order (not grant-time FIFO) decides the shares."""

INLINE_OUTPUT_BYTES = 64 << 10
"""Outputs up to this size come back inline with their completion (single-host slices)."""


class Controller:
    def __init__(
        self,
        machines: Callable[[], list[Machine]],
        launcher: HostLauncher | None,
        window: int = 256,
        shared_window: int = SHARED_WINDOW,
        explain_missing: Callable[[str], str] | None = None,
    ) -> None:
        self._machines = machines
        self._launcher = launcher
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._slices: dict[str, SliceRecord] = {}
        self._programs: dict[str, ProgramRecord] = {}
        self._calls: dict[str, CallRecord] = {}
        self._scheduler = IslandScheduler(window=window, shared_window=min(window, shared_window))
        self._next_slice = 0
        self._explain_missing = explain_missing
        self.computations_dispatched = 0

    def contended_grants(self) -> dict[float, int]:
        """Grants made on slices other calls were waiting for, by weight (the shares between programs)."""
        with self._lock:
            return self._scheduler.contended_grants

    # ------------------------------------------------------------ slices

    def _free_machines(self, exclude: str = "") -> list[Machine]:
        used: dict[str, int] = defaultdict(int)
        for rec in self._slices.values():
            if rec.key == exclude:
                continue
            for a in rec.placement.hosts:
                used[a.machine] += a.devices
        return [
            Machine(m.name, m.island, m.allocatable_devices, m.used_devices + used[m.name], m.schedulable)
            for m in self._machines()
        ]

    def create_slice(
        self, decl: ir.SliceDecl, client: str, timeout_s: float, namespace: str = ""
    ) -> pb.SliceInfo:
        shared = decl.id == decl.name
        deadline = time.monotonic() + max(timeout_s, 0.0)
        if self._launcher is None:
            return self._attach_external(decl, client, namespace or "default", deadline)
        key = decl.name if shared else f"{client}/{decl.id}"
        with self._changed:
            while True:
                rec = self._slices.get(key)
                if rec is not None:
                    if rec.decl.devices != decl.devices:
                        raise ControllerError(
                            "INVALID_ARGUMENT",
                            f"slice '{decl.name}' exists with {plural(rec.decl.devices, 'device')}; "
                            f"a program asked for {decl.devices}. Use another name or the same size",
                        )
                    rec.clients.add(client)
                    self._wait_ready(rec, deadline)
                    return rec.info()
                request = GangRequest(
                    slice=decl.name,
                    devices=decl.devices,
                    devices_per_host=decl.devices_per_host or None,
                    island=decl.island or None,
                )
                outcome = place_gang(request, self._free_machines())
                if isinstance(outcome, Placement):
                    break
                if not outcome.retryable:
                    raise ControllerError("FAILED_PRECONDITION", outcome.message)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ControllerError(
                        "RESOURCE_EXHAUSTED",
                        f"{outcome.message} (waited {timeout_s:.0f} s for room)",
                    )
                self._changed.wait(min(remaining, 1.0))
            self._next_slice += 1
            rec = SliceRecord(
                key=key,
                slice_id=f"{decl.name}-{self._next_slice}",
                decl=decl,
                placement=outcome,
                clients={client},
                token=new_token(),
            )
            self._slices[key] = rec
        try:
            self._launch(rec)
        except Exception as err:
            with self._changed:
                self._slices.pop(key, None)
                self._changed.notify_all()
            raise ControllerError(
                "UNAVAILABLE", f"slice '{decl.name}' could not start its hosts: {err}"
            ) from err
        return rec.info()

    def _wait_ready(self, rec: SliceRecord, deadline: float) -> None:
        while not rec.ready:
            if rec.gang == "failed":
                raise ControllerError("UNAVAILABLE", rec.failure)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ControllerError(
                    "UNAVAILABLE", f"slice '{rec.decl.name}' is not ready (hosts starting)"
                )
            self._changed.wait(min(remaining, 1.0))

    def _attach_external(
        self, decl: ir.SliceDecl, client: str, namespace: str, deadline: float
    ) -> pb.SliceInfo:
        """Kubernetes: a named slice is a VirtualSlice whose gang the operator registers."""
        key = f"{namespace}/{decl.name}"
        with self._changed:
            while True:
                rec = self._slices.get(key)
                if rec is not None and rec.ready:
                    if rec.decl.devices != decl.devices:
                        raise ControllerError(
                            "INVALID_ARGUMENT",
                            f"VirtualSlice {key} has {plural(rec.decl.devices, 'device')}; the program "
                            f"asked for {decl.devices}",
                        )
                    rec.clients.add(client)
                    return rec.info()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    why = self._explain_missing(key) if self._explain_missing else "not registered"
                    raise ControllerError(
                        "UNAVAILABLE", f"VirtualSlice {key} is not Ready: {why}"
                    )
                self._changed.wait(min(remaining, 1.0))

    def register_gang(
        self, key: str, decl: ir.SliceDecl, placement: Placement, hosts: Sequence[Host],
        token: str = "",
    ) -> None:
        """The operator launched (or relaunched) the gang of VirtualSlice `key`,
        whose hosts demand `token` (from the VirtualSlice's Secret)."""
        with self._changed:
            rec = self._slices.get(key)
            if rec is not None and [h.sidecar_address for h in rec.hosts] == [
                h.sidecar_address for h in hosts
            ] and rec.ready and rec.token == token:
                return
        if rec is not None:
            self.gang_lost(key, "the gang was replaced")
        with self._changed:
            rec = self._slices.get(key)
            if rec is None:
                self._next_slice += 1
                rec = SliceRecord(
                    key=key, slice_id=f"{decl.name}-{self._next_slice}", decl=decl, placement=placement
                )
                self._slices[key] = rec
            rec.placement = placement
            rec.decl = decl
            rec.token = token
        self._attach_hosts(rec, list(hosts))

    def gang_lost(self, key: str, reason: str) -> None:
        """The operator saw the gang of `key` fail; it will register a new one."""
        with self._lock:
            rec = self._slices.get(key)
        if rec is not None and rec.hosts:
            self._drop_gang(rec, rec.hosts[0].name, reason)

    def unregister_gang(self, key: str) -> None:
        with self._lock:
            rec = self._slices.get(key)
        if rec is None:
            return
        if rec.hosts:
            self._drop_gang(rec, rec.hosts[0].name, "the VirtualSlice was deleted")
        with self._changed:
            self._slices.pop(key, None)
            self._changed.notify_all()

    def _launch(self, rec: SliceRecord) -> None:
        """Start every host of the gang (outside the lock), then open links."""
        assert self._launcher is not None
        hosts = list(self._launcher.launch(_gang_requests(rec)))
        self._attach_hosts(rec, hosts)

    def _attach_hosts(self, rec: SliceRecord, hosts: list[Host]) -> None:
        links = [
            HostLink(
                h.sidecar_address,
                h.name,
                rec.slice_id,
                self._on_host_event,
                self._on_link_broken,
                rec.token,
            )
            for h in hosts
        ]
        with self._changed:
            released = rec.gang == "released"
            if not released:
                rec.hosts = hosts
                rec.links = links
                rec.generation += 1
                rec.loaded = set()
                rec.move("ready")
                for link in links:
                    link.start()
                self._changed.notify_all()
        if released:  # its last client let it go while its hosts started
            if self._launcher is not None:
                self._launcher.stop(hosts)
            return
        log.info(
            "slice %s ready on %s: %s", rec.decl.name, rec.placement.island,
            ", ".join(h.sidecar_address for h in hosts),
        )

    def release_slice(self, slice_id: str, client: str) -> None:
        with self._changed:
            rec = self._by_id(slice_id)
            if rec is None:
                return
            rec.clients.discard(client)
            if rec.clients or self._launcher is None:
                return
            del self._slices[rec.key]
            hosts, links = rec.hosts, rec.links
            rec.move("released")
            self._changed.notify_all()
        for link in links:
            link.close()
        if self._launcher is not None:
            self._launcher.stop(hosts)

    def _by_id(self, slice_id: str) -> SliceRecord | None:
        for rec in self._slices.values():
            if rec.slice_id == slice_id:
                return rec
        return None

    # ------------------------------------------------------------ programs

    def load_program(self, program: ir.Program, bindings: dict[str, str]) -> str:
        with self._lock:
            for decl in program.slices:
                physical = bindings.get(decl.id)
                rec = self._by_id(physical) if physical else None
                if rec is None:
                    raise ControllerError(
                        "INVALID_ARGUMENT",
                        f"program '{program.name}': virtual slice '{decl.name}' is bound to "
                        f"{physical!r}, which is not a live slice; create it first",
                    )
                if rec.decl.devices != decl.devices:
                    raise ControllerError(
                        "INVALID_ARGUMENT",
                        f"program '{program.name}': slice '{decl.name}' needs {decl.devices} "
                        f"devices but is bound to '{rec.decl.name}' with {rec.decl.devices}",
                    )
            for comp in program.computations:
                if comp.slice not in bindings:
                    raise ControllerError(
                        "INVALID_ARGUMENT",
                        f"program '{program.name}': {comp.describe()} names an undeclared slice",
                    )
            digest = hashlib.sha256(program.fingerprint.encode())
            for k in sorted(bindings):
                digest.update(f"{k}={bindings[k]};".encode())
            program_id = f"{program.name}-{digest.hexdigest()[:16]}"
            self._programs[program_id] = ProgramRecord(program_id, program, dict(bindings))
            return program_id

    def run(
        self,
        program_id: str,
        call_id: str,
        weight: float,
        inputs: Sequence[pb.InlineValue] = (),
    ) -> pb.RunReply:
        with self._changed:
            prec = self._programs.get(program_id)
            if prec is None:
                raise ControllerError("NOT_FOUND", f"program {program_id} is not loaded")
            if call_id in self._calls:
                raise ControllerError("ALREADY_EXISTS", f"call {call_id} is already running")
            program = prec.program
            slices: dict[str, SliceRecord] = {}
            for vid, physical in prec.bindings.items():
                rec = self._by_id(physical)
                if rec is None:
                    raise ControllerError(
                        "FAILED_PRECONDITION",
                        f"program '{program.name}': slice {physical} was released",
                    )
                self._wait_ready(rec, time.monotonic() + 120)
                slices[vid] = rec
            reply, launches = self._launches(prec, slices, call_id, inputs)
            record = CallRecord(
                program=prec,
                progress=CallProgress(
                    call_id=call_id,
                    program=program.name,
                    slices=frozenset(rec.slice_id for rec in slices.values()),
                    total=len(program.computations),
                ),
            )
            self._calls[call_id] = record
            for vid, rec in slices.items():
                if program_id not in rec.loaded:
                    host_program = _host_program(program, program_id, vid)
                    for link in rec.links:
                        link.send(pb.HostCommand(load=host_program))
                    rec.loaded.add(program_id)
                for link, launch in zip(rec.links, launches[vid]):
                    link.send(pb.HostCommand(launch=launch))
            if prec.schedule is None:
                prec.schedule = [
                    ScheduledComputation(
                        node=c.index,
                        slice_id=prec.bindings[c.slice],
                        deps=tuple(sorted({v.node for v in c.inputs if not v.is_program_input})),
                    )
                    for c in program.computations
                ]
            self._scheduler.submit(call_id, weight if weight > 0 else 1.0, prec.schedule)
            self._dispatch_grants()
            return reply

    def _launches(
        self,
        prec: ProgramRecord,
        slices: dict[str, SliceRecord],
        call_id: str,
        inputs: Sequence[pb.InlineValue],
    ) -> tuple[pb.RunReply, dict[str, list[pb.Launch]]]:
        """The call's launches: the program's plan for these gangs, stamped with the call."""
        gangs = tuple(sorted((vid, rec.slice_id, rec.generation) for vid, rec in slices.items()))
        if prec.launch_plan is None or prec.launch_plan[0] != gangs:
            reply, launches = _plan_call(prec.program, "", prec.program_id, slices)
            for vid, rec in slices.items():
                if len(rec.hosts) == 1:
                    for launch in launches[vid]:
                        launch.inline_output_bytes = INLINE_OUTPUT_BYTES
            prec.launch_plan = (gangs, reply, launches)
        _, template, planned = prec.launch_plan
        consumers: dict[int, set[str]] = defaultdict(set)
        if inputs:
            for c in prec.program.computations:
                for v in c.inputs:
                    if v.is_program_input:
                        consumers[v.index].add(c.slice)
        stamped: dict[str, list[pb.Launch]] = {}
        for vid, per_host in planned.items():
            launch = pb.Launch()
            launch.CopyFrom(per_host[0])
            launch.call_id = call_id
            launch.inputs.extend(x for x in inputs if vid in consumers[x.value.index])
            stamped[vid] = [launch] * len(per_host)
        reply = pb.RunReply()
        reply.CopyFrom(template)
        for x in inputs:
            if 0 <= x.value.index < len(reply.inputs):
                del reply.inputs[x.value.index].hosts[:]  # it came with the call
        return reply, stamped

    def run_to_end(
        self,
        program_id: str,
        call_id: str,
        weight: float,
        inputs: Sequence[pb.InlineValue],
        wait_s: float,
    ) -> pb.RunReply:
        """Runs the call and answers when it ended, with its inline outputs.

        A call that ended with every output inline (or failed) is freed here,
        so the client owes no FinishCall (`released`)."""
        reply = self.run(program_id, call_id, weight, inputs)
        status = self.wait_call(call_id, wait_s)
        reply.status.CopyFrom(status)
        with self._lock:
            call = self._calls.get(call_id)
            if call is None:
                return reply
            complete = True
            for ref in call.program.program.outputs:
                if ref.is_program_input:
                    continue  # the client has it
                value = call.values.get((ref.node, ref.index))
                if value is None:
                    complete = False  # the client fetches it from the hosts
                else:
                    reply.values.append(value)
        if status.state == pb.CallStatus.FAILED or (
            complete and status.state == pb.CallStatus.SUCCEEDED
        ):
            self.finish_call(call_id)
            reply.released = True
        return reply

    def _dispatch_grants(self) -> None:
        grants = self._scheduler.grants()
        if not grants:
            return
        per_slice: dict[str, list[Grant]] = defaultdict(list)
        for g in grants:
            per_slice[g.slice_id].append(g)
        for slice_id, items in per_slice.items():
            rec = self._by_id(slice_id)
            if rec is None:
                continue
            batch = pb.GrantBatch(
                grants=[pb.Grant(seq=g.seq, call_id=g.call_id, node=g.node) for g in items]
            )
            for g in items:
                call = self._calls.get(g.call_id)
                if call is not None:
                    call.progress.granted((slice_id, g.seq), len(rec.links))
            for link in rec.links:
                link.send(pb.HostCommand(grants=batch))
            self.computations_dispatched += len(items)

    # ------------------------------------------------------------ host events

    def _slice_of_link(self, link: HostLink) -> SliceRecord | None:
        """The slice whose current gang `link` belongs to (None for a replaced gang's link)."""
        rec = self._by_id(link.slice_id)
        return rec if rec is not None and link in rec.links else None

    def _on_host_event(self, link: HostLink, event: pb.HostEvent) -> None:
        if not event.completions:
            return
        with self._changed:
            rec = self._slice_of_link(link)
            if rec is None:
                return
            for done in event.completions:
                call = self._calls.get(done.call_id)
                key = (rec.slice_id, done.seq)
                if call is None:
                    self._scheduler_complete(rec.slice_id, done.seq)
                    continue
                for value in done.outputs:
                    call.values[(value.value.node, value.value.index)] = value
                report = call.progress.report(key, link.name, done.ok, done.error, done.node)
                if report is None:
                    continue
                if report.failed_now:
                    self._tell_failed(call, report.failed_now)
                if report.grant_done:
                    self._scheduler_complete(rec.slice_id, done.seq)
            self._dispatch_grants()
            self._changed.notify_all()

    def _scheduler_complete(self, slice_id: str, seq: int) -> None:
        try:
            self._scheduler.complete(slice_id, seq)
        except (KeyError, ValueError):
            pass  # the slice was reset since this grant; nothing is outstanding

    def _fail_call(self, call: CallRecord, message: str) -> None:
        call.progress.fail(message)
        self._tell_failed(call, message)

    def _tell_failed(self, call: CallRecord, message: str) -> None:
        """The call has failed: the scheduler drops its grants and its hosts stop waiting for it."""
        self._scheduler.cancel(call.call_id)
        fail = pb.HostCommand(fail=pb.FailCall(call_id=call.call_id, message=message))
        for slice_id in call.progress.slices:
            rec = self._by_id(slice_id)
            if rec is not None:
                for link in rec.links:
                    link.send(fail)
        self._changed.notify_all()

    def _on_link_broken(self, link: HostLink, reason: str) -> None:
        with self._lock:
            rec = self._slice_of_link(link)
        if rec is not None:
            self.host_failed(rec.slice_id, link.name, reason)

    def host_failed(self, slice_id: str, host_name: str, reason: str) -> None:
        """A host of `slice_id` is gone: fail its calls, relaunch the gang."""
        with self._lock:
            rec = self._by_id(slice_id)
        if rec is None or not rec.ready:
            return
        if self._launcher is None:
            # on Kubernetes the operator recreates the gang and registers it again
            self._drop_gang(rec, host_name, reason)
            return
        hosts = self._drop_gang(rec, host_name, reason)
        self._launcher.stop(hosts)
        threading.Thread(target=self._relaunch, args=(rec,), daemon=True).start()

    def _drop_gang(self, rec: SliceRecord, host_name: str, reason: str) -> list[Host]:
        """Fail every call on the gang, close its links; returns its hosts."""
        slice_id = rec.slice_id
        with self._changed:
            if not rec.ready:
                return []
            rec.move("lost")
            affected = self._scheduler.reset_slice(slice_id)
            for call in self._calls.values():
                if call.progress.running and (
                    slice_id in call.progress.slices or call.call_id in affected
                ):
                    self._fail_call(
                        call,
                        f"program '{call.program.program.name}' call {call.call_id}: host "
                        f"{host_name} of slice '{rec.decl.name}' failed ({reason}); "
                        "the slice is being relaunched",
                    )
                call.progress.forget_slice(slice_id)
            hosts, links = rec.hosts, rec.links
            rec.hosts, rec.links = [], []
            self._changed.notify_all()
        log.warning("slice %s: %s failed (%s); dropping the gang", rec.decl.name, host_name, reason)
        for link in links:
            link.close()
        return hosts

    def _relaunch(self, rec: SliceRecord) -> None:
        try:
            self._launch(rec)
        except Exception as err:
            with self._changed:
                if rec.gang == "lost":
                    rec.move("failed", f"slice '{rec.decl.name}' could not be relaunched: {err}")
                self._changed.notify_all()
            log.error("slice '%s' could not be relaunched: %s", rec.decl.name, err)

    # ------------------------------------------------------------ calls

    def wait_call(self, call_id: str, timeout_s: float) -> pb.CallStatus:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._changed:
            while True:
                call = self._calls.get(call_id)
                if call is None:
                    return pb.CallStatus(call_id=call_id, state=pb.CallStatus.UNKNOWN,
                                         message=f"call {call_id} is not known")
                if not call.progress.running:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(min(remaining, 1.0))
            return call.status(self._stragglers(call) if call.progress.running else "")

    def _stragglers(self, call: CallRecord) -> str:
        """For a call still running: which hosts owe which granted computations."""
        gangs: dict[str, list[tuple[str, str]]] = {}
        for slice_id in {k[0] for k in call.progress.waiting}:
            rec = self._by_id(slice_id)
            if rec is not None:
                gangs[slice_id] = [(link.name, f"{link.name} ({link.address})") for link in rec.links]
        return call.progress.stragglers(gangs)

    def finish_call(self, call_id: str) -> pb.CallStatus:
        with self._changed:
            call = self._calls.pop(call_id, None)
            if call is None:
                return pb.CallStatus(call_id=call_id, state=pb.CallStatus.UNKNOWN)
            if call.progress.running:
                self._fail_call(call, f"call {call_id} was abandoned by its client")
            release = pb.HostCommand(release=pb.ReleaseCall(call_id=call_id))
            for slice_id in call.progress.slices:
                rec = self._by_id(slice_id)
                if rec is not None:
                    for link in rec.links:
                        link.send(release)
            return call.status()

    def describe(self) -> pb.ClusterInfo:
        with self._lock:
            machines = self._free_machines()
            islands: dict[str, list[Machine]] = defaultdict(list)
            for m in machines:
                islands[m.island].append(m)
            return pb.ClusterInfo(
                islands=[
                    pb.IslandInfo(
                        name=name,
                        devices=sum(m.allocatable_devices for m in ms),
                        free_devices=sum(m.allocatable_devices - m.used_devices for m in ms),
                        devices_per_host=max(m.allocatable_devices for m in ms),
                    )
                    for name, ms in sorted(islands.items())
                ],
                slices=[_without_token(rec.info()) for rec in self._slices.values()],
            )

    def close(self) -> None:
        with self._changed:
            records = list(self._slices.values())
            self._slices.clear()
            self._changed.notify_all()
        for rec in records:
            for link in rec.links:
                link.close()
            if self._launcher is not None:
                self._launcher.stop(rec.hosts)


def _without_token(info: pb.SliceInfo) -> pb.SliceInfo:
    """`Describe` answers anyone who reaches the controller: no tokens in it."""
    info.token = ""
    return info


def _host_program(program: ir.Program, program_id: str, vslice: str) -> pb.HostProgram:
    """The program as one host of `vslice` sees it: only its own artifacts."""
    msg = program.to_proto()
    for comp in msg.computations:
        if comp.slice != vslice:
            comp.artifact = b""
    return pb.HostProgram(program_id=program_id, program=msg, slice=vslice)


def _plan_call(
    program: ir.Program,
    call_id: str,
    program_id: str,
    slices: dict[str, SliceRecord],
) -> tuple[pb.RunReply, dict[str, list[pb.Launch]]]:
    """Per-host launches for one call: routes, expected senders and outputs."""
    addresses = {vid: [h.sidecar_address for h in rec.hosts] for vid, rec in slices.items()}
    tokens = {a: rec.token for vid, rec in slices.items() for a in addresses[vid]}
    consumers = program.consumers()
    producer_slice = {
        ir.ValueRef(c.index, i): c.slice
        for c in program.computations
        for i in range(len(c.outputs))
    }
    routes: dict[str, dict[ir.ValueRef, list[str]]] = defaultdict(dict)
    expects: dict[str, dict[ir.ValueRef, int]] = defaultdict(dict)
    input_hosts: dict[int, list[str]] = defaultdict(list)
    for ref, nodes in consumers.items():
        for node in nodes:
            target = program.computations[node].slice
            if ref.is_program_input:
                for a in addresses[target]:
                    if a not in input_hosts[ref.index]:
                        input_hosts[ref.index].append(a)
                continue
            source = producer_slice[ref]
            if source == target:
                continue
            dests = routes[source].setdefault(ref, [])
            for a in addresses[target]:
                if a not in dests:
                    dests.append(a)
            expects[target][ref] = len(addresses[source])
    outputs_by_slice: dict[str, list[ir.ValueRef]] = defaultdict(list)
    reply = pb.RunReply(host_tokens={a: t for a, t in tokens.items() if t})
    for ref in program.outputs:
        if ref.is_program_input:
            reply.outputs.add()
            continue
        source = producer_slice[ref]
        if ref not in outputs_by_slice[source]:
            outputs_by_slice[source].append(ref)
        reply.outputs.add(hosts=addresses[source])
    for i in range(len(program.inputs)):
        reply.inputs.add(hosts=input_hosts.get(i, []))
    launches: dict[str, list[pb.Launch]] = {}
    for vid in slices:
        launch = pb.Launch(
            call_id=call_id,
            program_id=program_id,
            routes=[
                pb.Route(
                    value=ref.to_proto(), destinations=dests,
                    destination_tokens=[tokens[a] for a in dests],
                )
                for ref, dests in sorted(routes[vid].items())
            ],
            expects=[
                pb.Expect(value=ref.to_proto(), senders=n) for ref, n in sorted(expects[vid].items())
            ],
            outputs=[ref.to_proto() for ref in outputs_by_slice[vid]],
        )
        launches[vid] = [launch] * len(addresses[vid])
    return reply, launches
