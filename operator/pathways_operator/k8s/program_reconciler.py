"""PathwaysPrograms: slices first, then a driver, then results.

:meth:`ProgramReconciler.reconcile` is level-based like the slice reconciler.
Each look reads the program, checks what the schema cannot
(``program_checks``), reads its slices and its driver, and hands all of it to
the program state machine (``core.program_machine``), which decides the
status, the Events and what to do: create the program's inline slices, start,
ask to suspend or stop its driver, store its results, release its slices
(``program_objects``, ``drivers``). The status is written once
(``status_writer``).

``spec.startDeadlineSeconds`` bounds the wait for slices before the first start,
``spec.activeDeadlineSeconds`` the run from ``status.startTime``
(:func:`~pathways_operator.core.program_lifecycle.check_deadlines`).

A program that ends, or is deleted, stops its driver and deletes the slices it
created from templates; a deleted program's checkpoint directory is deleted too.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pathways_operator.core.checkpoint_paths import newest_snapshot
from pathways_operator.core.phases import ProgramPhase, is_terminal
from pathways_operator.core.program_lifecycle import DriverExit, DriverState, driver_was_running, is_permanent_refusal
from pathways_operator.core.program_look import (
    DEFAULT_SUSPEND_GRACE_S,
    Attempt, CreateInlineSlice, Next, Order, ProgramAction, ProgramDecision, ProgramLook, ProgramReport,
    StartDriver, StoreResults, results_config_map, status_first,
)
from pathways_operator.core.program_machine import IDLE, ProgramMachine
from pathways_operator.k8s import program_checks, program_objects
from pathways_operator.k8s.cluster_api import ClusterApi, KubeError, now_rfc3339
from pathways_operator.k8s.driver_pods import DriverPods
from pathways_operator.k8s.drivers import DriverLaunch, DriverSupervisor
from pathways_operator.k8s.metrics import OperatorMetrics
from pathways_operator.k8s.pathways_program import ProgramObject, ProgramStatus
from pathways_operator.k8s.program_checks import CompiledPrograms, InvalidProgram, ProgramSlices
from pathways_operator.k8s.status_writer import StatusWriter
from pathways_wire.kube_names import PROGRAM_KIND

log = logging.getLogger(__name__)

DEFAULT_ALLOWED_ENTRYPOINTS = ("examples.",)
"""What child-process drivers may run when no --allowed-entrypoints is given (driver pods: any)."""

DRIVER_LOG_KEEP_BYTES = 256 << 10
"""How much of a finished driver's log its ConfigMap keeps (the end; a ConfigMap holds at most 1 MiB)."""


