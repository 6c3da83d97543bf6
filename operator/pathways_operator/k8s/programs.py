"""PathwaysPrograms: slices first, then a driver, then results.

:meth:`ProgramReconciler.reconcile` is level-based like the slice reconciler.
Each look at a program:

1. checks what the schema cannot: the entrypoint is allowed
   (``--allowed-entrypoints`` prefixes) and importable. A ``ref`` to a
   VirtualSlice that does not exist yet makes the program wait (Pending, reason
   SliceNotFound), as a Pod waits for its ConfigMap, so manifests can be applied
   in any order. A ``spec.source.configMapRef`` program instead has its
   ConfigMap read and checked whole (:class:`pathways.compiled.CompiledProgram`:
   format, IR fingerprint, artifacts, inputs' shapes), and its IR slices must be
   exactly ``spec.slices``' names, with the devices it was compiled for. A bad spec
   makes the program Failed with a message naming the field
   (``spec.source.entrypoint``, ``spec.source.configMapRef``, ``spec.slices[0].ref``).
2. makes sure every ``template`` slice exists as VirtualSlice
   ``<program>-<name>``, owned by the program (garbage-collected with it).
3. waits (Pending) until every slice is Ready; a Failed slice fails the program.
4. runs the driver (``drivers``) from ``stepsCompleted``, and while it runs
   copies its progress into ``status.stepsCompleted``.
5. when the driver exits: results go into ConfigMap ``<program>-results`` (one
   the program owns; an existing one it does not own, or results the API server
   refuses, fail the program) and the program Succeeds; a lost host (the driver
   says so, or a slice was recreated meanwhile) sends the program back to Pending
   to be run again from its last completed step once the slices are Ready, up to
   ``spec.backoffLimit`` times; any other failure -- the program raised, exited on
   its own, returned results that cannot be stored -- fails it at once with the
   driver's error and log tail (:func:`~pathways_operator.core.program_lifecycle.judge_exit`).

``spec.startDeadlineSeconds`` bounds the wait for slices before the first start,
``spec.activeDeadlineSeconds`` the run from ``status.startTime``
(:func:`~pathways_operator.core.program_lifecycle.check_deadlines`).

A program that ends, or is deleted, stops its driver and deletes the slices it
created from templates; a deleted program's checkpoint directory is deleted too.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from pathways.compiled import CompiledProgram
from pathways.errors import InvalidProgramError
from pathways.kube import DRIVER_LOG_KEY, driver_log_config_map
from pathways_wire.wording import fraction, plural

from pathways_operator.core.checkpoint_paths import CheckpointPathError, checkpoint_path
from pathways_operator.core.object_names import program_name_problem
from pathways_operator.core.ownership import Ownership, owner_refs, ownership
from pathways_operator.core.phases import ProgramPhase, SlicePhase, check_transition, is_terminal
from pathways_operator.core.program_lifecycle import (
    Deadlines,
    DriverExit,
    Verdict,
    check_deadlines,
    is_permanent_refusal,
    judge_exit,
    results_owner_problem,
)
from pathways_operator.core.reasons import (
    Condition,
    ConditionStatus,
    ProgramConditionType,
    Reason,
    event_type,
    find_condition,
    set_condition,
)
from pathways_operator.k8s.cluster_api import AlreadyExists, ClusterApi, Json, KubeError, now_rfc3339
from pathways_operator.k8s.drivers import DriverLaunch, DriverState, DriverStatus, DriverSupervisor
from pathways_operator.k8s.metrics import OperatorMetrics
from pathways_operator.k8s.pathways_program import ProgramObject, ProgramStatus
from pathways_operator.k8s.resources import (
    ADMISSION_GROUP_LABEL,
    ADMISSION_GROUP_SIZE_ANNOTATION,
    API_VERSION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PROGRAM_LABEL,
    PROGRAM_KIND,
    SLICE_KIND,
)
from pathways_operator.k8s.virtual_slice import VirtualSliceObject

log = logging.getLogger(__name__)

DEFAULT_ALLOWED_ENTRYPOINTS = ("examples.",)

_SOON = 1.0
_IDLE = 15.0
SUSPEND_GRACE_S = 60.0
"""How long a driver asked to suspend may take to reach a step boundary before it is stopped."""
DRIVER_LOG_KEEP_BYTES = 256 << 10
"""How much of a finished driver's log its ConfigMap keeps (the end; a ConfigMap holds at most 1 MiB)."""

