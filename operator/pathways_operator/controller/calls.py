"""Program calls in flight: started, granted, counted, failed, waited for, freed.

`run` sends each host of the call's gangs its launch (and the program, the
first time a gang sees it), submits the call's computations to the island
scheduler and streams every host its grants. From then on hosts run on their
own; completions come back batched on the control streams, and the call table
counts them (`core.call_tracking` decides), keeps the small outputs they carry
inline, and hands out more grants. A failed call is told to every host of the
call, so nothing waits for it forever. `run_to_end` is a whole call in one
round trip for a client whose inputs and outputs are small.

Calls leave objects (`objects`): a call's outputs are entered when it starts,
a program input that names one is bound in place on the hosts that hold it
(`Launch.aliases`) and sent host to host to those of any other slice reading
it (`Forward`; the call fails if that gang is lost while it runs), and
`finish_call` keeps those its client still holds (or `wait_call` with `finish`,
which saves the client that round trip).
Clients that say `keep_alive` hold a lease (`core.client_leases`): when it
lapses, their calls and objects are freed on every host.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pathways_wire.env_flags import env_number
from pathways_wire import pathways_pb2 as pb
from pathways_wire.grant_runs import runs_of, seqs_of
from pathways_operator.controller.call_watch import CallWatch, Once
from pathways_operator.controller.errors import ControllerError
from pathways_operator.controller.host_link import HostLink, links_together
from pathways_operator.controller.objects import (
    ObjectKey, ObjectRecord, ObjectTable, object_key, object_label, object_ref,
)
from pathways_operator.controller.plans import ObjectPlacement, call_launches, host_program, place_object
from pathways_operator.controller.programs import ProgramRecord, Programs
from pathways_operator.controller.slices import SliceRecord, SliceTable
from pathways_operator.core.call_tracking import CallProgress, CallState
from pathways_operator.core.client_leases import DEFAULT_LEASE_S, lapsed
from pathways_operator.core.island_scheduler import Grant, IslandScheduler

log = logging.getLogger(__name__)

SHARED_WINDOW = 8
"""Grants outstanding per slice while several calls compete for it: few enough
that a call re-entering after its previous call ended waits behind little, so
stride order (not grant-time FIFO) decides the shares."""

SHARED_AHEAD_MS = 24.0
"""Device time kept granted ahead on a slice several tenants want, when that is
more than `SHARED_WINDOW` grants (short computations): enough to cover a
completion's trip worker -> sidecar -> controller and the next grants' trip back
on a busy machine, so the slice does not idle between them
(`PATHWAYS_SHARED_AHEAD_MS` overrides it; 0 counts grants only)."""

READY_WAIT_S = 120.0
"""How long a call waits for a gang that is being relaunched."""

_CALL_STATES: dict[CallState, pb.CallStatus.State.ValueType] = {
    "running": pb.CallStatus.RUNNING,
    "succeeded": pb.CallStatus.SUCCEEDED,
    "failed": pb.CallStatus.FAILED,
}


@dataclass
class CallRecord:
    """A call in flight: its progress (decided in :mod:`core.call_tracking`) and its inline outputs."""

    program: ProgramRecord
    progress: CallProgress
    ended: threading.Condition
    """Notified when the call ends or leaves the table: its `WaitCall`s wait here, on
    the table's lock, so a call's end wakes only those waiting for that call."""
    client: str = ""
    started: float = field(default_factory=time.monotonic)
    values: dict[tuple[int, int], pb.InlineValue] = field(default_factory=dict)
    """Outputs that came back inline with their completions."""
    sources: dict[str, list[int]] = field(default_factory=dict)
    """Slice id -> the program inputs its hosts send to this call (objects, `Forward`)."""
    watchers: list[Once] = field(default_factory=list)
    """What runs once the call ends or leaves the table (`Calls.when_ended`)."""

    def ending(self) -> list[Once]:
        """Wakes the call's waiters (the caller holds the table's lock); its watchers, to run."""
        self.ended.notify_all()
        watchers, self.watchers = self.watchers, []
        return watchers

    @property
    def call_id(self) -> str:
        return self.progress.call_id

    def status(self, message: str = "") -> pb.CallStatus:
        p = self.progress
        return pb.CallStatus(call_id=p.call_id, state=_CALL_STATES[p.state], message=p.message or message,
                             completed=p.completed, total=p.total)


class Calls:
    """The call table and the island scheduler that orders its computations."""

    def __init__(self, slices: SliceTable, programs: Programs, window: int, shared_window: int) -> None:
        self._slices = slices
        self._changed = slices.changed
        self._programs = programs
        self._calls: dict[str, CallRecord] = {}
        ahead_ms = env_number(os.environ, "PATHWAYS_SHARED_AHEAD_MS", SHARED_AHEAD_MS, minimum=0.0)
        self._scheduler = IslandScheduler(
            window=window, shared_window=min(window, shared_window), shared_ahead_s=ahead_ms / 1e3
        )
        self.dispatched = 0
        """Computations granted so far (the operator's metric)."""
        self.objects = ObjectTable()
        self._watch = CallWatch()
        self.lease_s = env_number(os.environ, "PATHWAYS_CLIENT_LEASE_S", DEFAULT_LEASE_S, positive=True)
        self._seen: dict[str, float] = {}
        """Clients holding a lease -> when they last said KeepAlive (monotonic)."""

    def contended_grants(self) -> dict[float, int]:
        """Grants made on slices other calls were waiting for, by weight (the shares between programs)."""
        with self._slices.lock:
            return self._scheduler.contended_grants

    def run(
        self,
        program_id: str,
        call_id: str,
        weight: float,
        inputs: Sequence[pb.InlineValue] = (),
        objects: Sequence[pb.ObjectInput] = (),
        client: str = "",
    ) -> pb.RunReply:
        """Starts the call; a call that cannot start raises ControllerError, which is logged."""
        try:
            return self._start(program_id, call_id, weight, inputs, objects, client)
        except ControllerError as err:
            log.info("call %s of client %s refused (%s): %s", call_id, client or "-", err.code, err)
            raise

    def _start(
        self,
        program_id: str,
        call_id: str,
        weight: float,
        inputs: Sequence[pb.InlineValue],
        objects: Sequence[pb.ObjectInput],
        client: str,
    ) -> pb.RunReply:
        with self._changed:
            prec = self._programs.get(program_id)
            if call_id in self._calls:
                raise ControllerError("ALREADY_EXISTS", f"call {call_id} is already running")
            program = prec.program
            slices: dict[str, SliceRecord] = {}
            for vid, physical in prec.bindings.items():
                rec = self._slices.by_id(physical)
                if rec is None:
                    raise ControllerError(
                        "FAILED_PRECONDITION",
                        f"program '{program.name}': slice {physical} was released",
                    )
                self._slices.wait_ready(rec, time.monotonic() + READY_WAIT_S)
                slices[vid] = rec
            placed = self._place_objects(prec, slices, call_id, objects, client)
            reply, launches = call_launches(prec, slices, call_id, inputs)
            for _, p in placed:
                for vid, alias in p.aliases.items():
                    launches[vid][0].aliases.append(alias)  # one Launch message per slice
                for vid, expect in p.expects.items():
                    launches[vid][0].expects.append(expect)
            for obj in objects:
                del reply.inputs[obj.index].hosts[:]
                del reply.inputs[obj.index].readers[:]
            for ref in program.outputs:
                if not ref.is_program_input:
                    rec = slices[program.computations[ref.node].slice]
                    self.objects.add(
                        (call_id, ref.node, ref.index),
                        ObjectRecord(client, rec.slice_id, rec.decl.name, rec.generation),
                    )
            self._calls[call_id] = CallRecord(
                client=client,
                program=prec,
                ended=threading.Condition(self._slices.lock),
                progress=CallProgress(
                    call_id=call_id,
                    program=program.name,
                    slices=frozenset(rec.slice_id for rec in slices.values()),
                    total=len(program.computations),
                ),
            )
            # one message per host: the program (first time), the launch, its grants
            gangs = {rec.slice_id: rec for rec in [*slices.values(), *(holder for holder, _ in placed)]}
            with links_together(link for rec in gangs.values() for link in rec.links):
                for vid, rec in slices.items():
                    if program_id not in rec.loaded:
                        loaded = host_program(program, program_id, vid)
                        for link in rec.links:
                            link.send(pb.HostCommand(load=loaded))
                        rec.loaded.add(program_id)
                    for link, launch in zip(rec.links, launches[vid]):
                        link.send(pb.HostCommand(launch=launch))
                for holder, p in placed:
                    if p.forward is not None:
                        self._calls[call_id].sources.setdefault(holder.slice_id, []).append(p.forward.input.index)
                        forward = pb.HostCommand(forward=p.forward)
                        for link in holder.links:
                            link.send(forward)
                self._scheduler.submit(
                    call_id, weight if weight > 0 else 1.0, prec.scheduled(), tenant=f"{client}/{program_id}"
                )
                self._dispatch_grants()
            return reply

    def _place_objects(
        self,
        prec: ProgramRecord,
        slices: dict[str, SliceRecord],
        call_id: str,
        objects: Sequence[pb.ObjectInput],
        client: str,
    ) -> list[tuple[SliceRecord, ObjectPlacement]]:
        """Where each object input comes from (`plans.place_object`), with the gang holding it."""
        program = prec.program
        placed: list[tuple[SliceRecord, ObjectPlacement]] = []
        for obj in objects:
            use = f"program '{program.name}' call {call_id} input {obj.index}"
            if not 0 <= obj.index < len(program.inputs):
                raise ControllerError(
                    "INVALID_ARGUMENT", f"{use}: the program has {len(program.inputs)} inputs"
                )
            key, record = self.objects.resolve(obj.object, client, use)
            holder = self._slices.by_id(record.slice_id)
            if holder is None or holder.generation != record.generation:
                raise ControllerError(
                    "NOT_FOUND",
                    f"{use}: {object_label(key)} was lost: slice '{record.slice_name}' was "
                    "released or its gang relaunched since the object was made",
                )
            placed.append((holder, place_object(program, call_id, obj.index, obj.object, holder, slices)))
        return placed

    def run_to_end(
        self,
        program_id: str,
        call_id: str,
        weight: float,
        inputs: Sequence[pb.InlineValue],
        wait_s: float,
        client: str = "",
        keep: Sequence[pb.ValueRef] = (),
    ) -> pb.RunReply:
        """Runs the call and answers when it ended, with its inline outputs.

        A call that ended with every output inline (or failed) is freed here, but the
        outputs in `keep` if it succeeded, so the client owes no FinishCall (`released`)."""
        reply = self.run(program_id, call_id, weight, inputs, client=client)
        return self._run_ended(reply, call_id, self.wait_call(call_id, wait_s), keep)

    def run_to_end_then(
        self,
        program_id: str,
        call_id: str,
        weight: float,
        inputs: Sequence[pb.InlineValue],
        wait_s: float,
        client: str,
        answer: Callable[[pb.RunReply], None],
        keep: Sequence[pb.ValueRef] = (),
    ) -> None:
        """`run_to_end` whose reply goes to `answer` once the call ended (or `wait_s` is
        up) instead of back to a thread waiting for it; a call that cannot start raises
        here, as `run` does."""
        reply = self.run(program_id, call_id, weight, inputs, client=client)
        self.when_ended(
            call_id, wait_s, lambda: answer(self._run_ended(reply, call_id, self.wait_call(call_id, 0.0), keep))
        )

    def wait_call_then(
        self, call_id: str, timeout_s: float, finish: bool, keep: Sequence[pb.ValueRef],
        answer: Callable[[pb.CallStatus], None],
    ) -> None:
        """`wait_call` whose status goes to `answer` once the call ended or `timeout_s` is up."""
        self.when_ended(call_id, timeout_s, lambda: answer(self.wait_call(call_id, 0.0, finish, keep)))

    def when_ended(self, call_id: str, timeout_s: float, then: Callable[[], None]) -> None:
        """Runs `then()` once the call is no longer running (at once if it is not, or not
        known), or once `timeout_s` passed, whichever comes first; once. The thread that
        ends the call runs it after letting go of the table's lock, or `CallWatch`'s."""
        once = Once(then)
        with self._changed:
            call = self._calls.get(call_id)
            if call is not None and call.progress.running:
                call.watchers.append(once)
                self._watch.at(time.monotonic() + max(timeout_s, 0.0), once)
                return
        once()

    def _run_ended(
        self, reply: pb.RunReply, call_id: str, status: pb.CallStatus, keep: Sequence[pb.ValueRef] = ()
    ) -> pb.RunReply:
        """`reply` with the call's status and inline outputs; freed, but for the objects in
        `keep`, if the client needs no more."""
        reply.status.CopyFrom(status)
        with self._changed:
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
            self.finish_call(call_id, keep if status.state == pb.CallStatus.SUCCEEDED else ())
            reply.released = True
        return reply

    def _dispatch_grants(self) -> None:
        for batch in self._scheduler.grant_batches():
            rec = self._slices.by_id(batch.slice_id)
            if rec is None:
                continue
            grants = batch.grants
            message = pb.GrantBatch(
                runs=runs_of([g[1:] for g in grants]), none_waiting=not batch.room_wanted
            )
            hosts, slice_id = len(rec.links), batch.slice_id
            for run in message.runs:
                call = self._calls.get(run.call_id)
                if call is not None:
                    call.progress.granted_run(slice_id, run.first_seq, len(run.nodes), hosts)
            for link in rec.links:
                link.send(pb.HostCommand(grants=message))
            self.dispatched += len(batch.grants)

    def on_host_event(self, link: HostLink, event: pb.HostEvent) -> None:
        """Completions from one host: count them, keep inline outputs, grant more.

        Only the waiters of a call that ended are woken (`CallRecord.ended`). A client
        keeps a `WaitCall` open for each call it has outstanding (up to its bound of
        32); woken all at once at every call's end, they took a thread switch each,
        per call, from the cores the hosts' computations run on."""
        if not event.completions:
            return
        answers: list[Once] = []
        with self._changed:
            rec = self._slices.slice_of_link(link)
            if rec is None:
                return
            now = time.monotonic()
            ended: dict[str, CallRecord] = {}
            slice_id = rec.slice_id
            for done in event.completions:
                call = self._calls.get(done.call_id)
                if call is None:
                    self._scheduler.complete_run(slice_id, seqs_of(done), now)
                    continue
                for value in done.outputs:
                    call.values[(value.value.node, value.value.index)] = value
                progress = call.progress
                if done.count > 1:  # a run of grants that succeeded (`grant_runs`)
                    seqs, failed_now = progress.report_run(slice_id, done.seq, done.count, link.name)
                    if failed_now:
                        self._tell_failed(call, failed_now)
                    self._scheduler.complete_run(slice_id, seqs, now)
                else:
                    report = progress.report((slice_id, done.seq), link.name, done.ok, done.error, done.node, now)
                    if report is not None:
                        if report.failed_now:
                            self._tell_failed(call, report.failed_now)
                        if report.grant_done:
                            self._scheduler.complete_run(slice_id, (done.seq,), now)
                if not progress.running:
                    ended[call.call_id] = call
            self._dispatch_grants()
            for call in ended.values():
                answers += call.ending()
        for answer in answers:
            answer()

    def _fail_call(self, call: CallRecord, message: str) -> None:
        call.progress.fail(message)
        self._tell_failed(call, message)

    def _tell_failed(self, call: CallRecord, message: str) -> None:
        """The call has failed: the scheduler drops its grants and its hosts stop waiting for it."""
        log.warning("call %s of program '%s' failed: %s", call.call_id, call.progress.program, message)
        self._scheduler.cancel(call.call_id)
        fail = pb.HostCommand(fail=pb.FailCall(call_id=call.call_id, message=message))
        self._send_to_gangs(call, fail)
        self._watch.soon(call.ending())

    def _send_to_gangs(self, call: CallRecord, command: pb.HostCommand, later: bool = False) -> None:
        for slice_id in call.progress.slices:
            rec = self._slices.by_id(slice_id)
            if rec is not None:
                for link in rec.links:
                    link.send(command, later)

    def gang_lost(self, rec: SliceRecord, host_name: str, reason: str) -> None:
        """The gang of `rec` is gone (the caller holds the lock): fail the calls running on it."""
        slice_id = rec.slice_id
        self.objects.lose_slice(
            slice_id, f"host {host_name} of slice '{rec.decl.name}' failed ({reason})"
        )
        affected = self._scheduler.reset_slice(slice_id)
        for call in self._calls.values():
            sent = call.sources.pop(slice_id, None)
            if call.progress.running and (
                slice_id in call.progress.slices or call.call_id in affected
            ):
                self._fail_call(
                    call,
                    f"program '{call.program.program.name}' call {call.call_id}: host "
                    f"{host_name} of slice '{rec.decl.name}' failed ({reason}); "
                    "the slice is being relaunched",
                )
            elif call.progress.running and sent:
                self._fail_call(
                    call,
                    f"program '{call.program.program.name}' call {call.call_id}: input "
                    f"{', '.join(map(str, sent))} comes from slice '{rec.decl.name}', whose host "
                    f"{host_name} failed ({reason}); the object it names is lost",
                )
            call.progress.forget_slice(slice_id)

    def wait_call(
        self, call_id: str, timeout_s: float, finish: bool = False, keep: Sequence[pb.ValueRef] = ()
    ) -> pb.CallStatus:
        """The call's status once it ended, or when `timeout_s` is up. With `finish`, a call
        that ended is freed here as `finish_call` would (a failed one keeping nothing), and
        the status says `released`: the client owes no FinishCall."""
        status = self._await_end(call_id, timeout_s)
        if finish and status.state in (pb.CallStatus.SUCCEEDED, pb.CallStatus.FAILED):
            self.finish_call(call_id, keep if status.state == pb.CallStatus.SUCCEEDED else ())
            status.released = True
        return status

    def _await_end(self, call_id: str, timeout_s: float) -> pb.CallStatus:
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
                call.ended.wait(min(remaining, 1.0))
            return call.status(self._stragglers(call) if call.progress.running else "")

    def _stragglers(self, call: CallRecord) -> str:
        """For a call still running: which hosts owe which granted computations."""
        gangs: dict[str, list[tuple[str, str]]] = {}
        for slice_id in {k[0] for k in call.progress.waiting}:
            rec = self._slices.by_id(slice_id)
            if rec is not None:
                gangs[slice_id] = [(link.name, f"{link.name} ({link.address})") for link in rec.links]
        return call.progress.stragglers(gangs)

    def finish_call(self, call_id: str, keep: Sequence[pb.ValueRef] = ()) -> pb.CallStatus:
        """Frees the call on every host, but the outputs in `keep`: they stay objects."""
        with self._changed:
            call = self._calls.pop(call_id, None)
            if call is None:
                return pb.CallStatus(call_id=call_id, state=pb.CallStatus.UNKNOWN)
            self._watch.soon(call.ending())
            if call.progress.running:
                self._fail_call(call, f"call {call_id} was abandoned by its client")
            self.objects.finish(call_id, [(v.node, v.index) for v in keep])
            release = pb.ReleaseCall(call_id=call_id, keep=keep)
            self._send_to_gangs(call, pb.HostCommand(release=release), later=True)
            return call.status()

    def drop_objects(self, client: str, refs: Sequence[pb.ObjectRef]) -> None:
        """The client let go of these objects: free them on the hosts that hold them."""
        with self._changed:
            self._drop([object_key(r) for r in refs], client)

    def _drop(self, keys: list[ObjectKey], client: str) -> None:
        for slice_id, dropped in self.objects.drop(keys, client).items():
            rec = self._slices.by_id(slice_id)
            if rec is None:
                continue
            command = pb.HostCommand(drop=pb.DropObjects(objects=[object_ref(k) for k in dropped]))
            for link in rec.links:
                link.send(command, later=True)

    def keep_alive(self, client: str, now: float) -> float:
        """Renews the client's lease; the lease's length, for the client's timer."""
        with self._changed:
            self._seen[client] = now
        return self.lease_s

    def fail_held(self, now: float) -> None:
        """Fails the calls whose held host failure no lost gang explained in time (`core.call_tracking`)."""
        with self._changed:
            for call in list(self._calls.values()):
                message = call.progress.due(now)
                if message:
                    self._tell_failed(call, message)

    def expire_leases(self, now: float) -> list[str]:
        """Frees every call and object of the clients whose lease lapsed; those clients."""
        with self._changed:
            gone = lapsed(self._seen, now, self.lease_s)
            for client in gone:
                del self._seen[client]
                for call_id in [c.call_id for c in self._calls.values() if c.client == client]:
                    self.finish_call(call_id)
                self._drop(self.objects.owned_by(client), client)
            return gone
