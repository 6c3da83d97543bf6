"""The worker's executor: runs this host's computations in the scheduler's order.

The sidecar streams commands in; this module turns each into state changes and
work, and streams events (completions, exported values) out through an outbox
that batches whatever accumulated.

Three threads share one lock:

* the session reader applies commands: loads programs, creates calls (their
  output futures, routes and expected arrivals, and the program inputs that
  came inline with the launch), queues grants, settles arrived values, fails
  and releases calls;
* the executor thread runs grants strictly in the order they were received.
  The head grant waits (bounded) until its inputs exist and the store has room
  for its outputs, then dispatches. Keeping one order on every host of a slice
  is what keeps SPMD collectives on multi-host slices in one order;
* the finisher waits for dispatched results in the same order, reports
  completions (with the call's small outputs inline when the launch asks for
  them), and writes values that leave the host (routed to another slice, or
  fetched by the client) to shared memory for the sidecar.

JAX dispatch is asynchronous, so on a single-process slice the executor does
not wait for a computation before dispatching the next: it hands the finisher
its dispatched computations in batches — whenever it would otherwise wait (no
grant queued, inputs or store room missing), after a computation whose
outputs leave the host, and every `FINISH_BATCH` computations — so a chain of
small computations costs one thread hand-off and one completion message per
batch, not per computation.

On a multi-process slice the executor waits for each computation before
dispatching the next, and reports each at once: with gloo CPU collectives,
several collective computations in flight at once deadlock (seen on jax
0.10.2).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from pathways_wire.transfer import Piece, parse_spec, value_pieces
from pathways_wire import pathways_pb2 as pb
from pathways_worker.batch_queue import BatchQueue
from pathways_worker.value_ref import Ref, ref_name, ref_of
from pathways_worker.worker.call_plan import (
    CallPlan,
    LocalComputation,
    ProgramLayout,
    layout_program,
    plan_call,
)
from pathways_worker.shared_memory import ShmDir, map_value, remove
from pathways_worker.worker.executables import Executable, ExecutableCache, LoadError
from pathways_worker.worker.object_store import ObjectStore, Slot

log = logging.getLogger(__name__)

RELEASED_MEMORY = 4096  # released call ids remembered, to drop late messages
EVENT_LINGER_S = float(os.environ.get("PATHWAYS_EVENT_LINGER_S", "0.001"))
FINISH_BATCH = 32
"""Dispatched computations handed to the finisher at once, at most."""


@dataclass(frozen=True)
class LoadedProgram:
    host_program: pb.HostProgram
    layout: ProgramLayout
    executables: dict[int, Executable]
    errors: dict[int, str]
    output_specs: dict[int, tuple[pb.TensorSpec, ...]]


@dataclass
class CallState:
    call_id: str
    plan: CallPlan | None = None
    failed: str = ""
    readers: dict[Ref, int] = field(default_factory=dict)
    freed: set[Ref] = field(default_factory=set)
    computations: int = 0
    busy_s: float = 0.0
    inline_output_bytes: int = 0


@dataclass(frozen=True)
class CompletionJob:
    grant: pb.Grant
    outputs: tuple[Any, ...]           # dispatched jax.Arrays; () when it did not run
    error: str
    routed: tuple[tuple[Ref, Any, pb.TensorSpec], ...]  # (value, array or None, spec)
    inline: tuple[tuple[int, pb.TensorSpec], ...] = ()   # (output index, spec) sent inline


@dataclass(frozen=True)
class ExportJob:
    call_id: str
    ref: Ref
    token: int
    value: Any
    error: str
    spec: pb.TensorSpec
    release: bool


class WorkerOutbox:
    """Events for the sidecar, batched; each event carries the store's byte count.

    A batch lingers for company only while more completions are on their way
    (`busy()`: grants still queued on the executor); the last completion of a
    call and every export go out at once, since someone is waiting for them.
    """

    def __init__(
        self, store_bytes: Callable[[], int], store_limit: int, busy: Callable[[], bool] = lambda: False
    ) -> None:
        self._queue: BatchQueue[pb.Completion | pb.Exported] = BatchQueue()
        self._store_bytes = store_bytes
        self._store_limit = store_limit
        self._busy = busy

    def completions(self, done: list[pb.Completion]) -> None:
        self._queue.put_many(list(done))

    def exported(self, exported: pb.Exported) -> None:
        self._queue.put(exported)

    def nudge(self) -> None:
        self._queue.nudge()

    def take_event(self, timeout_s: float) -> pb.WorkerEvent | None:
        items, nudged = self._queue.take(timeout_s, EVENT_LINGER_S, self._busy)
        if not items and not nudged:
            return None
        event = self.stats_event()
        for item in items:
            if isinstance(item, pb.Completion):
                event.completions.append(item)
            else:
                event.exported.append(item)
        return event

    def stats_event(self) -> pb.WorkerEvent:
        return pb.WorkerEvent(store_bytes=self._store_bytes(), store_limit=self._store_limit)


class Executor:
    def __init__(
        self,
        host_name: str,
        host_index: int,
        shm: ShmDir,
        store_limit_bytes: int,
        input_timeout_s: float,
        devices: Sequence[jax.Device] | None = None,
    ) -> None:
        self.host_name = host_name
        self.host_index = host_index
        self.input_timeout_s = input_timeout_s
        self._shm = shm
        self._cv = threading.Condition()
        self._store = ObjectStore(store_limit_bytes)
        self._cache = ExecutableCache(devices if devices is not None else jax.devices())
        self._block_each = jax.process_count() > 1
        self._programs: dict[str, LoadedProgram] = {}
        self._calls: dict[str, CallState] = {}
        self._released: set[str] = set()
        self._released_order: deque[str] = deque()
        self._run_queue: deque[pb.Grant] = deque()
        self._finish_queue: queue.SimpleQueue[
            tuple[CompletionJob, ...] | ExportJob | None
        ] = queue.SimpleQueue()
        self._dispatched: list[CompletionJob] = []  # the executor thread's, not yet handed over
        self._stopping = False
        self.outbox = WorkerOutbox(
            lambda: self._store.used, store_limit_bytes, lambda: len(self._run_queue) > 1
        )
        self._equivalent: dict[tuple[Sharding, Sharding, int], bool] = {}
        self._threads = [
            threading.Thread(target=self._execute_loop, name="executor", daemon=True),
            threading.Thread(target=self._finish_loop, name="finisher", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------ introspection

    @property
    def store_bytes(self) -> int:
        with self._cv:
            return self._store.used

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._finish_queue.put(None)

    # ------------------------------------------------------------ commands

    def handle(self, command: pb.WorkerCommand) -> None:
        kind = command.WhichOneof("command")
        if kind == "load":
            self.load(command.load)
        elif kind == "launch":
            self.launch(command.launch)
        elif kind == "grants":
            self.grants(command.grants.grants)
        elif kind == "fail":
            self.fail(command.fail.call_id, command.fail.message)
        elif kind == "release":
            self.release(command.release.call_id)
        elif kind == "arrival":
            self.arrival(command.arrival)
        elif kind == "export":
            self.export(command.export)
        else:
            log.warning("ignoring empty worker command")

    def load(self, host_program: pb.HostProgram) -> None:
        executables: dict[int, Executable] = {}
        errors: dict[int, str] = {}
        specs: dict[int, tuple[pb.TensorSpec, ...]] = {}
        program = host_program.program
        for comp in program.computations:
            specs[comp.index] = tuple(comp.outputs)
            if comp.slice != host_program.slice:
                continue
            try:
                executables[comp.index] = self._cache.get(comp)
            except LoadError as err:
                errors[comp.index] = f"program '{program.name}' {err} (host {self.host_name})"
            except Exception as err:  # anything jax raises while preparing it
                errors[comp.index] = (
                    f"program '{program.name}' computation '{comp.name}' (index {comp.index}) "
                    f"cannot be loaded on host {self.host_name}: {type(err).__name__}: {err}"
                )
        loaded = LoadedProgram(host_program, layout_program(host_program), executables, errors, specs)
        with self._cv:
            self._programs[host_program.program_id] = loaded
        for error in errors.values():
            log.error("%s", error)

    def launch(self, launch: pb.Launch) -> None:
        with self._cv:
            if launch.call_id in self._released:
                return
            call = self._call(launch.call_id)
            if call.plan is not None:
                return
            loaded = self._programs.get(launch.program_id)
            if loaded is None:
                call.failed = (
                    f"call {launch.call_id}: program {launch.program_id} was never loaded "
                    f"on host {self.host_name}"
                )
                return
            call.plan = plan_call(loaded.layout, launch)
            call.readers = dict(call.plan.readers)
            call.inline_output_bytes = launch.inline_output_bytes
            for comp in call.plan.computations.values():
                for ref in comp.outputs:
                    self._store.slot(call.call_id, ref)  # the output futures
            for inline in launch.inputs:
                self._settle_inline(call.call_id, inline)
            for ref, slot in list(self._store.slots_of(call.call_id).items()):
                if slot.settled:
                    self._maybe_free(call, ref)
            self._cv.notify_all()

    def grants(self, grants: Sequence[pb.Grant]) -> None:
        with self._cv:
            self._run_queue.extend(grants)
            self._cv.notify_all()

    def fail(self, call_id: str, message: str) -> None:
        """The controller failed the call: interrupt its waits, fail what is pending."""
        with self._cv:
            if call_id in self._released:
                return
            call = self._call(call_id)
            call.failed = message or "failed by the controller"
            error = f"call {call_id} failed: {call.failed}"
            for ref, slot in list(self._store.slots_of(call_id).items()):
                if not slot.settled:
                    self._settle_failed(call_id, ref, error)
            self._cv.notify_all()

    def release(self, call_id: str) -> None:
        """Frees every value of the call; fetches still waiting get an error."""
        with self._cv:
            call = self._calls.pop(call_id, None)
            self._remember_released(call_id)
            for slot in self._store.release_call(call_id):
                for req in slot.waiting_exports:
                    self._queue_export(
                        req, None, f"call {call_id} was released on host {self.host_name}"
                    )
            self._cv.notify_all()
        if call is not None and call.computations:
            log.info(
                "call %s released: %d computations, %.3f ms each in the executor",
                call_id, call.computations, 1e3 * call.busy_s / call.computations,
            )
        self.outbox.nudge()

    def arrival(self, arrival: pb.Arrival) -> None:
        """A value from outside the slice (program input or another slice's output)."""
        ref = ref_of(arrival.value)
        value: np.ndarray | None = None
        error = arrival.error
        if not error:
            try:
                shape, dtype = parse_spec(arrival.spec)
                path = self._shm.resolve(arrival.path)
                value = map_value(path, shape, dtype)
                remove(path)
            except Exception as err:
                error = f"cannot load arrived {ref_name(ref)} on host {self.host_name}: {err}"
        with self._cv:
            if arrival.call_id in self._released:
                return
            call = self._call(arrival.call_id)
            existing = self._store.get(arrival.call_id, ref)
            if existing is not None and existing.settled:
                return
            if value is None:
                self._settle_failed(arrival.call_id, ref, error)
            else:
                self._settle_ready(arrival.call_id, ref, value, int(value.nbytes), prepaid=False)
                self._maybe_free(call, ref)
            self._cv.notify_all()
        self.outbox.nudge()

    def export(self, request: pb.ExportRequest) -> None:
        """The client fetches a value: write this host's pieces once it exists."""
        ref = ref_of(request.value)
        with self._cv:
            if request.call_id in self._released:
                self._queue_export(
                    request, None,
                    f"call {request.call_id} was released on host {self.host_name}",
                )
                return
            call = self._call(request.call_id)
            if ref in call.freed:
                self._queue_export(
                    request, None,
                    f"{ref_name(ref)} of call {request.call_id} was freed on host "
                    f"{self.host_name} after its last use (it is not an output of the call)",
                )
                return
            slot = self._store.slot(request.call_id, ref)
            if slot.settled:
                self._queue_export(request, slot.value, slot.error)
            else:
                slot.waiting_exports.append(request)

    # ------------------------------------------------------------ state helpers (lock held)

    def _call(self, call_id: str) -> CallState:
        call = self._calls.get(call_id)
        if call is None:
            call = self._calls[call_id] = CallState(call_id)
        return call

    def _remember_released(self, call_id: str) -> None:
        if call_id in self._released:
            return
        self._released.add(call_id)
        self._released_order.append(call_id)
        while len(self._released_order) > RELEASED_MEMORY:
            self._released.discard(self._released_order.popleft())

    def _settle_ready(self, call_id: str, ref: Ref, value: Any, nbytes: int, prepaid: bool) -> None:
        slot = self._store.set_ready(call_id, ref, value, nbytes, prepaid)
        self._flush_exports(slot)

    def _settle_inline(self, call_id: str, inline: pb.InlineValue) -> None:
        """A program input that came with the launch: settled like an arrival."""
        ref = ref_of(inline.value)
        try:
            shape, dtype = parse_spec(inline.spec)
            value = np.frombuffer(inline.data, dtype).reshape(shape)
        except Exception as err:
            self._settle_failed(
                call_id, ref,
                f"cannot load inline {ref_name(ref)} on host {self.host_name}: {err}",
            )
            return
        self._settle_ready(call_id, ref, value, int(value.nbytes), prepaid=False)

    def _settle_failed(self, call_id: str, ref: Ref, error: str) -> None:
        slot = self._store.set_failed(call_id, ref, error)
        self._flush_exports(slot)

    def _flush_exports(self, slot: Slot) -> None:
        waiting, slot.waiting_exports = slot.waiting_exports, []
        for req in waiting:
            self._queue_export(req, slot.value, slot.error)

    def _queue_export(self, req: pb.ExportRequest, value: Any, error: str) -> None:
        ref = ref_of(req.value)
        spec = self._spec_of(req.call_id, ref, value)
        self._finish_queue.put(
            ExportJob(req.call_id, ref, req.token, value, error, spec, req.release)
        )

    def _spec_of(self, call_id: str, ref: Ref, value: Any) -> pb.TensorSpec:
        if value is not None:
            return pb.TensorSpec(shape=list(value.shape), dtype=np.dtype(value.dtype).name)
        call = self._calls.get(call_id)
        if call is not None and call.plan is not None and ref[0] >= 0:
            loaded = self._programs.get(call.plan.program_id)
            specs = loaded.output_specs.get(ref[0], ()) if loaded else ()
            if ref[1] < len(specs):
                return specs[ref[1]]
        return pb.TensorSpec()

    def _maybe_free(self, call: CallState, ref: Ref) -> None:
        """Drops a value no local computation will read and the client won't fetch."""
        plan = call.plan
        if plan is None or ref in plan.outputs or call.readers.get(ref, 0) > 0:
            return
        slot = self._store.get(call.call_id, ref)
        if slot is not None and slot.waiting_exports:
            return
        self._store.drop(call.call_id, ref)
        call.freed.add(ref)

    # ------------------------------------------------------------ executor thread

    def _execute_loop(self) -> None:
        while True:
            with self._cv:
                while not self._run_queue and not self._stopping:
                    self._hand_over()
                    self._cv.wait()
                if self._stopping:
                    return
                grant = self._run_queue[0]
            try:
                self._run(grant)
            except Exception as err:  # a bug here must not stop the host (or hang consumers)
                log.exception("executor failed on grant %s", grant)
                error = f"grant {grant.seq} of call {grant.call_id} on host {self.host_name}: {err!r}"
                with self._cv:
                    call = self._calls.get(grant.call_id)
                    comp = call.plan.computations.get(grant.node) if call and call.plan else None
                    if call is not None and comp is not None:
                        for ref in comp.outputs:
                            self._settle_failed(call.call_id, ref, error)
                    self._cv.notify_all()
                self._finished(CompletionJob(grant, (), error, self._routed_failures(grant)))
            with self._cv:
                self._run_queue.popleft()

    def _finished(self, job: CompletionJob) -> None:
        """Executor thread: a grant was dispatched (or failed); the finisher takes it over.

        Jobs wait for company unless someone needs them now: a multi-process
        slice reports each computation, routed outputs go out at once, and
        failures are not held back."""
        self._dispatched.append(job)
        if self._block_each or job.routed or job.error or len(self._dispatched) >= FINISH_BATCH:
            self._hand_over()

    def _hand_over(self) -> None:
        """Executor thread: give the finisher what was dispatched (before any wait)."""
        if self._dispatched:
            self._finish_queue.put(tuple(self._dispatched))
            self._dispatched = []

    def _run(self, grant: pb.Grant) -> None:
        started = time.perf_counter()
        prepared = self._wait_until_runnable(grant)
        if isinstance(prepared, str):
            self._finished(CompletionJob(grant, (), prepared, self._routed_failures(grant)))
            return
        call, comp, exe, values, where = prepared
        outputs: tuple[Any, ...] = ()
        error = ""
        try:
            args = [self._as_input(v, s) for v, s in zip(values, exe.in_shardings, strict=True)]
            result = exe.fn(*args)
            outputs = tuple(jax.tree.leaves(result))
            if len(outputs) != comp.num_outputs:
                raise RuntimeError(
                    f"returned {len(outputs)} outputs, the program expects {comp.num_outputs}"
                )
            if self._block_each:
                jax.block_until_ready(outputs)
        except Exception as err:
            error = f"{where} failed: {type(err).__name__}: {err}"
            outputs = ()
        routed: list[tuple[Ref, Any, pb.TensorSpec]] = []
        inline: list[tuple[int, pb.TensorSpec]] = []
        with self._cv:
            if self._calls.get(call.call_id) is not call:
                self._store.unreserve(exe.total_out_bytes)  # released while running
                self._finished(CompletionJob(grant, outputs, error, ()))
                return
            if error:
                self._store.unreserve(exe.total_out_bytes)
            for i, ref in enumerate(comp.outputs):
                if error:
                    self._settle_failed(call.call_id, ref, error)
                else:
                    self._settle_ready(call.call_id, ref, outputs[i], exe.out_bytes[i], prepaid=True)
                assert call.plan is not None
                if ref in call.plan.routes:
                    value = None if error else outputs[i]
                    routed.append((ref, value, self._spec_of(call.call_id, ref, value)))
                if (
                    not error
                    and ref in call.plan.outputs
                    and 0 < exe.out_bytes[i] <= call.inline_output_bytes
                ):
                    inline.append((i, self._spec_of(call.call_id, ref, outputs[i])))
            for ref in comp.distinct_inputs:
                call.readers[ref] = call.readers.get(ref, 1) - 1
                self._maybe_free(call, ref)
            for ref in comp.outputs:
                self._maybe_free(call, ref)
            call.computations += 1
            call.busy_s += time.perf_counter() - started
            self._cv.notify_all()
        self._finished(CompletionJob(grant, outputs, error, tuple(routed), tuple(inline)))

    def _routed_failures(self, grant: pb.Grant) -> tuple[tuple[Ref, Any, pb.TensorSpec], ...]:
        """A computation that failed before running: its routed outputs fail downstream."""
        with self._cv:
            call = self._calls.get(grant.call_id)
            if call is None or call.plan is None:
                return ()
            comp = call.plan.computations.get(grant.node)
            if comp is None:
                return ()
            return tuple(
                (ref, None, self._spec_of(call.call_id, ref, None))
                for ref in comp.outputs
                if ref in call.plan.routes
            )

    def _wait_until_runnable(
        self, grant: pb.Grant
    ) -> str | tuple[CallState, LocalComputation, Executable, list[Any], str]:
        """Waits for the grant's inputs and store space; an error string if it cannot run.
        On success the outputs' bytes are reserved in the store."""
        deadline = time.monotonic() + self.input_timeout_s
        with self._cv:
            call = self._calls.get(grant.call_id)
            head = f"grant {grant.seq} (computation {grant.node}) of call {grant.call_id} on host {self.host_name}"
            if call is None or call.plan is None:
                if grant.call_id in self._released:
                    return f"{head}: the call was already released"
                if call is not None and call.failed:
                    return f"{head}: {call.failed}"
                return f"{head}: the call was not launched on this host"
            plan = call.plan
            comp = plan.computations.get(grant.node)
            if comp is None:
                return f"{head}: computation {grant.node} is not on slice '{plan.slice}' of this host"
            where = (
                f"program '{plan.program_name}' computation '{comp.name}' (index {comp.index}) "
                f"of call {call.call_id} on host {self.host_name}"
            )
            outcome = self._fail_outputs_if(call, comp, self._load_error(plan, comp))
            if outcome:
                return outcome
            loaded = self._programs[plan.program_id]
            exe = loaded.executables[comp.index]
            while True:
                if self._calls.get(call.call_id) is not call:
                    return f"{where}: the call was released"
                if call.failed:
                    return self._fail_outputs(call, comp, f"{where}: call failed: {call.failed}")
                missing: Ref | None = None
                for ref in comp.inputs:
                    slot = self._store.get(call.call_id, ref)
                    if slot is None or not slot.settled:
                        missing = missing or ref
                    elif slot.state == "failed":
                        return self._fail_outputs(
                            call, comp, f"{where}: input {ref_name(ref)} failed: {slot.error}"
                        )
                if missing is None:
                    break
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return self._fail_outputs(
                        call, comp,
                        f"{where}: timed out after {self.input_timeout_s:g} s waiting for "
                        f"{ref_name(missing)} from {plan.origin(missing)}",
                    )
                self._hand_over()
                self._cv.wait(min(left, 1.0))
            need = exe.total_out_bytes
            if need > self._store.limit:
                return self._fail_outputs(
                    call, comp,
                    f"{where}: outputs need {need} B, more than the whole object store "
                    f"limit of {self._store.limit} B (PATHWAYS_STORE_LIMIT_BYTES)",
                )
            while self._store.free < need:
                left = deadline - time.monotonic()
                if self._calls.get(call.call_id) is not call:
                    return f"{where}: the call was released"
                if call.failed:
                    return self._fail_outputs(call, comp, f"{where}: call failed: {call.failed}")
                if left <= 0 or self._stopping:
                    return self._fail_outputs(
                        call, comp,
                        f"{where}: object store full for {self.input_timeout_s:g} s: "
                        + self._store.describe_full(need),
                    )
                self._hand_over()
                self._cv.wait(min(left, 1.0))
            self._store.reserve(need)
            values = [self._store.slot(call.call_id, ref).value for ref in comp.inputs]
            return call, comp, exe, values, where

    def _load_error(self, plan: CallPlan, comp: LocalComputation) -> str:
        loaded = self._programs.get(plan.program_id)
        if loaded is None:
            return f"program {plan.program_id} is not loaded on host {self.host_name}"
        error = loaded.errors.get(comp.index)
        if error:
            return error
        if comp.index not in loaded.executables:
            return f"computation {comp.index} has no executable on host {self.host_name}"
        return ""

    def _fail_outputs_if(self, call: CallState, comp: LocalComputation, error: str) -> str:
        return self._fail_outputs(call, comp, error) if error else ""

    def _fail_outputs(self, call: CallState, comp: LocalComputation, error: str) -> str:
        """The computation cannot run: its outputs fail, so consumers fail at once."""
        for ref in comp.outputs:
            self._settle_failed(call.call_id, ref, error)
        for ref in comp.distinct_inputs:
            call.readers[ref] = call.readers.get(ref, 1) - 1
            self._maybe_free(call, ref)
        self._cv.notify_all()
        return error

    def _as_input(self, value: Any, sharding: Sharding) -> Any:
        """A stored value as an argument with the consumer's input sharding.

        Whether two shardings are equivalent is remembered: asking jax builds
        HLO shardings, which costs more than dispatching a small computation."""
        if isinstance(value, np.ndarray):
            host = value
            return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
        have = value.sharding
        if have is sharding:
            return value
        key = (have, sharding, value.ndim)
        same = self._equivalent.get(key)
        if same is None:
            same = self._equivalent[key] = bool(have.is_equivalent_to(sharding, value.ndim))
        if same:
            return value
        return jax.device_put(value, sharding)

    # ------------------------------------------------------------ finisher thread

    def _finish_loop(self) -> None:
        while True:
            job = self._finish_queue.get()
            if job is None:
                return
            try:
                if isinstance(job, tuple):
                    self._finish_computations(job)
                else:
                    self._write_export(job)
            except Exception:
                log.exception("finisher failed on %s", job)

    def _finish_computations(self, jobs: tuple[CompletionJob, ...]) -> None:
        """One batch of dispatched computations: wait for each, report them together.

        What finished is reported before waiting on a computation still
        running, so a long computation never holds back the completions (and
        the window room) of those before it."""
        done: list[pb.Completion] = []
        for job in jobs:
            error = job.error
            if not error and job.outputs and not self._block_each:
                if done and not all(_is_ready(x) for x in job.outputs):
                    self.outbox.completions(done)
                    done = []
                try:
                    jax.block_until_ready(job.outputs)
                except Exception as err:
                    error = f"computation {job.grant.node} of call {job.grant.call_id} failed on host {self.host_name}: {type(err).__name__}: {err}"
                    self._fail_late(job, error)
            completion = pb.Completion(
                seq=job.grant.seq, call_id=job.grant.call_id, node=job.grant.node,
                ok=not error, error=error,
            )
            if not error:
                for i, spec in job.inline:
                    completion.outputs.add(
                        value=pb.ValueRef(node=job.grant.node, index=i),
                        spec=spec,
                        data=np.ascontiguousarray(np.asarray(job.outputs[i])).tobytes(),
                    )
            done.append(completion)
            if job.routed:
                self.outbox.completions(done)
                done = []
            for ref, value, spec in job.routed:
                self._write_export(
                    ExportJob(job.grant.call_id, ref, 0, None if error else value, error if error else "", spec, False)
                )
        if done:
            self.outbox.completions(done)

    def _fail_late(self, job: CompletionJob, error: str) -> None:
        """Execution failed after dispatch: replace the outputs that were published."""
        with self._cv:
            for i, value in enumerate(job.outputs):
                ref = (job.grant.node, i)
                slot = self._store.get(job.grant.call_id, ref)
                if slot is not None and slot.value is value:
                    self._settle_failed(job.grant.call_id, ref, error)
            self._cv.notify_all()

    def _write_export(self, job: ExportJob) -> None:
        exported = pb.Exported(call_id=job.call_id, token=job.token, spec=job.spec)
        exported.value.node, exported.value.index = job.ref
        error = job.error
        if not error:
            if job.value is None:
                error = f"{ref_name(job.ref)} of call {job.call_id} has no value on host {self.host_name}"
            else:
                try:
                    for piece in self._pieces(job.value):
                        path = self._shm.write_piece(piece)
                        exported.pieces.append(
                            pb.Piece(start=piece.start, stop=piece.stop, path=path, nbytes=piece.data.nbytes)
                        )
                except Exception as err:
                    for p in exported.pieces:
                        remove(p.path)
                    del exported.pieces[:]
                    error = (
                        f"{ref_name(job.ref)} of call {job.call_id} could not be exported from "
                        f"host {self.host_name}: {type(err).__name__}: {err}"
                    )
        exported.error = error
        self.outbox.exported(exported)
        if job.release:
            with self._cv:
                slot = self._store.get(job.call_id, job.ref)
                if slot is not None and slot.settled and not slot.waiting_exports:
                    self._store.drop(job.call_id, job.ref)
                    call = self._calls.get(job.call_id)
                    if call is not None:
                        call.freed.add(job.ref)
            self.outbox.nudge()

    def _pieces(self, value: Any) -> list[Piece]:
        if isinstance(value, np.ndarray) and self.host_index != 0:
            return []  # every host of the slice holds it whole; host 0 answers for all
        return value_pieces(value)


def _is_ready(value: Any) -> bool:
    is_ready = getattr(value, "is_ready", None)
    return bool(is_ready()) if is_ready is not None else True
