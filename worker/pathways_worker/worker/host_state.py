"""A host's worker as a pure state machine: `HostState.handle(stimulus) -> [instruction]`.

Everything the worker decides is decided here and in `host_calls` (the calls
and their values, which this module drives); the threaded driver (`executor`)
only turns the sidecar's commands into stimuli and carries out the
instructions. No jax, threads, clocks or I/O: values are opaque objects, a
timeout is a timer the driver's clock fires back as `TimerFired`.

* Order. Grants run strictly in the order they were received, one after
  another: keeping one order on every host of a slice keeps SPMD collectives in
  one order. The head grant waits while an input is missing or the store lacks
  room for its outputs, and fails when its timer fires first.
* Failure. A computation that cannot run fails its outputs, so the
  computations and fetches that need them fail at once, and its routed
  outputs are exported as failures so other slices learn it too. A failed
  call fails every value it still waits for.
* Overlap. JAX dispatch is asynchronous, so the next grant is dispatched
  without waiting for the last. A single-process slice has at most
  `DISPATCH_AHEAD_BYTES` of outputs dispatched ahead of the one running: with a
  whole window of queued executions (and their output buffers) XLA ran a lone
  tenant's 1 ms computations slower than several tenants' (the single-tenant
  baseline of bench experiment 5 came out below the contended rate). It
  reports no batches back, so the machine never sees those computations end;
  it holds at most `DISPATCH_AHEAD_COUNT` of them, or small outputs would be
  held by the million. On a
  multi-process slice one limit stays: two
  computations whose collectives could run side by side deadlock with gloo CPU
  collectives (seen on jax 0.10.2, even when every process issues them in the
  same order), and JAX runs side by side whatever does not depend on each
  other. So a computation that reads an output of the one dispatched before it
  goes at once (JAX runs it after that one, as a multi-controller training
  loop does), and any other waits for that one's outputs first
  (`Dispatch.wait_for`). Even such a chain hangs when too long: 40 chained
  collective computations in flight never ended, 16 did (2 processes x 4
  devices), so at most `IN_FLIGHT_LIMIT` are in flight; a second one already
  overlaps a host's work for the next computation with the last one running.
  Independent computations without collectives could overlap too (40 small
  ones on 2 processes x 4 devices, best of 5: 0.73 ms each waiting after each,
  0.56 ms in flight), but whether a computation communicates is known only to
  XLA's partitioner, so the machine treats every multi-process computation as
  one that may. The finisher reports when it saw a batch end (`BatchFinished`),
  so the machine holds outputs no longer than they run.
* Runs. On a single-process slice, the grants queued right behind the head
  that belong to the same call and can start at once (their computations
  loaded, their inputs ready in the store or made by a grant before them in
  the run, room in the store for their outputs) go with it as one
  `DispatchRun`, up to `RUN_LIMIT` grants and `DISPATCH_AHEAD_BYTES` of
  outputs: the executor thread dispatches them back to back and answers once
  (`RunDispatched`), and the machine then takes each result as if that grant
  had run alone, in order, but for the values the run passed from grant to
  grant that nothing else reads: those never settle in the store. A chain of
  small computations so costs one pass through the machine per run, not per
  computation. A grant JAX refuses ends the run there; the grants after it go
  back to the front of the queue, their room given back, and start again on
  their own (they find the refused grant's outputs failed). Multi-process
  slices keep one grant at a time: how many may be in flight there is the
  Overlap rule's.
* Batching. Dispatched grants go to the finisher in batches — when the machine
  would otherwise wait (no grant queued, inputs or room missing), after a grant
  whose outputs leave the host or that failed, every `FINISH_BATCH` grants, and
  once the batch's outputs reach `FINISH_BATCH_BYTES` — so a chain of small
  computations costs one thread hand-off and one completion message per batch,
  on every slice. A batch holds back its calls' ends, and with them everything a
  call's end lets go. A client that keeps calls of one computation queued ahead
  (a training loop) leaves grants queued all the time, so without the bytes
  bound its completions went out `FINISH_BATCH` calls at a time and each host
  held that many steps' outputs: the workers of a 2-host slice training a 5 MiB
  model held 500 MiB of parameters each (1.25 GiB resident, against 380 MiB for
  multi-controller JAX on the same step) and faulted in fresh pages for them at
  every step.
* Inline outputs. A small output the client will fetch goes back with its
  completion when this host holds it whole; on a multi-process slice only the
  first host sends it (the others hold the same value), and an output split
  across hosts is fetched from them as before.
* Release (`host_calls`). A value no local computation reads and the client
  will not fetch is dropped at once; releasing a call drops what it holds,
  answers its waiting fetches with an error, and makes late messages for it
  no-ops.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pathways_worker.value_ref import Ref, ref_name
from pathways_worker.worker import stimuli
from pathways_worker.worker.call_plan import CallPlan, LocalComputation
from pathways_worker.worker.host_calls import CallState, HostCalls, PreparedComputation
from pathways_worker.worker.instructions import (
    CancelTimer,
    Dispatch,
    DispatchRun,
    FinishBatch,
    Finished,
    Instruction,
    RoomWanted,
    RoutedValue,
    RunValue,
    StartTimer,
)
from pathways_worker.worker.object_store import ObjectId
from pathways_worker.worker.states import GRANT_MOVES, GrantState, InvalidTransition
from pathways_worker.worker.stimuli import (
    BatchFinished,
    ComputationDispatched,
    GrantId,
    GrantsReceived,
    RunDispatched,
    Stimulus,
    TimerFired,
)

FINISH_BATCH = 32
"""Dispatched grants handed to the finisher at once, at most."""

FINISH_BATCH_BYTES = 64 << 20
"""Output bytes a batch holds back from its completions, at most: once the grants waiting
for company made this much, they go (see Batching)."""

IN_FLIGHT_LIMIT = 2
"""Computations a multi-process slice has in flight at once, at most (see Overlap)."""

DISPATCH_AHEAD_BYTES = 16 << 20
"""Output bytes of the computations a single-process slice has dispatched ahead of the one
running, at most (see Overlap): a dozen 1 ms matmuls keep its devices fed; a whole window
of them queued in XLA, each with its output buffer, ran slower."""

RUN_LIMIT = 32
"""Grants one `DispatchRun` holds at most (see Runs): as many as a finish batch."""

DISPATCH_AHEAD_COUNT = 32
"""Computations a single-process slice remembers as dispatched ahead, at most, whatever
their bytes. The machine does not see them finish (only a multi-process slice reports
its batches back), so without this bound a chain of small outputs kept every one alive:
16 MiB of 16-byte outputs is a million arrays, each pinning its buffer and walked by
every collection of Python's oldest generation. At the count the older half is let go
at once, the computation dispatched then waiting for the newest of them (they run in
order): a check of one output per half a count, not one per computation."""


@dataclass(slots=True)
class GrantRecord:
    """The grant at the head of the run order; those behind it are only ids, all `queued`."""

    grant: GrantId
    state: GrantState = "queued"
    timer: int = 0             # the timer bounding its wait, while waiting
    timed_out: bool = False
    reserved: int = 0          # store bytes reserved for its outputs while running
    call: CallState | None = None       # set while running
    comp: LocalComputation | None = None  # set once its plan names it
    prepared: PreparedComputation | None = None  # set while running


def grant_name(grant: GrantId) -> str:
    return f"grant {grant.seq} (computation {grant.node}) of call {grant.call_id}"


class HostState:
    def __init__(
        self,
        host_name: str,
        store_limit_bytes: int,
        input_timeout_s: float,
        multi_process: bool,
        first_host: bool = True,
        run_limit: int = RUN_LIMIT,
    ) -> None:
        self.host_name = host_name
        self.input_timeout_s = input_timeout_s
        self.multi_process = multi_process
        self.first_host = first_host
        """The slice's host 0, which answers for values every host holds whole."""
        self.run_limit = run_limit
        """Grants a run holds at most; 1 dispatches every grant alone."""
        self.calls = HostCalls(host_name, store_limit_bytes)
        self.store = self.calls.store
        self._queue: deque[GrantId] = deque()   # behind the head, in the order received
        self._head: GrantRecord | None = None
        self._run: list[GrantRecord] = []
        """The grants dispatched in one run behind the head, all `running` (see Runs)."""
        self._run_reads: dict[Ref, int] = {}
        """How many of the run's grants read each value an earlier one of them makes."""
        self._run_values: dict[Ref, RunValue] = {}
        """One `RunValue` per name, made once: a value's name is all it holds."""
        self._batch: list[Finished] = []
        self._batch_bytes = 0
        self._chain: deque[tuple[GrantId, tuple[object, ...]]] = deque()
        """Multi-process: the computations in flight, each reading the one before, until seen finished."""
        self._ahead: deque[tuple[tuple[object, ...], int]] = deque()
        """Single-process: the outputs of the last computations dispatched and their bytes."""
        self._ahead_bytes = 0
        self._timers = 0
        self.room_wanted = True
        """Whether the island scheduler, at its last grants, had work waiting for room
        on this slice, so completions should free it as they come (`outbox`)."""
        self._handlers: dict[type, Callable[[Any, list[Instruction]], None]] = {
            stimuli.ProgramLoaded: self.calls.load,
            stimuli.CallLaunched: self.calls.launch,
            GrantsReceived: self._grants_received,
            stimuli.CallFailed: self.calls.fail_call,
            stimuli.CallReleased: self.calls.release,
            stimuli.ObjectsDropped: self.calls.drop_objects,
            stimuli.ObjectForwarded: self.calls.forward,
            stimuli.ValueArrived: self.calls.arrive,
            stimuli.ExportRequested: self.calls.request_export,
            ComputationDispatched: self._computation_dispatched,
            RunDispatched: self._run_dispatched,
            BatchFinished: self._batch_finished,
            stimuli.ComputationFailedLate: self.calls.fail_late,
            stimuli.ExportWritten: self.calls.export_written,
            TimerFired: self._timer_fired,
        }

    def handle(self, stimulus: Stimulus) -> list[Instruction]:
        out: list[Instruction] = []
        self._handlers[type(stimulus)](stimulus, out)
        self._advance(out)
        return out

    @property
    def grants_queued(self) -> int:
        """Grants received and not yet dispatched or failed, the head included."""
        return len(self._queue) + (self._head is not None) + len(self._run)

    @property
    def in_hand(self) -> int:
        """Grants this host has yet to hand to the finisher and can get on with:
        queued, at the head unless it waits for inputs or room, and dispatched in
        the batch being gathered. A head that waits may wait for what another
        slice or the client does next, so nothing behind it counts. Read from
        other threads without the lock: a moment's stale count only moves when a
        batch of completions goes."""
        head = self._head
        if head is not None and head.state == "waiting":
            return len(self._batch)
        return len(self._queue) + (head is not None) + len(self._run) + len(self._batch)

    def grant_state(self, grant: GrantId) -> GrantState | None:
        """A grant's state while it is queued or at the head; None once it left."""
        if self._head is not None and self._head.grant == grant:
            return self._head.state
        if any(record.grant == grant for record in self._run):
            return "running"
        return "queued" if grant in self._queue else None

    # ------------------------------------------------------------ the run order

    def _grants_received(self, received: GrantsReceived, out: list[Instruction]) -> None:
        self._queue.extend(received.grants)
        if received.room_wanted and not self.room_wanted:
            out.append(RoomWanted())
        self.room_wanted = received.room_wanted

    def _computation_dispatched(
        self, done: ComputationDispatched, out: list[Instruction], transient: frozenset[Ref] = frozenset()
    ) -> None:
        """`transient`: values of a run that only its own grants read (see `_transient`);
        they never settle in the store."""
        head = self._head if self._head is not None and self._head.grant == done.grant else None
        if head is None or head.call is None or head.comp is None:
            raise InvalidTransition(grant_name(done.grant), head.state if head else "not queued", "dispatched")
        self._move(head, "failed" if done.error else "dispatched")
        self._head = None
        if self.multi_process and not done.error:
            self._chain.append((done.grant, done.outputs))
        elif done.outputs and head.reserved:
            self._ahead.append((done.outputs, head.reserved))
            self._ahead_bytes += head.reserved
        call, comp, prepared = head.call, head.comp, head.prepared
        plan = call.plan
        if self.calls.get(call.call_id) is not call or plan is None or prepared is None:
            self.store.unreserve(head.reserved)  # released while it ran
            self._finished(Finished(done.grant, done.outputs, done.error), out)
            return
        error = done.error
        if error:
            self.store.unreserve(head.reserved)
        out_bytes, partial, routes = prepared.out_bytes, prepared.partial, plan.routes
        inlines = (self.first_host or not self.multi_process) and call.inline_output_bytes > 0 and not error
        routed: list[RoutedValue] = []
        inline: list[int] = []
        for i, ref in enumerate(comp.outputs):
            oid = ObjectId(call.call_id, ref)
            value = None if error else done.outputs[i]
            if ref in transient:
                self.store.unreserve(out_bytes[i])
                self.store.drop(oid)
                call.freed.add(ref)
                continue
            if error:
                self.calls.settle_failed(oid, error, out)
            elif call.failed:
                self.store.unreserve(out_bytes[i])  # the output failed with its call meanwhile
            else:
                self.calls.settle_ready(oid, value, out_bytes[i], True, out)
            if routes and ref in routes:
                declared = self.calls.declared(call.call_id, ref) if value is None else None
                routed.append(RoutedValue(ref, value, declared))
            if (
                inlines and value is not None and i not in partial and ref in plan.outputs
                and 0 < out_bytes[i] <= call.inline_output_bytes
            ):
                inline.append(i)
        self.calls.release_inputs(call, comp, transient)
        for ref in comp.outputs:
            if ref not in transient:
                self.calls.maybe_free(call, ref)
        self._count_done(
            call, plan, done, error, 0 if error else sum(out_bytes),
            tuple(routed) if routed else (), tuple(inline) if inline else (), out,
        )

    def _run_dispatched(self, done: RunDispatched, out: list[Instruction]) -> None:
        """Each grant of the run that JAX took, as if it had run alone; those after one it
        refused go back to the front of the queue, their store room given back. A grant
        whose every output the run passed along (`_transient`) is taken the short way
        (`_passed_along`): none of them reaches the store."""
        records = [self._head, *self._run]
        self._run = []
        transient, slotted = self._transient(records, done)
        for record, result in zip(records, done.results):
            if transient and record is not None and record.comp and transient.issuperset(record.comp.outputs):
                self._passed_along(record, result, transient, slotted, out)
                continue
            self._head = record
            self._computation_dispatched(result, out, transient)
        self._head = None
        for record in reversed(records[len(done.results):]):
            if record is not None:
                self.store.unreserve(record.reserved)
                self._queue.appendleft(record.grant)

    def _passed_along(
        self, record: GrantRecord, done: ComputationDispatched, transient: frozenset[Ref],
        slotted: frozenset[Ref], out: list[Instruction],
    ) -> None:
        """`_computation_dispatched` for a grant of a run that JAX took whole, whose
        outputs only the run's own grants read: the call is as the run found it, its
        outputs are neither the call's nor routed, nothing waits to export them, so
        they give their room back and are freed without settling in the store."""
        call, comp = record.call, record.comp
        assert call is not None and comp is not None and call.plan is not None
        self._move(record, "dispatched")
        reserved = record.reserved
        if done.outputs and reserved:
            self._ahead.append((done.outputs, reserved))
            self._ahead_bytes += reserved
        self.store.unreserve(reserved)
        call.freed.update(comp.outputs)
        for ref in comp.outputs:
            if ref in slotted:
                self.store.drop(ObjectId(call.call_id, ref))
        self.calls.release_inputs(call, comp, transient)
        self._count_done(call, call.plan, done, "", reserved, (), (), out)

    def _count_done(
        self, call: CallState, plan: CallPlan, done: ComputationDispatched, error: str, nbytes: int,
        routed: tuple[RoutedValue, ...], inline: tuple[int, ...], out: list[Instruction],
    ) -> None:
        """The grant counts as done for its call (``nbytes`` of outputs held back by the
        batch), and its completion joins the batch."""
        call.computations += 1
        call.overlapped += done.overlapped
        call.busy_s += done.busy_s
        self._batch_bytes += nbytes
        ends_call = call.computations >= len(plan.computations)
        comp = plan.computations.get(done.grant.node)
        label = comp.label if comp is not None else ""
        self._finished(Finished(done.grant, done.outputs, error, routed, inline, ends_call, label), out)

    def _transient(
        self, records: list[GrantRecord | None], done: RunDispatched
    ) -> tuple[frozenset[Ref], frozenset[Ref]]:
        """The values of a run that JAX took whole which no one but the run's own grants
        reads: not an output of the call, not routed elsewhere, no fetch waiting, and
        every local reader in the run. The run passed them from grant to grant, so the
        store never needs them (nor their bytes, nor the drop after their last read).
        Second, those of them the store has a slot for (asked for, nothing waiting), to drop."""
        reads, self._run_reads = self._run_reads, {}
        first = records[0]
        call = first.call if first is not None else None
        if (
            call is None or call.plan is None or call.failed or self.calls.get(call.call_id) is not call
            or len(done.results) < len(records) or any(result.error for result in done.results)
        ):
            return frozenset(), frozenset()
        plan, readers, call_id = call.plan, call.readers, call.call_id
        transient: set[Ref] = set()
        slotted: set[Ref] = set()
        for ref, count in reads.items():
            if readers.get(ref) != count or ref in plan.outputs or ref in plan.routes:
                continue
            slot = self.store.get(ObjectId(call_id, ref))
            if slot is None:  # no slot: no one asked for it
                transient.add(ref)
            elif not slot.waiting_exports:
                transient.add(ref)
                slotted.add(ref)
        return frozenset(transient), frozenset(slotted)

    def _batch_finished(self, finished: BatchFinished, out: list[Instruction]) -> None:
        """The chain runs in order: a computation seen finished ended those before it too."""
        ended = set(finished.grants)
        while any(grant in ended for grant, _ in self._chain):
            self._chain.popleft()

    def _timer_fired(self, fired: TimerFired, out: list[Instruction]) -> None:
        head = self._head
        if head is not None and head.state == "waiting" and head.timer == fired.timer:
            head.timed_out = True

    def _advance(self, out: list[Instruction]) -> None:
        """Starts the head grant if it can run, fails those that cannot; hands over
        the dispatched batch whenever nothing is running."""
        while self._head is not None or self._queue:
            head = self._head = self._head or GrantRecord(self._queue.popleft())
            if head.state == "running":
                return
            now = self._start(head, out)
            if now == "failed":
                self._head = None
                continue
            if now == "running":
                return
            break
        self._hand_over(out)

    def _start(self, head: GrantRecord, out: list[Instruction]) -> GrantState:
        """Dispatches the head grant, leaves it waiting, or fails it; says which."""
        grant = head.grant
        call = self.calls.get(grant.call_id)
        if call is None or call.plan is None:
            label = f"{grant_name(grant)} on host {self.host_name}"
            if head.state == "waiting" and head.comp is not None:
                error = f"{head.comp.where(grant.call_id, self.host_name)}: the call was released"
            elif self.calls.was_released(grant.call_id):
                error = f"{label}: the call was already released"
            elif call is not None and call.failed:
                error = f"{label}: {call.failed}"
            else:
                error = f"{label}: the call was not launched on this host"
            return self._fail(head, error, None, None, out)
        plan = call.plan
        comp = plan.computations.get(grant.node)
        if comp is None:
            return self._fail(
                head,
                f"{grant_name(grant)} on host {self.host_name}: computation {grant.node} is not on "
                f"slice '{plan.slice}' of this host",
                None, None, out,
            )
        head.comp = comp
        prepared = self.calls.prepared(plan, comp)
        if isinstance(prepared, str):
            return self._fail(head, prepared, call, comp, out)
        if call.failed:
            return self._cannot_run(head, call, comp, f"call failed: {call.failed}", out)
        missing: Ref | None = None
        inputs: list[object] = []
        for ref in comp.inputs:
            slot = self.store.get(ObjectId(call.call_id, ref))
            if slot is None or not slot.settled:
                missing = missing or ref
            elif slot.state == "failed":
                return self._cannot_run(head, call, comp, f"input {ref_name(ref)} failed: {slot.error}", out)
            else:
                inputs.append(slot.value)
        if missing is not None:
            if not head.timed_out:
                return self._wait(head, out)
            return self._cannot_run(
                head, call, comp,
                f"timed out after {self.input_timeout_s:g} s waiting for {ref_name(missing)} "
                f"from {plan.origin(missing)}",
                out,
            )
        need = prepared.need
        if need > self.store.limit:
            return self._cannot_run(
                head, call, comp,
                f"outputs need {need} B, more than the whole object store limit of "
                f"{self.store.limit} B (PATHWAYS_STORE_LIMIT_BYTES)",
                out,
            )
        if self.store.free < need:
            if not head.timed_out:
                return self._wait(head, out)
            return self._cannot_run(
                head, call, comp,
                f"object store full for {self.input_timeout_s:g} s: {self.store.describe_full(need)}",
                out,
            )
        self.store.reserve(need)
        head.reserved, head.call, head.prepared = need, call, prepared
        self._stop_timer(head, out)
        self._move(head, "running")
        rest = self._gather_run(call, plan, comp, need) if self._queue and not self.multi_process else ()
        run_need = need + sum(record.reserved for record in self._run)
        first = self._dispatch(grant, plan.program_id, comp, tuple(inputs), run_need)
        out.append(DispatchRun(first, rest) if rest else first)
        return "running"

    def _gather_run(
        self, call: CallState, plan: CallPlan, first: LocalComputation, need: int
    ) -> tuple[Dispatch, ...]:
        """The grants queued right behind the head that go with it as one run (see Runs),
        taken off the queue as `running` with their store room reserved."""
        made = set(first.outputs)
        reads: dict[Ref, int] = {}
        total = need
        free = self.store.free  # the head's room is already reserved
        rest: list[Dispatch] = []
        run, call_id, program_id = self._run, call.call_id, plan.program_id
        computations, prepared_of = plan.computations, self.calls.prepared_of(plan)
        for grant in self._queue:
            if len(rest) + 1 >= self.run_limit or grant.call_id != call_id:
                break
            comp = computations.get(grant.node)
            prepared = prepared_of.get(grant.node)
            if comp is None or prepared is None or prepared.load_error:
                break  # the head's path says why it cannot run
            grant_need = prepared.need
            if grant_need > free or total + grant_need > DISPATCH_AHEAD_BYTES:
                break
            inputs = self._run_inputs(call_id, comp, made)
            if inputs is None:
                break
            for ref in comp.distinct_inputs:
                if ref in made:
                    reads[ref] = reads.get(ref, 0) + 1
            made.update(comp.outputs)
            total += grant_need
            free -= grant_need
            # made `running` at once: queued -> running, as `_move` would allow
            run.append(GrantRecord(grant, "running", 0, False, grant_need, call, comp, prepared))
            rest.append(Dispatch(grant, program_id, comp, inputs))
        self.store.reserve(total - need)
        for _ in rest:
            self._queue.popleft()
        self._run_reads = reads
        return tuple(rest)

    def _run_inputs(self, call_id: str, comp: LocalComputation, made: set[Ref]) -> tuple[object, ...] | None:
        """A run grant's inputs: the ready values from the store, a `RunValue` for those
        an earlier grant of the run makes; None when one is neither."""
        inputs: list[object] = []
        for ref in comp.inputs:
            if ref in made:
                passed = self._run_values.get(ref)
                if passed is None:
                    passed = self._run_values[ref] = RunValue(ref)
                inputs.append(passed)
                continue
            slot = self.store.get(ObjectId(call_id, ref))
            if slot is None or slot.state != "ready":
                return None
            inputs.append(slot.value)
        return tuple(inputs)

    def _dispatch(
        self, grant: GrantId, program_id: str, comp: LocalComputation, inputs: tuple[object, ...], need: int
    ) -> Dispatch:
        """On a multi-process slice, only a chain of at most `IN_FLIGHT_LIMIT`
        computations, each reading the one before, may be in flight; on a single-process
        one, the computations dispatched ahead of the one running hold at most
        `DISPATCH_AHEAD_BYTES` of outputs, this one's `need` included, and are at most
        `DISPATCH_AHEAD_COUNT`."""
        if not self.multi_process:
            wait_for: tuple[object, ...] = ()
            # at the count, half go at once: one wait (most often none) per half a count
            keep = DISPATCH_AHEAD_COUNT // 2 if len(self._ahead) >= DISPATCH_AHEAD_COUNT else len(self._ahead)
            while self._ahead and (self._ahead_bytes + need > DISPATCH_AHEAD_BYTES or len(self._ahead) > keep):
                wait_for, nbytes = self._ahead.popleft()
                self._ahead_bytes -= nbytes
            return Dispatch(grant, program_id, comp, inputs, wait_for=wait_for)
        if not self._chain:
            return Dispatch(grant, program_id, comp, inputs)
        in_flight = self._chain[-1][1]
        if not any(value is made for value in inputs for made in in_flight):
            self._chain.clear()
            return Dispatch(grant, program_id, comp, inputs, in_flight, wait_for=in_flight)
        wait_for = ()
        while len(self._chain) >= IN_FLIGHT_LIMIT:
            wait_for = self._chain.popleft()[1]
        return Dispatch(grant, program_id, comp, inputs, in_flight, wait_for)

    def _wait(self, head: GrantRecord, out: list[Instruction]) -> GrantState:
        if head.state == "queued":
            self._move(head, "waiting")
            self._timers += 1
            head.timer = self._timers
            out.append(StartTimer(head.timer, self.input_timeout_s))
        return "waiting"

    def _fail(
        self,
        head: GrantRecord,
        error: str,
        call: CallState | None,
        comp: LocalComputation | None,
        out: list[Instruction],
    ) -> GrantState:
        """The grant cannot run. With its computation known, its outputs fail (so
        consumers fail at once) and its routed outputs leave as failures."""
        routed: tuple[RoutedValue, ...] = ()
        if call is not None and call.plan is not None and comp is not None:
            for ref in comp.outputs:
                self.calls.settle_failed(ObjectId(call.call_id, ref), error, out)
            self.calls.release_inputs(call, comp)
            routed = tuple(
                RoutedValue(ref, None, self.calls.declared(call.call_id, ref))
                for ref in comp.outputs
                if ref in call.plan.routes
            )
        self._stop_timer(head, out)
        self._move(head, "failed")
        self._finished(Finished(head.grant, (), error, routed), out)
        return "failed"

    def _cannot_run(
        self, head: GrantRecord, call: CallState, comp: LocalComputation, reason: str, out: list[Instruction]
    ) -> GrantState:
        return self._fail(head, f"{comp.where(call.call_id, self.host_name)}: {reason}", call, comp, out)

    def _stop_timer(self, head: GrantRecord, out: list[Instruction]) -> None:
        if head.timer:
            out.append(CancelTimer(head.timer))
            head.timer = 0

    def _finished(self, finished: Finished, out: list[Instruction]) -> None:
        """A grant was dispatched or failed. It waits for company unless someone
        needs it now: routed outputs go out at once, failures are not held back, and
        a batch whose outputs reached `FINISH_BATCH_BYTES` holds back no more."""
        self._batch.append(finished)
        if (finished.routed or finished.error or len(self._batch) >= FINISH_BATCH
                or self._batch_bytes >= FINISH_BATCH_BYTES):
            self._hand_over(out)

    def _hand_over(self, out: list[Instruction]) -> None:
        if self._batch:
            out.append(FinishBatch(tuple(self._batch), report=self.multi_process))
            self._batch = []
            self._batch_bytes = 0

    def _move(self, record: GrantRecord, new: GrantState) -> None:
        if new not in GRANT_MOVES[record.state]:
            raise InvalidTransition(grant_name(record.grant), record.state, new)
        record.state = new
