"""The worker's executor: the threaded driver around the host's state machine.

Every decision (which grant runs, when, what fails, what is freed, when the
finisher gets a batch) is `HostState`'s. This module only turns the sidecar's
commands into stimuli — compiling programs, mapping arrived values from
shared memory, decoding inline inputs on the way — and carries out the
instructions that come back:

* the session reader feeds commands;
* the executor thread carries out `Dispatch`: it calls the computation's
  executable (JAX dispatch is asynchronous, so this returns before the
  computation has run) and feeds the result back, which usually answers with
  the next `Dispatch` — a chain of computations runs on this thread without a
  hand-off; a `DispatchRun` it carries out as its dispatches one after another,
  each grant's outputs at hand for the grants after it, and feeds back one
  `RunDispatched`;
* the finisher (`finisher`) carries out `FinishBatch` and `Export`; a batch
  the executor thread's own answer hands over, all of whose outputs are
  ready, it may finish itself (`Finisher.claim`), once out of the lock;
* the alarm clock (`alarm_clock`) rings the timers the machine asks for.

The machine is fed under one lock, and whatever its answer puts on a queue is
put there under the same lock, so instructions are carried out in the order
they were given.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from pathways_wire import pathways_pb2 as pb
from pathways_wire.command_batches import each_alone
from pathways_wire.host_blocks import HeldBlock
from pathways_wire.transfer import from_wire, parse_spec
from pathways_worker.shared_memory import ShmDir
from pathways_worker.value_ref import Ref, ref_name, ref_of
from pathways_worker.worker import stimuli
from pathways_worker.worker.alarm_clock import AlarmClock
from pathways_worker.worker.call_plan import LocalComputation, layout_program
from pathways_worker.worker.executables import Executable, ExecutableCache, LoadError
from pathways_worker.worker.finisher import Finisher, is_ready
from pathways_worker.worker.host_state import HostState
from pathways_worker.worker.instructions import (
    CancelTimer,
    Dispatch,
    DispatchRun,
    Export,
    FinishBatch,
    Instruction,
    Log,
    RoomWanted,
    RunValue,
    StartTimer,
    StoreChanged,
)
from pathways_worker.worker.object_store import ObjectId
from pathways_worker.worker.outbox import WorkerOutbox
from pathways_worker.worker.stimuli import ComputationDispatched, RunDispatched, Stimulus, TimerFired, grants_of

log = logging.getLogger(__name__)


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
        self._shm = shm
        self._lock = threading.Lock()
        self._state = HostState(
            host_name, store_limit_bytes, input_timeout_s,
            multi_process=jax.process_count() > 1, first_host=host_index == 0,
        )
        self._cache = ExecutableCache(devices if devices is not None else jax.devices())
        self._executables: dict[str, dict[int, Executable]] = {}
        self._equivalent: dict[tuple[Sharding, Sharding, int], bool] = {}
        self._dispatches: queue.SimpleQueue[Dispatch | DispatchRun | None] = queue.SimpleQueue()
        self.outbox = WorkerOutbox(
            lambda: self._state.store.used, store_limit_bytes, lambda: self._state.in_hand + self._finisher.pending,
            lambda: self._state.room_wanted,
        )
        self._finisher = Finisher(host_name, host_index, shm, self.outbox, self._feed)
        self._clock = AlarmClock(lambda timer: self._feed(TimerFired(timer)))
        self._thread = threading.Thread(target=self._execute_loop, name="executor", daemon=True)
        self._thread.start()

    @property
    def store_bytes(self) -> int:
        with self._lock:
            return self._state.store.used

    def stop(self) -> None:
        self._dispatches.put(None)
        self._finisher.stop()
        self._clock.stop()

    # ------------------------------------------------------------ commands

    def handle(self, command: pb.WorkerCommand) -> None:
        kind = command.WhichOneof("command")
        if kind == "batch":
            each_alone(command.batch.commands, self.handle, log, "command")
        elif kind == "load":
            self.load(command.load)
        elif kind == "launch":
            inputs = tuple(self._inline(command.launch.call_id, v) for v in command.launch.inputs)
            self._feed(stimuli.CallLaunched(command.launch, inputs))
        elif kind == "grants":
            grants = command.grants
            self._feed(stimuli.GrantsReceived(grants_of(grants), not grants.none_waiting))
        elif kind == "fail":
            self._feed(stimuli.CallFailed(command.fail.call_id, command.fail.message))
        elif kind == "release":
            release = command.release
            self._feed(stimuli.CallReleased(release.call_id, frozenset(ref_of(v) for v in release.keep)))
        elif kind == "drop":
            self._feed(stimuli.ObjectsDropped(tuple(
                ObjectId(o.call_id, ref_of(o.value)) for o in command.drop.objects
            )))
        elif kind == "forward":
            forward = command.forward
            self._feed(stimuli.ObjectForwarded(
                ObjectId(forward.object.call_id, ref_of(forward.object.value)),
                ObjectId(forward.call_id, ref_of(forward.input)),
                forward.spec,
            ))
        elif kind == "arrival":
            self._feed(self._arrived(command.arrival))
        elif kind == "export":
            self._feed(stimuli.ExportRequested(command.export))
        else:
            log.warning("ignoring empty worker command")

    def load(self, host_program: pb.HostProgram) -> None:
        """Compiles the host's computations of a program; what cannot load says why."""
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
        self._executables[host_program.program_id] = executables
        for error in errors.values():
            log.error("%s", error)
        out_bytes = {index: exe.out_bytes for index, exe in executables.items()}
        partial = {index: exe.out_partial for index, exe in executables.items() if exe.out_partial}
        self._feed(stimuli.ProgramLoaded(layout_program(host_program), errors, out_bytes, specs, partial))

    def _inline(self, call_id: str, inline: pb.InlineValue) -> stimuli.ValueArrived:
        """A program input that came with the launch."""
        oid = ObjectId(call_id, ref_of(inline.value))
        try:
            value = from_wire(inline.spec, inline.data)
        except Exception as err:
            error = f"cannot load inline {ref_name(oid.ref)} on host {self.host_name}: {err}"
            return stimuli.ValueArrived(oid, None, 0, error)
        return stimuli.ValueArrived(oid, value, int(value.nbytes))

    def _arrived(self, arrival: pb.Arrival) -> stimuli.ValueArrived:
        """A value from outside the slice, mapped from the file the sidecar wrote
        (or, for a small one, decoded from the Arrival's bytes); where only a block
        of it came, that block, held as such (`HeldBlock`)."""
        oid = ObjectId(arrival.call_id, ref_of(arrival.value))
        if arrival.error:
            return stimuli.ValueArrived(oid, None, 0, arrival.error)
        try:
            shape, dtype = parse_spec(arrival.spec)
            start = tuple(int(x) for x in arrival.block_start)
            stop = tuple(int(x) for x in arrival.block_stop)
            held = tuple(b - a for a, b in zip(start, stop, strict=True)) if start else shape
            if arrival.path:
                path = self._shm.own_file(arrival.path)
                spare_dir = self._shm.sibling_dir(arrival.spare_dir) if arrival.spare_dir else ""
                value: Any = self._shm.map_arrived(path, held, dtype, spare_dir)
            else:
                value = np.frombuffer(arrival.data, dtype).reshape(held)
            if start:
                value = HeldBlock(shape, start, value)
        except Exception as err:
            error = f"cannot load arrived {ref_name(oid.ref)} on host {self.host_name}: {err}"
            return stimuli.ValueArrived(oid, None, 0, error)
        return stimuli.ValueArrived(oid, value, int(value.nbytes))

    # ------------------------------------------------------------ the machine

    def _feed(self, stimulus: Stimulus) -> None:
        """From any thread but the executor's: a `Dispatch` goes to the executor thread."""
        dispatch = self._handle(stimulus)
        if dispatch is not None:
            self._dispatches.put(dispatch)

    def _handle(
        self, stimulus: Stimulus, here: list[FinishBatch] | None = None
    ) -> Dispatch | DispatchRun | None:
        """Feeds the machine and carries out its answer, except a `Dispatch` or `DispatchRun`,
        which it returns, and batches the finisher lets the caller finish (into `here`)."""
        dispatch = None
        with self._lock:
            for instruction in self._state.handle(stimulus):
                if isinstance(instruction, (Dispatch, DispatchRun)):
                    dispatch = instruction
                elif here is not None and isinstance(instruction, FinishBatch) and self._finisher.claim(instruction):
                    here.append(instruction)
                else:
                    self._carry_out(instruction)
        return dispatch

    def _carry_out(self, instruction: Instruction) -> None:
        if isinstance(instruction, (FinishBatch, Export)):
            self._finisher.put(instruction)
        elif isinstance(instruction, StoreChanged):
            self.outbox.nudge()
        elif isinstance(instruction, RoomWanted):
            self.outbox.reconsider()
        elif isinstance(instruction, StartTimer):
            self._clock.start(instruction.timer, instruction.delay_s)
        elif isinstance(instruction, CancelTimer):
            self._clock.cancel(instruction.timer)
        elif isinstance(instruction, Log):
            log.debug("%s", instruction.message)

    # ------------------------------------------------------------ executor thread

    def _execute_loop(self) -> None:
        while True:
            dispatch = self._dispatches.get()
            if dispatch is None:
                return
            here: list[FinishBatch] = []
            while dispatch is not None:
                running, dispatch = dispatch, None
                try:
                    done = self._dispatch(running) if isinstance(running, Dispatch) else self._dispatch_run(running)
                    dispatch = self._handle(done, here)
                except Exception:  # a bug: say so, and keep serving the other calls
                    log.exception("executor failed on %s", running)
                for batch in here:
                    self._finisher.finish_claimed(batch)
                here.clear()

    def _dispatch_run(self, run: DispatchRun) -> RunDispatched:
        """The run's grants in order, each reading what those before it made; stops at
        the first JAX refuses.

        The grants after the first are of the same program and wait for nothing
        (`host_state._gather_run`), so each costs its executable's call and little
        else: its arguments, the sharding check, one clock reading."""
        made: dict[Ref, Any] = {}
        first = self._dispatch(run.first, made)
        results = [first]
        if first.error or not run.rest:
            return RunDispatched(tuple(results))
        executables = self._executables[run.first.program_id]
        clock = time.perf_counter
        started = clock()
        for dispatch in run.rest:
            comp = dispatch.comp
            try:
                args = [made[v.ref] if type(v) is RunValue else v for v in dispatch.inputs]
                outputs = self._call(executables[comp.index], comp, args, ())
                made.update(zip(comp.outputs, outputs))
            except Exception as err:
                results.append(self._refused(dispatch, err, clock() - started))
                break
            now = clock()
            results.append(ComputationDispatched(dispatch.grant, outputs, "", now - started))
            started = now
        return RunDispatched(tuple(results))

    def _dispatch(self, dispatch: Dispatch, made: dict[Ref, Any] | None = None) -> ComputationDispatched:
        """`made`, in a run: the outputs of its grants so far, for the `RunValue`s among the
        inputs, which this grant's outputs join."""
        started = time.perf_counter()
        comp = dispatch.comp
        overlapped = False
        try:
            if dispatch.wait_for and not all(is_ready(x) for x in dispatch.wait_for):
                jax.block_until_ready(dispatch.wait_for)
            args = (
                list(dispatch.inputs) if made is None
                else [made[v.ref] if type(v) is RunValue else v for v in dispatch.inputs]
            )
            exe = self._executables[dispatch.program_id][comp.index]
            self._accept(exe, args, dispatch.in_flight)  # a reshard waits for the one in flight
            if dispatch.in_flight:
                overlapped = not all(is_ready(x) for x in dispatch.in_flight)
            outputs = self._call(exe, comp, args, dispatch.in_flight)
            if made is not None:
                made.update(zip(comp.outputs, outputs))
        except Exception as err:
            return self._refused(dispatch, err, time.perf_counter() - started)
        return ComputationDispatched(dispatch.grant, outputs, "", time.perf_counter() - started, overlapped)

    def _call(
        self, exe: Executable, comp: LocalComputation, args: list[Any], in_flight: tuple[object, ...]
    ) -> tuple[Any, ...]:
        """The computation's outputs, each argument given the input's sharding first."""
        self._accept(exe, args, in_flight)
        outputs = exe.fn(*args)
        if len(outputs) != comp.num_outputs:
            raise RuntimeError(f"returned {len(outputs)} outputs, the program expects {comp.num_outputs}")
        return outputs

    def _accept(self, exe: Executable, args: list[Any], in_flight: tuple[object, ...]) -> None:
        """Each argument in place with the input's sharding (`_as_input`), unless it has it."""
        accepted = exe.accepted
        for i, value in enumerate(args):
            if getattr(value, "sharding", None) is not accepted[i]:
                args[i] = self._as_input(value, exe, i, in_flight)

    def _refused(self, dispatch: Dispatch, err: Exception, busy_s: float) -> ComputationDispatched:
        """JAX would not take the grant's computation: the result that says why."""
        where = dispatch.comp.where(dispatch.grant.call_id, self.host_name)
        return ComputationDispatched(dispatch.grant, (), f"{where} failed: {type(err).__name__}: {err}", busy_s)

    def _as_input(self, value: Any, exe: Executable, i: int, in_flight: tuple[object, ...]) -> Any:
        """A stored value as argument `i` of `exe`, with the input's sharding.

        Whether two shardings are equivalent is remembered: asking jax builds
        HLO shardings, which costs more than dispatching a small computation;
        one found equivalent is also kept as the input's `accepted` sharding,
        which the next argument is compared with by identity.
        A reshard is a computation of its own, which may communicate across
        the slice's processes and need not follow the one in flight, so it
        waits for that one (see `host_state`, Overlap)."""
        sharding = exe.in_shardings[i]
        if isinstance(value, np.ndarray):
            if exe.takes_host_arrays:
                return value
            host = value
            return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
        if isinstance(value, HeldBlock):
            held = value
            return jax.make_array_from_callback(
                held.shape, sharding, lambda idx: held.data[held.local_index(idx if idx is not None else ())]
            )
        have = value.sharding
        if have is sharding:
            return value
        key = (have, sharding, value.ndim)
        same = self._equivalent.get(key)
        if same is None:
            same = self._equivalent[key] = bool(have.is_equivalent_to(sharding, value.ndim))
        if same:
            exe.accepted[i] = have
            return value
        jax.block_until_ready(in_flight)
        return jax.device_put(value, sharding)