class ProgramReconciler:
    """Creates the slices of every PathwaysProgram in scope, runs its driver, records its results."""

    def __init__(
        self,
        api: ClusterApi,
        drivers: DriverSupervisor | DriverPods,
        *,
        allowed_entrypoints: Sequence[str] = DEFAULT_ALLOWED_ENTRYPOINTS,
        metrics: OperatorMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        checkpoint_root: Path | None = None,
        suspend_grace_s: float = DEFAULT_SUSPEND_GRACE_S,
    ) -> None:
        self._api = api
        self._suspend_grace_s = suspend_grace_s
        self._drivers = drivers
        self._checkpoint_root = checkpoint_root
        self._suspending: dict[str, float] = {}
        """Program key -> when its driver was asked to stop at a step boundary."""
        self._allowed = tuple(allowed_entrypoints)
        self._attempts: dict[str, Attempt] = {}
        self._metrics = metrics or OperatorMetrics()
        self._status = StatusWriter(api, api.patch_program_status, self._metrics.program_phase,
                                    functools.partial(self._metrics.looked, PROGRAM_KIND))
        self._clock = clock
        self._wall_clock = wall_clock
        """Seconds since the epoch: deadlines count from API timestamps."""
        self._progress: dict[str, tuple[int, float]] = {}
        self._compiled = CompiledPrograms(api)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _lock_for(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    # ------------------------------------------------------------ reconcile

    def reconcile(self, namespace: str, name: str) -> float:
        """One look at a program; returns seconds until it wants the next."""
        with self._lock_for(f"{namespace}/{name}"):
            return self._reconcile(namespace, name)

    def _reconcile(self, namespace: str, name: str) -> float:
        raw = self._api.get_program(namespace, name)
        if raw is None:
            return IDLE
        program = ProgramObject.from_manifest(raw)
        if program.deleting:
            return IDLE
        if is_terminal(program.status.phase or ProgramPhase.PENDING):
            self._finish(program)
            return IDLE
        machine = ProgramMachine(self._look(program))
        step = machine.start()
        actions = machine.take_actions()
        decided = machine.decision()
        if status_first(actions, decided):
            self._write_status(program, decided)
            self._carry_out(program, actions)
            return decided.delay
        self._carry_out(program, actions)
        if step is Next.STORE_RESULTS:
            self._store_results(program, machine, next(a for a in actions if isinstance(a, StoreResults)))
        decision = machine.decision()
        terminal = is_terminal(decision.status.phase or ProgramPhase.PENDING)
        if terminal:  # before the phase says it ended: then the log is there
            text = self._drivers.log_text(program.namespace, program.name, program.uid, DRIVER_LOG_KEEP_BYTES)
            program_objects.keep_driver_log(self._api, program, text)
        self._write_status(program, decision)
        if terminal:
            self._finish(program)
        return decision.delay

    def deleted(self, namespace: str, name: str, uid: str) -> None:
        """The program is being deleted: stop its driver, delete its inline slices."""
        key = f"{namespace}/{name}"
        with self._lock_for(key):
            self._drivers.forget(namespace, name, uid)
            self._attempts.pop(key, None)
            self._progress.pop(key, None)
            self._compiled.forget(key)
            self._status.forget(key)
            program_objects.delete_inline_slices(self._api, namespace, name, uid)
            program_objects.delete_checkpoints(self._checkpoint_root, namespace, name, uid)
        with self._locks_guard:
            self._locks.pop(key, None)

    def checkpoint_dir(self, program: ProgramObject) -> Path | None:
        """Where the program's checkpoints go (None without ``spec.checkpoint``); raises InvalidProgram."""
        return program_checks.checkpoint_dir(program, self._checkpoint_root)

    # ------------------------------------------------------------ reading

    def _check(self, program: ProgramObject) -> ProgramSlices:
        """The program's slices, once its spec passed every check the schema cannot make."""
        program_checks.check_names(program)
        self.checkpoint_dir(program)
        if program.spec.config_map is not None:
            self._compiled.check(program, program.spec.config_map)
        else:
            program_checks.check_entrypoint(
                program.spec.entrypoint, self._allowed, importable_here=isinstance(self._drivers, DriverSupervisor)
            )
        slices = program_checks.read_slices(self._api, program)
        self._compiled.check_slices(program, slices.found)
        return slices

    def _look(self, program: ProgramObject) -> ProgramLook:
        spec = program.spec
        base = ProgramLook(
            key=program.key,
            generation=program.generation,
            now=now_rfc3339(),
            wall_now=self._wall_clock(),
            monotonic_now=self._clock(),
            status=program.status,
            created=program.created,
            steps=spec.steps,
        )
        try:
            slices = self._check(program)
        except InvalidProgram as err:
            return dataclasses.replace(base, invalid=(err.reason, str(err)))
        done = min(spec.steps, self._drivers.steps_completed(program.namespace, program.name, program.uid))
        self._observe_steps(program.key, done)
        driver = self._drivers.status(
            program.namespace, program.name, program.uid,
            ran_before=driver_was_running(program.status.phase, program.status.conditions),
        )
        results_problem = None
        if driver.state is not DriverState.RUNNING:
            results_problem = program_objects.config_map_owner_problem(
                self._api, program, results_config_map(program.key)
            )
        where = self.checkpoint_dir(program)
        return dataclasses.replace(
            base,
            suspend=spec.suspend,
            backoff_limit=spec.backoff_limit,
            start_deadline_s=spec.start_deadline_s,
            active_deadline_s=spec.active_deadline_s,
            entrypoint=spec.entrypoint or "",
            config_map=spec.config_map or "",
            slice_names={
                e.name: e.ref if e.ref is not None else program.inline_slice_name(e.name) for e in spec.slices
            },
            slices=slices.facts,
            absent_inline=slices.absent_inline,
            missing=slices.missing,
            done=done,
            driver=driver.state,
            driver_exit=DriverExit(driver.exit_code, driver.reported, driver.error, driver.retryable,
                                   driver.log_tail),
            results=driver.results,
            attempt=self._attempts.get(program.key),
            suspend_asked_at=self._suspending.get(program.key),
            suspend_grace_s=self._suspend_grace_s,
            checkpoint_dir=str(where) if where else "",
            snapshot_step=_newest_snapshot(where),
            results_owner_problem=results_problem,
        )

    def _observe_steps(self, key: str, done: int) -> None:
        """Feed the step-time histogram from progress seen between two looks."""
        now = self._clock()
        seen = self._progress.get(key)
        if seen is not None and done > seen[0]:
            per_step = (now - seen[1]) / (done - seen[0])
            for _ in range(done - seen[0]):
                self._metrics.step_seconds.observe(per_step)
        if seen is None or done != seen[0]:
            self._progress[key] = (done, now)

    # ------------------------------------------------------------ carrying out

    def _carry_out(self, program: ProgramObject, actions: Sequence[ProgramAction]) -> None:
        namespace, name, uid = program.namespace, program.name, program.uid
        for action in actions:
            if isinstance(action, CreateInlineSlice):
                program_objects.create_inline_slice(self._api, program, action.name, action.index)
            elif action is Order.STOP_DRIVER:
                self._drivers.stop(namespace, name, uid)
            elif action is Order.ASK_SUSPEND:
                self._suspending.setdefault(program.key, self._clock())
                self._drivers.request_suspend(namespace, name)
            elif action is Order.FORGET_SUSPEND:
                self._suspending.pop(program.key, None)
            elif action is Order.DISCARD_OUTCOME:
                self._drivers.discard_outcome(namespace, name, uid)
            elif action is Order.RELEASE_SLICES:
                program_objects.delete_inline_slices(self._api, namespace, name, uid)
            elif isinstance(action, StartDriver):
                self._start_driver(program, action)
            # StoreResults is carried out by _store_results, which answers the machine.

    def _start_driver(self, program: ProgramObject, action: StartDriver) -> None:
        spec = program.spec
        self._drivers.start(
            DriverLaunch(
                namespace=program.namespace,
                name=program.name,
                uid=program.uid,
                entrypoint=spec.entrypoint or "",
                args=dict(spec.args),
                steps=spec.steps,
                start_step=action.start_step,
                checkpoint_dir=str(self.checkpoint_dir(program) or ""),
                checkpoint_every=spec.checkpoint.every_steps if spec.checkpoint else 0,
                weight=spec.weight,
                compiled_program=(
                    self._compiled.config_map(program.key) if spec.config_map is not None else None
                ),
                slices={n: {"virtualSlice": vs, "devices": devices} for n, (vs, devices) in action.slices.items()},
                owner_reference=program.owner_reference(),
                pod=spec.driver,
            )
        )
        self._attempts[program.key] = action.attempt

    def _store_results(self, program: ProgramObject, machine: ProgramMachine, store: StoreResults) -> None:
        """Store the results; the machine hears whether the API server took them."""
        try:
            program_objects.store_results(self._api, program, store.config_map, store.results)
        except KubeError as err:
            if not is_permanent_refusal(err.status):
                raise  # looked at again shortly
            machine.results_refused(str(err))
        else:
            machine.results_stored()

    def _finish(self, program: ProgramObject) -> None:
        """A program that ended holds nothing: no driver, no slices of its own, no valid token."""
        self._drivers.retire(program.namespace, program.name, program.uid)
        self._attempts.pop(program.key, None)
        self._compiled.forget(program.key)
        program_objects.delete_inline_slices(self._api, program.namespace, program.name, program.uid)

    def _write_status(self, program: ProgramObject, decision: ProgramDecision) -> None:
        s = decision.status
        new = ProgramStatus(
            **{f.name: getattr(s, f.name) for f in dataclasses.fields(ProgramReport)},
            observed_generation=program.generation,
        )
        self._status.write(program.key, program.reference(), None if new == program.status else new.to_manifest(),
                           str(s.phase), decision.events)


def _newest_snapshot(where: Path | None) -> int | None:
    if where is None:
        return None
    try:
        return newest_snapshot(entry.name for entry in where.iterdir())
    except OSError:
        return None  # no snapshot written yet