_P = ProgramPhase
_C = ProgramConditionType


class InvalidProgram(Exception):
    """The spec is wrong in a way the schema cannot catch; the message names the field."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass
class _Outcome:
    phase: ProgramPhase
    status: ProgramStatus
    conditions: list[Condition]
    events: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    delay: float = _SOON


@dataclasses.dataclass
class _Attempt:
    """The driver run in progress: the slices' restart counts it started with."""

    number: int
    slice_restarts: dict[str, int]


class ProgramReconciler:
    """Creates the slices of every PathwaysProgram in scope, runs its driver, records its results."""

    def __init__(
        self,
        api: ClusterApi,
        drivers: DriverSupervisor,
        *,
        allowed_entrypoints: Sequence[str] = DEFAULT_ALLOWED_ENTRYPOINTS,
        metrics: OperatorMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        checkpoint_root: Path | None = None,
    ) -> None:
        self._api = api
        self._drivers = drivers
        self._checkpoint_root = checkpoint_root
        self._suspending: dict[str, float] = {}
        """Program key -> when its driver was asked to stop at a step boundary."""
        self._allowed = tuple(allowed_entrypoints)
        self._attempts: dict[str, _Attempt] = {}
        self._metrics = metrics or OperatorMetrics()
        self._clock = clock
        self._wall_clock = wall_clock
        """Seconds since the epoch: deadlines count from API timestamps."""
        self._progress: dict[str, tuple[int, float]] = {}
        self._compiled: dict[str, tuple[str, Json, CompiledProgram]] = {}
        """Program key -> (resourceVersion, ConfigMap, parsed) of its checked compiled program."""
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
            return _IDLE
        program = ProgramObject.from_manifest(raw)
        if program.deleting:
            return _IDLE
        outcome = _Outcome(
            phase=program.status.phase or _P.PENDING,
            status=program.status,
            conditions=list(program.status.conditions),
        )
        if is_terminal(outcome.phase):
            self._finish(program)
            return _IDLE
        try:
            self._check_names(program)
            self.checkpoint_dir(program)
            self._check_source(program)
            slices, missing = self._slices(program)
            self._check_compiled_slices(program, slices)
        except InvalidProgram as err:
            self._fail(program, outcome, err.reason, str(err))
        else:
            self._run(program, outcome, slices, missing)
        if is_terminal(outcome.phase):
            self._keep_driver_log(program)  # before the phase says it ended: then the log is there
        self._write_status(program, outcome)
        if is_terminal(outcome.phase):
            self._finish(program)
        return outcome.delay

    def deleted(self, namespace: str, name: str, uid: str) -> None:
        """The program is being deleted: stop its driver, delete its inline slices."""
        key = f"{namespace}/{name}"
        with self._lock_for(key):
            self._drivers.forget(namespace, name, uid)
            self._attempts.pop(key, None)
            self._progress.pop(key, None)
            self._compiled.pop(key, None)
            self._metrics.program_phase(key, None)
            self._delete_inline_slices(namespace, name, uid)
            self._delete_checkpoints(namespace, name, uid)
        with self._locks_guard:
            self._locks.pop(key, None)

    # ------------------------------------------------------------ validation and slices

    @staticmethod
    def _check_names(program: ProgramObject) -> None:
        """Names too long for the labels and VirtualSlices derived from them (stored before the CRD refused them)."""
        templates = [(i, e.name) for i, e in enumerate(program.spec.slices) if e.template is not None]
        problem = program_name_problem(program.name, templates)
        if problem is not None:
            raise InvalidProgram(Reason.INVALID_SPEC, problem)

    def _check_source(self, program: ProgramObject) -> None:
        spec = program.spec
        if spec.config_map is not None:
            self._check_compiled(program, spec.config_map)
            return
        entrypoint = spec.entrypoint
        if not entrypoint:
            raise InvalidProgram(
                Reason.INVALID_SPEC,
                "spec.source.entrypoint is missing; give package.module:function",
            )
        allowed = ", ".join(repr(p) for p in self._allowed)
        if not any(entrypoint.startswith(prefix) for prefix in self._allowed):
            raise InvalidProgram(
                Reason.INVALID_SPEC,
                f"spec.source.entrypoint {entrypoint!r} is not allowed: this operator runs only "
                f"entrypoints starting with {allowed} (operator flag --allowed-entrypoints)",
            )
        module, _, function = entrypoint.partition(":")
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found or not function:
            raise InvalidProgram(
                Reason.INVALID_SPEC,
                f"spec.source.entrypoint {entrypoint!r}: module {module!r} is not importable where "
                "the operator runs its drivers; install the package in the operator's image",
            )

    def _check_compiled(self, program: ProgramObject, config_map: str) -> None:
        """Reads and checks the program's ConfigMap (parsed once per resourceVersion)."""
        raw = self._api.get_configmap(program.namespace, config_map)
        if raw is None:
            self._compiled.pop(program.key, None)
            raise InvalidProgram(
                Reason.INVALID_SPEC,
                f"spec.source.configMapRef.name: ConfigMap {config_map!r} does not exist in namespace "
                f"{program.namespace}; create it with `pathways compile` (or `pathways submit`)",
            )
        version = str((raw.get("metadata") or {}).get("resourceVersion") or "")
        cached = self._compiled.get(program.key)
        if cached is None or cached[0] != version or not version:
            try:
                compiled = CompiledProgram.from_config_map(raw)
            except (InvalidProgramError, ValueError, TypeError) as err:
                self._compiled.pop(program.key, None)
                raise InvalidProgram(
                    Reason.INVALID_SPEC, f"spec.source.configMapRef: {err}"
                ) from None
            self._compiled[program.key] = (version, raw, compiled)
        if program.spec.args:
            raise InvalidProgram(
                Reason.INVALID_SPEC,
                "spec.args: a compiled program runs on the inputs stored in its ConfigMap and "
                "takes no args; remove spec.args, or compile it again with other example_args()",
            )
        ids = {d.id for d in self._compiled[program.key][2].program.slices}
        names = [e.name for e in program.spec.slices]
        for i, entry in enumerate(program.spec.slices):
            if entry.name not in ids:
                raise InvalidProgram(
                    Reason.INVALID_SPEC,
                    f"spec.slices[{i}].name: the compiled program has no slice {entry.name!r} "
                    f"(its slices: {', '.join(sorted(ids))}); use the names `pathways compile` wrote",
                )
        missing = sorted(ids - set(names))
        if missing:
            raise InvalidProgram(
                Reason.INVALID_SPEC,
                f"spec.slices: the compiled program runs on slice {missing[0]!r}, which spec.slices "
                f"does not name; add an entry with name: {missing[0]}",
            )

    def _check_compiled_slices(
        self, program: ProgramObject, slices: dict[str, VirtualSliceObject | None]
    ) -> None:
        """A compiled program's slices must have the devices it was compiled for."""
        if program.spec.config_map is None:
            return
        compiled = self._compiled[program.key][2]
        bound = {n: (s.name, s.spec.devices) for n, s in slices.items() if s is not None}
        try:
            compiled.bound_to({d.id: bound.get(d.id, ("", d.devices)) for d in compiled.program.slices})
        except InvalidProgramError as err:
            raise InvalidProgram(Reason.INVALID_SPEC, str(err)) from None

    def _slices(
        self, program: ProgramObject
    ) -> tuple[dict[str, VirtualSliceObject | None], list[str]]:
        """Each slice name of the program -> its VirtualSlice (None: just created from the template),
        and a line for each ``ref`` that names no VirtualSlice (yet)."""
        found: dict[str, VirtualSliceObject | None] = {}
        missing: list[str] = []
        for i, entry in enumerate(program.spec.slices):
            if entry.ref is not None:
                raw = self._api.get_slice(program.namespace, entry.ref)
                if raw is None:
                    missing.append(
                        f"VirtualSlice {entry.ref!r} (spec.slices[{i}].ref) does not exist in "
                        f"namespace {program.namespace}"
                    )
                    continue
                found[entry.name] = VirtualSliceObject.from_manifest(raw)
                continue
            assert entry.template is not None  # the CRD requires exactly one of ref and template
            name = program.inline_slice_name(entry.name)
            raw = self._api.get_slice(program.namespace, name)
            if raw is None:
                if not program.spec.suspend:  # a suspended program holds no slices of its own
                    self._create_inline_slice(program, name, i)
                found[entry.name] = None
                continue
            vslice = VirtualSliceObject.from_manifest(raw)
            if vslice.labels.get(PROGRAM_LABEL) == program.name and vslice.deleting:
                found[entry.name] = None  # ours, going away (suspended or ended): made again on resume
                continue
            if vslice.labels.get(PROGRAM_LABEL) != program.name or vslice.deleting:
                raise InvalidProgram(
                    Reason.INVALID_SPEC,
                    f"spec.slices[{i}].template: VirtualSlice {name!r} already exists and does not "
                    "belong to this program; rename the slice or delete that VirtualSlice",
                )
            found[entry.name] = vslice
        return found, missing

    def _create_inline_slice(self, program: ProgramObject, name: str, index: int) -> None:
        template = program.spec.slices[index].template
        assert template is not None
        spec = template.to_manifest()
        if program.spec.priority_class and "priorityClassName" not in spec:
            spec["priorityClassName"] = program.spec.priority_class
        inline = sum(1 for entry in program.spec.slices if entry.template is not None)
        body = {
            "apiVersion": API_VERSION,
            "kind": SLICE_KIND,
            "metadata": {
                "name": name,
                "namespace": program.namespace,
                "labels": {
                    PROGRAM_LABEL: program.name,
                    MANAGED_BY_LABEL: MANAGED_BY,
                    ADMISSION_GROUP_LABEL: program.uid,  # admitted whole or not at all
                },
                "annotations": {ADMISSION_GROUP_SIZE_ANNOTATION: str(inline)},
                "ownerReferences": [program.owner_reference()],
            },
            "spec": spec,
        }
        try:
            self._api.create_slice(program.namespace, body)
        except AlreadyExists:
            return  # created by an earlier look whose status write did not land
        log.info("%s: created VirtualSlice %s from spec.slices[%d].template", program.key, name, index)

    def _delete_inline_slices(self, namespace: str, name: str, uid: str) -> None:
        for raw in self._api.list_slices(namespace):
            vslice = VirtualSliceObject.from_manifest(raw)
            owned = ownership(
                owner_refs(raw.get("metadata") or {}), kind=PROGRAM_KIND, name=name, uid=uid
            ) is Ownership.OWNED
            if vslice.labels.get(PROGRAM_LABEL) == name and owned and not vslice.deleting:
                self._api.delete_slice(namespace, vslice.name, vslice.uid)

    def _delete_checkpoints(self, namespace: str, name: str, uid: str) -> None:
        """Delete the checkpoint directory of a deleted program (under any claim of its namespace)."""
        if self._checkpoint_root is None or not uid:
            return
        base = (self._checkpoint_root / namespace).resolve()
        for found in base.glob(f"*/{name}-{uid[:8]}"):
            if found.is_dir() and found.resolve().parent.parent == base:
                shutil.rmtree(found, ignore_errors=True)
                log.info("%s/%s: deleted its checkpoints %s", namespace, name, found)

    # ------------------------------------------------------------ running

    def _run(
        self,
        program: ProgramObject,
        outcome: _Outcome,
        slices: dict[str, VirtualSliceObject | None],
        missing: Sequence[str] = (),
    ) -> None:
        spec = program.spec
        names = {
            e.name: e.ref if e.ref is not None else program.inline_slice_name(e.name)
            for e in spec.slices
        }
        done = min(spec.steps, self._drivers.steps_completed(program.namespace, program.name, program.uid))
        self._observe_steps(program.key, done)
        outcome.status = dataclasses.replace(
            outcome.status,
            slice_names=",".join(f"{k}={v}" for k, v in names.items()),
            steps_completed=done,
            progress=f"{done}/{spec.steps}",
        )
        if spec.suspend:
            self._suspend(program, outcome, done)
            return
        self._suspending.pop(program.key, None)
        if outcome.phase is _P.SUSPENDED:
            self._move(program, outcome, _P.PENDING)
            self._condition(program, outcome, _C.SUSPENDED, "False", Reason.SUSPENDED,
                            "spec.suspend is false; the program runs again from its last step")
            # As a Job's: a resumed program's activeDeadlineSeconds counts from its new start.
            outcome.status = dataclasses.replace(outcome.status, start_time="")

        waiting = [
            _slice_summary(n, names[n], s)
            for n, s in slices.items()
            if s is None or s.status.phase is not SlicePhase.READY
        ]
        deadline = check_deadlines(self._deadlines(program, outcome), self._wall_clock())
        if deadline.exceeded is not None:
            self._drivers.stop(program.namespace, program.name, program.uid)
            detail = f"; stopped after {done} of {spec.steps} steps"
            if deadline.exceeded is Reason.START_DEADLINE_EXCEEDED:
                detail = ": " + "; ".join(
                    [*missing, *(["waiting for slices to be Ready: " + ", ".join(waiting)] if waiting else [])]
                )
            self._fail(program, outcome, deadline.exceeded, deadline.message + detail)
            return

        failed = [(n, s) for n, s in slices.items() if s is not None and s.status.phase is SlicePhase.FAILED]
        if failed:
            slice_name, vslice = failed[0]
            ready = find_condition(vslice.status.conditions, "Ready")
            why = ready.message if ready is not None else "no reason recorded"
            self._drivers.stop(program.namespace, program.name, program.uid)
            self._fail(program, outcome, Reason.SLICE_FAILED,
                       f"slice {slice_name!r} (VirtualSlice {vslice.name}) failed: {why}")
            return

        driver = self._drivers.status(program.namespace, program.name, program.uid)
        if driver.state is DriverState.EXITED:
            self._driver_exited(program, outcome, slices, driver)
            return

        if missing or waiting:
            if driver.state is DriverState.RUNNING:
                self._drivers.stop(program.namespace, program.name, program.uid)
                outcome.events.append((
                    event_type(Reason.WAITING_FOR_SLICES), str(Reason.WAITING_FOR_SLICES),
                    f"Driver stopped at step {done}: a slice is not Ready",
                ))
            self._move(program, outcome, _P.PENDING)
            if missing:
                message = "; ".join(missing) + "; the program starts once it is created"
                if spec.start_deadline_s is not None and not outcome.status.start_time:
                    message += f" (or fails when spec.startDeadlineSeconds={spec.start_deadline_s} passes)"
                previous = find_condition(outcome.conditions, _C.RUNNING)
                if previous is None or previous.reason != Reason.SLICE_NOT_FOUND:
                    outcome.events.append((event_type(Reason.SLICE_NOT_FOUND), str(Reason.SLICE_NOT_FOUND),
                                           message))
                self._condition(program, outcome, _C.RUNNING, "False", Reason.SLICE_NOT_FOUND, message)
                outcome.delay = _IDLE  # a new VirtualSlice in the namespace wakes the program
            else:
                message = "waiting for slices to be Ready: " + ", ".join(waiting)
                self._condition(program, outcome, _C.RUNNING, "False", Reason.WAITING_FOR_SLICES, message)
                outcome.delay = _SOON
            outcome.status = dataclasses.replace(outcome.status, message=message)
            if deadline.seconds_left is not None:
                outcome.delay = min(outcome.delay, deadline.seconds_left + 0.1)
            return

        if driver.state is DriverState.ABSENT:
            problem = self._results_owner_problem(program)
            if problem is not None:
                self._fail(program, outcome, Reason.RESULTS_NOT_STORED, problem)
                return
            attempt = self._attempts.get(program.key)
            number = 1 if attempt is None else attempt.number + 1
            self._drivers.start(
                DriverLaunch(
                    namespace=program.namespace,
                    name=program.name,
                    uid=program.uid,
                    entrypoint=spec.entrypoint or "",
                    args=dict(spec.args),
                    steps=spec.steps,
                    start_step=done,
                    checkpoint_dir=str(self.checkpoint_dir(program) or ""),
                    checkpoint_every=spec.checkpoint.every_steps if spec.checkpoint else 0,
                    weight=spec.weight,
                    compiled_program=(
                        self._compiled[program.key][1] if spec.config_map is not None else None
                    ),
                    slices={
                        n: {"virtualSlice": names[n], "devices": s.spec.devices}
                        for n, s in slices.items()
                        if s is not None
                    },
                )
            )
            self._attempts[program.key] = _Attempt(
                number, {n: s.status.restarts for n, s in slices.items() if s is not None}
            )
            what = "Started" if done == 0 else f"Restarted from step {done}:"
            source = spec.entrypoint or f"ConfigMap {spec.config_map}"
            outcome.events.append((event_type(Reason.STEPS_RUNNING), str(Reason.STEPS_RUNNING),
                                   f"{what} driver for {source} ({plural(spec.steps, 'step')})"))
        self._move(program, outcome, _P.RUNNING)
        message = f"{fraction(done, spec.steps, 'step')} completed"
        self._condition(program, outcome, _C.RUNNING, "True", Reason.STEPS_RUNNING, message)
        outcome.status = dataclasses.replace(
            outcome.status, message=message, start_time=outcome.status.start_time or now_rfc3339()
        )
        outcome.delay = _SOON

    def _deadlines(self, program: ProgramObject, outcome: _Outcome) -> Deadlines:
        """The program's deadlines; a resume restarts the wait for its start, as a creation does."""
        created = _epoch(program.created) or self._wall_clock()
        resumed = find_condition(outcome.conditions, _C.SUSPENDED)
        if resumed is not None and resumed.status == "False":
            created = max(created, _epoch(resumed.last_transition_time) or created)
        return Deadlines(
            created=created,
            started=_epoch(outcome.status.start_time),
            start_deadline_s=program.spec.start_deadline_s,
            active_deadline_s=program.spec.active_deadline_s,
        )

    def _results_owner_problem(self, program: ProgramObject) -> str | None:
        """Why the results ConfigMap may not be written (one exists that the program does not own)."""
        return self._config_map_owner_problem(program, f"{program.name}-results")

    def _config_map_owner_problem(self, program: ProgramObject, name: str) -> str | None:
        """Why ConfigMap ``name`` may not be written: it exists and the program does not own it."""
        raw = self._api.get_configmap(program.namespace, name)
        if raw is None:
            return None
        owners = [str(o.get("uid") or "") for o in (raw.get("metadata") or {}).get("ownerReferences") or []]
        return results_owner_problem(name, owners, program.uid)

    def checkpoint_dir(self, program: ProgramObject) -> Path | None:
        """``<checkpoint-root>/<namespace>/<spec.checkpoint.volume>/<program>-<uid8>``, or None.

        Raises InvalidProgram, naming spec.checkpoint.volume, for a volume that would leave
        the namespace's directory (:func:`checkpoint_paths.checkpoint_path`).
        """
        checkpoint = program.spec.checkpoint
        if checkpoint is None or self._checkpoint_root is None:
            return None
        try:
            where = checkpoint_path(PurePosixPath(self._checkpoint_root), program.namespace,
                                    checkpoint.volume, program.name, program.uid)
        except CheckpointPathError as err:
            raise InvalidProgram(Reason.INVALID_SPEC, str(err)) from None
        return Path(where)

    def _suspend(self, program: ProgramObject, outcome: _Outcome, done: int) -> None:
        """spec.suspend: let the driver finish its step and snapshot, then release the slices.

        Kueue's contract: a suspended workload holds nothing. The driver gets SIGUSR1 and
        stops at its next ``ctx.step_done`` (after writing a checkpoint); one that does not
        get there within SUSPEND_GRACE_S is stopped, and resumes from its last snapshot.
        """
        key = program.key
        driver = self._drivers.status(program.namespace, program.name, program.uid)
        if driver.state is DriverState.RUNNING:
            asked = self._suspending.setdefault(key, self._clock())
            if self._clock() - asked < SUSPEND_GRACE_S:
                self._drivers.request_suspend(program.namespace, program.name)
                message = (f"suspending: the driver finishes its current step (after {done}) "
                           "and writes its state, then the program's slices are released")
                self._condition(program, outcome, _C.SUSPENDED, "False", Reason.SUSPENDED, message)
                outcome.status = dataclasses.replace(outcome.status, message=message)
                outcome.delay = _SOON / 2
                return
        elif driver.state is DriverState.EXITED and driver.results is not None:
            self._succeed(program, outcome, driver.results)  # it ended before it could stop
            return
        self._suspending.pop(key, None)
        self._drivers.discard_outcome(program.namespace, program.name, program.uid)
        self._delete_inline_slices(program.namespace, program.name, program.uid)
        where = self.checkpoint_dir(program)
        message = (f"spec.suspend is true: stopped after {done} of {plural(program.spec.steps, 'step')}; "
                   "it holds no slices of its own and continues from "
                   + (f"its last checkpoint in {where}" if where else f"step {done}")
                   + " when spec.suspend is false")
        if outcome.phase is not _P.SUSPENDED:
            outcome.events.append((event_type(Reason.SUSPENDED), str(Reason.SUSPENDED), message))
        self._move(program, outcome, _P.SUSPENDED)
        self._condition(program, outcome, _C.SUSPENDED, "True", Reason.SUSPENDED, message)
        self._condition(program, outcome, _C.RUNNING, "False", Reason.SUSPENDED, message)
        outcome.status = dataclasses.replace(outcome.status, message=message)
        outcome.delay = _IDLE

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

    def _driver_exited(
        self,
        program: ProgramObject,
        outcome: _Outcome,
        slices: dict[str, VirtualSliceObject | None],
        driver: DriverStatus,
    ) -> None:
        """Act on a finished driver: succeed, fail, or wait to run it again from the last step."""
        attempt = self._attempts.get(program.key)
        disturbed = attempt is not None and any(
            s is None or s.status.restarts != attempt.slice_restarts.get(n, s.status.restarts)
            or s.status.phase is not SlicePhase.READY
            for n, s in slices.items()
        )
        done = outcome.status.steps_completed
        source = "configMapRef" if program.spec.config_map is not None else "entrypoint"
        decision = judge_exit(
            DriverExit(driver.exit_code, driver.reported, driver.error, driver.retryable, driver.log_tail),
            slices_disturbed=disturbed,
            restarts=outcome.status.restarts,
            backoff_limit=program.spec.backoff_limit,
            steps_completed=done,
            source_field=f"spec.source.{source}",
        )
        if decision.verdict is Verdict.SUCCEED:
            self._succeed(program, outcome, driver.results or {})
            return
        if decision.verdict is Verdict.RESUME:  # asked to suspend, then resumed before we saw it stop
            self._drivers.discard_outcome(program.namespace, program.name, program.uid)
            self._move(program, outcome, _P.PENDING)
            outcome.delay = _SOON
            return
        assert decision.reason is not None
        if decision.verdict is Verdict.FAIL:
            self._fail(program, outcome, decision.reason, decision.message)
            return
        log.warning("%s: %s", program.key, decision.message)
        self._drivers.discard_outcome(program.namespace, program.name, program.uid)
        self._move(program, outcome, _P.PENDING)
        self._condition(program, outcome, _C.RUNNING, "False", Reason.WAITING_FOR_SLICES, decision.message)
        outcome.status = dataclasses.replace(outcome.status, message=decision.message,
                                             restarts=decision.restarts)
        outcome.events.append((event_type(decision.reason), str(decision.reason), decision.message))
        outcome.delay = 2 * _SOON

    def _succeed(self, program: ProgramObject, outcome: _Outcome, results: dict[str, object]) -> None:
        config_map = f"{program.name}-results"
        problem = self._results_owner_problem(program)
        if problem is not None:
            self._fail(program, outcome, Reason.RESULTS_NOT_STORED,
                       f"the program finished, but its results are not stored: {problem}")
            return
        try:
            self._api.apply_configmap(
                program.namespace,
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": config_map,
                        "namespace": program.namespace,
                        "labels": {PROGRAM_LABEL: program.name, MANAGED_BY_LABEL: MANAGED_BY},
                        "ownerReferences": [program.owner_reference()],
                    },
                    "data": {key: json.dumps(value) for key, value in results.items()},
                },
            )
        except KubeError as err:
            if not is_permanent_refusal(err.status):
                raise  # looked at again shortly
            self._fail(program, outcome, Reason.RESULTS_NOT_STORED,
                       f"the program finished, but the API server refused its results: {err}; "
                       "return result keys made of letters, digits, '-', '_' and '.', and at most "
                       "1 MiB of results in all")
            return
        steps = program.spec.steps
        message = f"{'all ' if steps != 1 else ''}{plural(steps, 'step')} completed; results in ConfigMap {config_map}"
        self._move(program, outcome, _P.SUCCEEDED)
        self._condition(program, outcome, _C.RUNNING, "False", Reason.STEPS_COMPLETED, message)
        self._condition(program, outcome, _C.SUCCEEDED, "True", Reason.STEPS_COMPLETED, message)
        outcome.status = dataclasses.replace(
            outcome.status,
            steps_completed=steps,
            progress=f"{steps}/{steps}",
            results_config_map=config_map,
            results_keys=tuple(sorted(results)),
            message=message,
            completion_time=now_rfc3339(),
            start_time=outcome.status.start_time or now_rfc3339(),
        )
        outcome.events.append((event_type(Reason.STEPS_COMPLETED), str(Reason.STEPS_COMPLETED), message))
        outcome.delay = _IDLE

    def _fail(self, program: ProgramObject, outcome: _Outcome, reason: Reason, message: str) -> None:
        """Failed, with the whole message once in the Failed condition (and status.message)."""
        self._move(program, outcome, _P.FAILED)
        self._condition(program, outcome, _C.RUNNING, "False", reason,
                        "the program failed; see the Failed condition")
        self._condition(program, outcome, _C.FAILED, "True", reason, message)
        outcome.status = dataclasses.replace(outcome.status, message=message, completion_time=now_rfc3339())
        outcome.events.append(("Warning", str(reason), message))
        outcome.delay = _IDLE

    def _keep_driver_log(self, program: ProgramObject) -> None:
        """Copy the end of the driver's log into ConfigMap ``<program>-driver-log``, owned by the
        program: ``pathways logs program`` reads it after the program's slices are gone."""
        text = self._drivers.log_text(program.namespace, program.name, program.uid, DRIVER_LOG_KEEP_BYTES)
        if not text:
            return  # no driver ever ran (the spec was refused)
        name = driver_log_config_map(program.name)
        problem = self._config_map_owner_problem(program, name)
        if problem is not None:
            log.warning("%s: the driver's log is not kept: %s", program.key, problem)
            return
        try:
            self._api.apply_configmap(program.namespace, {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "namespace": program.namespace,
                    "labels": {PROGRAM_LABEL: program.name, MANAGED_BY_LABEL: MANAGED_BY},
                    "ownerReferences": [program.owner_reference()],
                },
                "data": {DRIVER_LOG_KEY: text},
            })  # fmt: skip
        except KubeError as err:
            log.warning("%s: keeping the driver's log in ConfigMap %s: %s", program.key, name, err)

    def _finish(self, program: ProgramObject) -> None:
        """A program that ended holds nothing: no driver, no slices of its own."""
        self._drivers.stop(program.namespace, program.name, program.uid)
        self._attempts.pop(program.key, None)
        self._compiled.pop(program.key, None)
        self._delete_inline_slices(program.namespace, program.name, program.uid)

    # ------------------------------------------------------------ status

    @staticmethod
    def _move(program: ProgramObject, outcome: _Outcome, phase: ProgramPhase) -> None:
        outcome.phase = check_transition(program.key, outcome.phase, phase)

    @staticmethod
    def _condition(
        program: ProgramObject,
        outcome: _Outcome,
        type_: ProgramConditionType,
        status: ConditionStatus,
        reason: Reason,
        message: str,
    ) -> None:
        outcome.conditions = set_condition(
            outcome.conditions,
            Condition(str(type_), status, str(reason), message, program.generation),
            now_rfc3339(),
        )

    def _write_status(self, program: ProgramObject, outcome: _Outcome) -> None:
        new = dataclasses.replace(
            outcome.status,
            phase=outcome.phase,
            conditions=tuple(outcome.conditions),
            observed_generation=program.generation,
        )
        if new != program.status:
            self._api.patch_program_status(program.namespace, program.name, new.to_manifest())
        self._metrics.program_phase(program.key, str(outcome.phase))
        for type_, reason, message in outcome.events:
            try:
                self._api.post_event(program.reference(), type_, reason, message)
            except KubeError as err:
                log.warning("%s: %s", program.key, err)


def _epoch(timestamp: str) -> float | None:
    """An API timestamp (RFC 3339, UTC) as seconds since the epoch; None when empty or unreadable."""
    try:
        when = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return when.replace(tzinfo=datetime.UTC).timestamp()


def _slice_summary(name: str, virtual_slice: str, found: VirtualSliceObject | None) -> str:
    """"main (VirtualSlice x: Pending, <why it is not admitted>)" for the program's message."""
    if found is None:
        return f"{name} (VirtualSlice {virtual_slice}: being created)"
    phase = found.status.phase or SlicePhase.PENDING
    why = ""
    for type_ in ("Admitted", "Ready"):
        cond = find_condition(found.status.conditions, type_)
        if cond is not None and cond.status != "True" and cond.message:
            why = f", {cond.message}"
            break
    return f"{name} (VirtualSlice {virtual_slice}: {phase}{why})"
