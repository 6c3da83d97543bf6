"""The calls a host knows, and their values: the bookkeeping half of `HostState`.

A call's Launch turns its program's layout into the call's plan and creates its
outputs as futures in the object store; values then settle as they arrive
or are computed, fetches are answered once their value settles (or at once
with the reason there is none), and a value no local computation reads and
the client will not fetch is dropped right after its last use. Failing a call
fails every value it still waits for; releasing it drops what it holds and
makes late messages for it no-ops. Pure: the run order (`host_state`) calls
in here and passes on the instructions.

Objects. Releasing a call keeps the outputs its client still holds handles
to (`CallReleased.keep`): they stay in the store under their call's id until
`ObjectsDropped` frees them. A later call binds such an object as one of its
inputs in place (`Launch.aliases`): the input slot takes the object's value
(no copy, no bytes counted twice) at once, or when the object settles if its
call is still computing it. A call on another slice that reads an object
gets it host to host (`ObjectForwarded`): the object is exported under that
call's id and input, at once or once it settles, and stays here. An object
dropped while aliases or forwards wait for it goes once they have it.

Per program, not per call. What a computation's runs need from its loaded
program (why it cannot run, the bytes its outputs take) is worked out once
when the program loads (`PreparedComputation`), so a chain of small
computations pays for a lookup, not a recomputation, on each grant.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pathways_wire import pathways_pb2 as pb
from pathways_worker.value_ref import Ref, ref_name, ref_of
from pathways_worker.worker.call_plan import CallPlan, LocalComputation, plan_call
from pathways_worker.worker.instructions import Export, Instruction, Log, StoreChanged
from pathways_worker.worker.object_store import ObjectId, ObjectStore, Slot, object_name
from pathways_worker.worker.stimuli import (
    CallFailed,
    CallLaunched,
    CallReleased,
    ComputationFailedLate,
    ExportRequested,
    ExportWritten,
    ObjectForwarded,
    ObjectsDropped,
    ProgramLoaded,
    ValueArrived,
)

RELEASED_MEMORY = 4096
"""Released call ids remembered, to drop late messages for them."""


@dataclass(frozen=True, slots=True)
class PreparedComputation:
    """One local computation of a loaded program, with what each of its runs needs."""

    comp: LocalComputation
    load_error: str
    """Why it cannot run on this host ("" when it can)."""
    out_bytes: tuple[int, ...]
    """The bytes each output takes on this host."""
    need: int
    """Store bytes reserved for its outputs before it runs."""
    partial: frozenset[int]
    """Outputs this host holds only part of (split across hosts)."""


@dataclass(slots=True)
class CallState:
    call_id: str
    plan: CallPlan | None = None
    failed: str = ""
    readers: dict[Ref, int] = field(default_factory=dict)
    freed: set[Ref] = field(default_factory=set)
    fetched: set[Ref] = field(default_factory=set)
    """Outputs the client fetched with release: they go once no local computation reads them."""
    inline_output_bytes: int = 0
    computations: int = 0
    overlapped: int = 0
    """Computations dispatched while the one before them still ran (multi-process slices)."""
    busy_s: float = 0.0


class HostCalls:
    def __init__(self, host_name: str, store_limit_bytes: int) -> None:
        self.host_name = host_name
        self.store = ObjectStore(store_limit_bytes)
        self.programs: dict[str, ProgramLoaded] = {}
        self._prepared: dict[str, dict[int, PreparedComputation]] = {}
        self.calls: dict[str, CallState] = {}
        self._released: set[str] = set()
        self._released_order: deque[str] = deque()
        self._aliases: dict[ObjectId, list[ObjectId]] = {}
        """Objects not settled yet -> the call inputs bound to them."""
        self._forwards: dict[ObjectId, list[ObjectForwarded]] = {}
        """Objects not settled yet -> the forwards waiting to send them."""
        self._drop_when_settled: set[ObjectId] = set()

    def was_released(self, call_id: str) -> bool:
        return call_id in self._released

    def load(self, loaded: ProgramLoaded, out: list[Instruction]) -> None:
        self.programs[loaded.layout.program_id] = loaded
        self._prepared[loaded.layout.program_id] = {
            index: self._prepare(loaded, comp) for index, comp in loaded.layout.computations.items()
        }

    def _prepare(self, loaded: ProgramLoaded, comp: LocalComputation) -> PreparedComputation:
        out_bytes = loaded.out_bytes.get(comp.index)
        error = loaded.load_errors.get(comp.index, "")
        if out_bytes is None and not error:
            error = f"computation {comp.index} has no executable on host {self.host_name}"
        out_bytes = out_bytes or ()
        return PreparedComputation(
            comp, error, out_bytes, sum(out_bytes), loaded.partial.get(comp.index, frozenset())
        )

    def launch(self, launched: CallLaunched, out: list[Instruction]) -> None:
        launch = launched.launch
        if launch.call_id in self._released:
            return
        call = self.call(launch.call_id)
        if call.plan is not None:
            return
        loaded = self.programs.get(launch.program_id)
        if loaded is None:
            call.failed = (
                f"call {launch.call_id}: program {launch.program_id} was never loaded "
                f"on host {self.host_name}"
            )
            return
        call.plan = plan_call(loaded.layout, launch)
        call.readers = dict(call.plan.readers)
        call.inline_output_bytes = launch.inline_output_bytes
        # values that arrived before the launch, which no plan could free then
        early = [slot.oid.ref for slot in self.store.held_by(call.call_id) if slot.settled]
        # Futures for the call's outputs made here, which the client may drop, fetch or
        # pass on before they exist. A value only this host's computations read needs
        # none: its slot is made when it settles (or when a fetch asks for it), and a
        # run's intermediates never get one (a 128-computation call made and dropped a
        # slot per computation for nothing).
        local = loaded.layout.computations
        self.store.add_futures(call.call_id, [ref for ref in call.plan.outputs if ref[0] in local])
        for arrived in launched.inputs:
            self._settle_arrived(call, arrived, out)
        for alias in launch.aliases:
            self._bind_alias(
                ObjectId(call.call_id, ref_of(alias.input)),
                ObjectId(alias.object.call_id, ref_of(alias.object.value)),
                out,
            )
        for ref in early:
            self.maybe_free(call, ref)

    def fail_call(self, failed: CallFailed, out: list[Instruction]) -> None:
        """The controller failed the call: what it still waits for fails (the head grant too)."""
        if failed.call_id in self._released:
            return
        call = self.call(failed.call_id)
        call.failed = failed.message or "failed by the controller"
        error = f"call {call.call_id} failed: {call.failed}"
        for slot in self.store.held_by(call.call_id):
            if not slot.settled:
                self.settle_failed(slot.oid, error, out)

    def release(self, released: CallReleased, out: list[Instruction]) -> None:
        """Frees every value of the call; fetches still waiting get an error."""
        call_id = released.call_id
        call = self.calls.pop(call_id, None)
        self._remember_released(call_id)
        for slot in self.store.release(call_id, released.keep):
            for request in slot.waiting_exports:
                self._export(request, None, f"call {call_id} was released on host {self.host_name}", out)
        if call is not None and call.computations:
            out.append(Log(
                f"call {call_id} released: {call.computations} computations, "
                f"{1e3 * call.busy_s / call.computations:.3f} ms each in the executor, "
                f"{call.overlapped} dispatched while the one before still ran"
            ))
        out.append(StoreChanged())

    def drop_objects(self, dropped: ObjectsDropped, out: list[Instruction]) -> None:
        """The client let go of these objects; one still being computed goes once settled."""
        for oid in dropped.objects:
            slot = self.store.get(oid)
            if slot is None:
                continue
            if not slot.settled:
                self._drop_when_settled.add(oid)
                continue
            self.store.drop(oid)
            call = self.calls.get(oid.call_id)
            if call is not None:
                call.freed.add(oid.ref)
        out.append(StoreChanged())

    def forward(self, forwarded: ObjectForwarded, out: list[Instruction]) -> None:
        """Sends an object to another slice's hosts once it exists; it stays here."""
        slot = self.store.get(forwarded.source)
        if slot is None:
            self._send_forward(
                forwarded, None,
                f"input object {object_name(forwarded.source)} is not on host {self.host_name}: its "
                "client dropped it, or its gang was relaunched since it was made",
                out,
            )
        elif slot.settled:
            self._send_forward(forwarded, slot.value, slot.error, out)
        else:
            self._forwards.setdefault(forwarded.source, []).append(forwarded)

    def _send_forward(self, forwarded: ObjectForwarded, value: object, error: str, out: list[Instruction]) -> None:
        if error:
            error = f"input object {object_name(forwarded.source)} failed on host {self.host_name}: {error}"
        out.append(Export(forwarded.target, 0, value, error, forwarded.declared, release=False))

    def _bind_alias(self, target: ObjectId, source: ObjectId, out: list[Instruction]) -> None:
        slot = self.store.get(source)
        if slot is None:
            self.settle_failed(
                target,
                f"input object {object_name(source)} is not on host {self.host_name}: its client "
                "dropped it, or its gang was relaunched since it was made",
                out,
            )
        elif slot.settled:
            self._settle_alias(target, slot, out)
        else:
            self._aliases.setdefault(source, []).append(target)

    def _settle_alias(self, target: ObjectId, source: Slot, out: list[Instruction]) -> None:
        call = self.calls.get(target.call_id)
        existing = self.store.get(target)
        if call is None or (existing is not None and existing.settled):
            return
        if source.state == "failed":
            self.settle_failed(target, f"input object {object_name(source.oid)} failed: {source.error}", out)
        else:
            self.settle_ready(target, source.value, 0, False, out)
            self.maybe_free(call, target.ref)

    def _settled(self, slot: Slot, out: list[Instruction]) -> None:
        """Inputs bound to the value get it; a drop that waited for it happens."""
        if self._aliases:
            for target in self._aliases.pop(slot.oid, ()):
                self._settle_alias(target, slot, out)
        if self._forwards:
            for forwarded in self._forwards.pop(slot.oid, ()):
                self._send_forward(forwarded, slot.value, slot.error, out)
        if self._drop_when_settled and slot.oid in self._drop_when_settled:
            self._drop_when_settled.discard(slot.oid)
            self.store.drop(slot.oid)

    def arrive(self, arrived: ValueArrived, out: list[Instruction]) -> None:
        """A value from outside the slice (program input or another slice's output)."""
        if arrived.oid.call_id in self._released:
            return
        if self._settle_arrived(self.call(arrived.oid.call_id), arrived, out):
            out.append(StoreChanged())

    def request_export(self, requested: ExportRequested, out: list[Instruction]) -> None:
        """The client fetches a value: export it once it exists (an error at once for a
        call this host does not know)."""
        request = requested.request
        ref = ref_of(request.value)
        kept = self.store.get(ObjectId(request.call_id, ref))
        if kept is not None and request.call_id not in self.calls:  # an object of a released call
            if kept.settled:
                self._export(request, kept.value, kept.error, out)
            else:
                kept.waiting_exports += (request,)
            return
        if request.call_id in self._released:
            self._export(
                request, None, f"call {request.call_id} was released on host {self.host_name}", out
            )
            return
        if request.call_id not in self.calls:
            # A client fetches what a call it started made, once the call ended here; a call
            # this host never saw gets no state that nothing would ever free.
            self._export(
                request, None,
                f"call {request.call_id} is not known on host {self.host_name}: it never ran "
                "here (or the host was replaced since)", out,
            )
            return
        call = self.call(request.call_id)
        if ref in call.freed:
            self._export(
                request, None,
                f"{ref_name(ref)} of call {request.call_id} was freed on host "
                f"{self.host_name} after its last use (it is not an output of the call)",
                out,
            )
            return
        slot = self.store.slot(ObjectId(request.call_id, ref))
        if slot.settled:
            self._export(request, slot.value, slot.error, out)
        else:
            slot.waiting_exports += (request,)

    def fail_late(self, failed: ComputationFailedLate, out: list[Instruction]) -> None:
        """Execution failed after dispatch: the outputs it published fail."""
        for i, value in enumerate(failed.outputs):
            slot = self.store.get(ObjectId(failed.grant.call_id, (failed.grant.node, i)))
            if slot is not None and slot.value is value:
                self.settle_failed(slot.oid, failed.error, out)

    def export_written(self, written: ExportWritten, out: list[Instruction]) -> None:
        """A fetch that releases its value was written: the value goes, once nothing here reads it.

        A later computation of the call on this host may still read a value the
        client fetched (an output that is also an input): it stays until that
        computation is done with it (`release_inputs`)."""
        oid = written.oid
        call = self.calls.get(oid.call_id)
        if call is not None:
            call.fetched.add(oid.ref)
            if call.readers.get(oid.ref, 0) > 0:
                out.append(StoreChanged())
                return
        slot = self.store.get(oid)
        if slot is not None and slot.settled and not slot.waiting_exports:
            self.store.drop(oid)
            if call is not None:
                call.freed.add(oid.ref)
        out.append(StoreChanged())

    def get(self, call_id: str) -> CallState | None:
        return self.calls.get(call_id)

    def call(self, call_id: str) -> CallState:
        """The call's state, created by the first message about it."""
        return self.calls.get(call_id) or self.calls.setdefault(call_id, CallState(call_id))

    def _remember_released(self, call_id: str) -> None:
        if call_id in self._released:
            return
        self._released.add(call_id)
        self._released_order.append(call_id)
        while len(self._released_order) > RELEASED_MEMORY:
            self._released.discard(self._released_order.popleft())

    def prepared_of(self, plan: CallPlan) -> dict[int, PreparedComputation]:
        """Every computation of the call's program as it loaded here, by index (none when
        the program is not loaded): what `prepared` looks up, for a caller that looks up
        many."""
        return self._prepared.get(plan.program_id, {})

    def prepared(self, plan: CallPlan, comp: LocalComputation) -> PreparedComputation | str:
        """The computation as its program loaded here, or why it cannot run."""
        prepared = self._prepared.get(plan.program_id)
        if prepared is None:
            return f"program {plan.program_id} is not loaded on host {self.host_name}"
        found = prepared.get(comp.index)
        if found is None:
            return f"computation {comp.index} has no executable on host {self.host_name}"
        return found.load_error or found

    def _settle_arrived(self, call: CallState, arrived: ValueArrived, out: list[Instruction]) -> bool:
        """A value from outside settles its slot, unless one settled it already."""
        oid = ObjectId(call.call_id, arrived.oid.ref)
        existing = self.store.get(oid)
        if existing is not None and existing.settled:
            return False
        if arrived.value is None:
            self.settle_failed(oid, arrived.error, out)
        else:
            self.settle_ready(oid, arrived.value, arrived.nbytes, False, out)
            self.maybe_free(call, oid.ref)
        return True

    def settle_ready(
        self, oid: ObjectId, value: object, nbytes: int, prepaid: bool, out: list[Instruction]
    ) -> None:
        slot = self.store.set_ready(oid, value, nbytes, prepaid)
        self._flush_exports(slot, out)
        self._settled(slot, out)

    def settle_failed(self, oid: ObjectId, error: str, out: list[Instruction]) -> None:
        slot = self.store.set_failed(oid, error)
        self._flush_exports(slot, out)
        self._settled(slot, out)

    def _flush_exports(self, slot: Slot, out: list[Instruction]) -> None:
        if slot.waiting_exports:
            waiting, slot.waiting_exports = slot.waiting_exports, ()
            for request in waiting:
                self._export(request, slot.value, slot.error, out)

    def _export(self, request: pb.ExportRequest, value: object, error: str, out: list[Instruction]) -> None:
        ref = ref_of(request.value)
        if value is None and not error:
            error = f"{ref_name(ref)} of call {request.call_id} has no value on host {self.host_name}"
        declared = None if value is not None else self.declared(request.call_id, ref)
        oid = ObjectId(request.call_id, ref)
        out.append(Export(oid, request.token, value, error, declared, request.release))

    def declared(self, call_id: str, ref: Ref) -> pb.TensorSpec:
        """The program's spec of a value, for exports that carry no value."""
        call = self.calls.get(call_id)
        if call is not None and call.plan is not None and ref[0] >= 0:
            loaded = self.programs.get(call.plan.program_id)
            specs = loaded.output_specs.get(ref[0], ()) if loaded else ()
            if ref[1] < len(specs):
                return specs[ref[1]]
        return pb.TensorSpec()

    def release_inputs(self, call: CallState, comp: LocalComputation, passed: frozenset[Ref] = frozenset()) -> None:
        """The computation is done reading its inputs (it ran, or never will); those
        `passed` straight from the grant that made them never were in the store."""
        for ref in comp.distinct_inputs:
            if ref in passed:
                continue
            call.readers[ref] = call.readers.get(ref, 1) - 1
            self.maybe_free(call, ref)

    def maybe_free(self, call: CallState, ref: Ref) -> None:
        """Drops a value no local computation will read and the client won't fetch."""
        plan = call.plan
        if plan is None or call.readers.get(ref, 0) > 0 or (ref in plan.outputs and ref not in call.fetched):
            return
        oid = ObjectId(call.call_id, ref)
        slot = self.store.get(oid)
        if slot is not None and slot.waiting_exports:
            return
        self.store.drop(oid)
        call.freed.add(ref)
