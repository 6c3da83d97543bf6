"""What one look at a PathwaysProgram reads, and what the program machine hands back.

The observation (:class:`ProgramLook`) is frozen: the program's status as
read (:class:`ProgramReport`), its spec's facts, its slices
(:class:`ProgramSliceFact`), its driver (state, how it exited, what it
returned), the operator's memory of it (the run in progress, a suspend asked
for) and the time, as values. The machine answers with a
:class:`ProgramDecision` and typed actions, carried out by the reconciler in
order: :class:`CreateInlineSlice`, :class:`StartDriver`,
:class:`StoreResults` and the argument-less :class:`Order`.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping, Sequence

from pathways_operator.core.phases import ProgramPhase, SlicePhase, is_terminal
from pathways_operator.core.program_lifecycle import DriverExit, DriverState, driver_was_running
from pathways_operator.core.reasons import Condition, Reason, find_condition
from pathways_operator.core.status_report import Event


@dataclasses.dataclass(frozen=True)
class ProgramReport:
    """``PathwaysProgram.status`` as the machine writes it (observedGeneration is the writer's)."""

    phase: ProgramPhase | None = None
    conditions: tuple[Condition, ...] = ()
    slice_names: str = ""
    steps_completed: int = 0
    progress: str = ""
    start_time: str = ""
    completion_time: str = ""
    results_config_map: str = ""
    results_keys: tuple[str, ...] = ()
    message: str = ""
    restarts: int = 0
    """Times the driver ran again after losing a host (counted against spec.backoffLimit)."""


@dataclasses.dataclass(frozen=True)
class ProgramSliceFact:
    """One slice of the program: its name in the program, its VirtualSlice, what that reports."""

    name: str
    virtual_slice: str
    exists: bool = True
    """False while the VirtualSlice is being created (or, owned by the program, going away)."""
    phase: SlicePhase | None = None
    """Its ``status.phase`` (None before the operator wrote one)."""
    restarts: int = 0
    devices: int = 0
    conditions: tuple[Condition, ...] = ()

    def summary(self) -> str:
        """"main (VirtualSlice x: Pending, <why it is not admitted>)" for the program's message."""
        if not self.exists:
            return f"{self.name} (VirtualSlice {self.virtual_slice}: being created)"
        why = ""
        for type_ in ("Admitted", "Ready"):
            cond = find_condition(self.conditions, type_)
            if cond is not None and cond.status != "True" and cond.message:
                why = f", {cond.message}"
                break
        return f"{self.name} (VirtualSlice {self.virtual_slice}: {self.phase or SlicePhase.PENDING}{why})"


@dataclasses.dataclass(frozen=True)
class Attempt:
    """The driver run in progress: its number and the slices' restart counts it started with."""

    number: int
    slice_restarts: Mapping[str, int]
    """Each slice's ``status.restarts`` when the run started: a change means a host was lost meanwhile."""


@dataclasses.dataclass(frozen=True)
class CreateInlineSlice:
    """Create VirtualSlice ``name`` from ``spec.slices[index].template``, owned by the program."""

    index: int
    name: str


class Order(enum.Enum):
    """The actions that carry nothing but their name."""

    STOP_DRIVER = "stop the program's driver, if one runs"
    ASK_SUSPEND = "ask the running driver to stop at its next step boundary (noting when it was first asked)"
    FORGET_SUSPEND = "no suspend is in progress any more"
    DISCARD_OUTCOME = "forget how the last run ended (stopping it), so the next look starts a new one"
    RELEASE_SLICES = "delete the VirtualSlices the program created from templates"


@dataclasses.dataclass(frozen=True)
class StartDriver:
    """Start the driver from ``start_step`` on ``slices`` (name -> (VirtualSlice, devices))."""

    start_step: int
    slices: Mapping[str, tuple[str, int]]
    attempt: Attempt


@dataclasses.dataclass(frozen=True)
class StoreResults:
    """Write the results into ConfigMap ``config_map``; answer :meth:`ProgramMachine.results_stored`
    or :meth:`ProgramMachine.results_refused`."""

    config_map: str
    results: Mapping[str, object]


ProgramAction = CreateInlineSlice | StartDriver | StoreResults | Order


class Next(enum.Enum):
    DONE = "done"
    STORE_RESULTS = "store results"
    """Carry out :class:`StoreResults`, then tell the machine how it went."""


DEFAULT_SUSPEND_GRACE_S = 60.0
"""The operator's default ``--suspend-grace-seconds``."""


@dataclasses.dataclass(frozen=True)
class ProgramLook:
    """What one look at a program read: the object, its slices, its driver, the times."""

    key: str
    generation: int
    now: str
    """When the look was taken, RFC 3339 (conditions' and status times)."""
    wall_now: float
    """The same instant, seconds since the epoch (deadlines count from API timestamps)."""
    monotonic_now: float
    """For the suspend grace period."""
    status: ProgramReport
    created: str
    """``metadata.creationTimestamp``."""
    steps: int
    suspend: bool = False
    backoff_limit: int = 0
    start_deadline_s: int | None = None
    active_deadline_s: int | None = None
    entrypoint: str = ""
    config_map: str = ""
    invalid: tuple[Reason, str] | None = None
    """The spec is wrong in a way the schema cannot catch: (reason, message naming the field)."""
    slice_names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Every ``spec.slices`` name -> its VirtualSlice's name."""
    slices: tuple[ProgramSliceFact, ...] = ()
    """The slices found (or being created), in ``spec.slices`` order."""
    absent_inline: tuple[tuple[int, str], ...] = ()
    """``(index, VirtualSlice)`` of template slices that do not exist."""
    missing: tuple[str, ...] = ()
    """A line for each ``ref`` that names no VirtualSlice (yet)."""
    done: int = 0
    """Steps the driver completed (its progress file)."""
    driver: DriverState = DriverState.ABSENT
    driver_exit: DriverExit | None = None
    results: Mapping[str, object] | None = None
    """What the driver returned, when it returned results."""
    attempt: Attempt | None = None
    suspend_asked_at: float | None = None
    suspend_grace_s: float = DEFAULT_SUSPEND_GRACE_S
    """How long a driver asked to suspend may take to reach a step boundary before it is
    stopped (``--suspend-grace-seconds``)."""
    checkpoint_dir: str = ""
    snapshot_step: int | None = None
    """The newest committed snapshot in ``checkpoint_dir``: where a driver started now begins."""
    results_owner_problem: str | None = None
    """Why ``<program>-results`` may not be written (one exists the program does not own)."""


@dataclasses.dataclass(frozen=True)
class ProgramDecision:
    status: ProgramReport
    events: tuple[Event, ...]
    delay: float


DELIBERATE_STOPS = (Order.STOP_DRIVER, Order.DISCARD_OUTCOME)
"""The actions that delete the driver's pod on purpose."""


def status_first(actions: Sequence[ProgramAction], decision: ProgramDecision) -> bool:
    """Whether a look writes its status before it carries out its actions, not after.

    So it does when it deletes the driver's pod on purpose and its status then no longer
    says the driver runs (`driver_was_running`), and it neither stores results (those
    answer the machine, and the status says how that went) nor ends the program (its
    driver's log is kept before the phase says it ended; a look after a stop there ends
    it again, as the deadline or slice that ended it is checked before the driver's
    state).

    Written after, an operator that stopped between the deletion and the write would
    come back to a status saying the driver runs and to no pod: a run lost under the
    program, run again and counted against ``spec.backoffLimit``, where it was stopped
    on purpose. Written first, a deletion the operator did not get to is decided again:
    every look that finds a driver running where the status says none should run stops it.
    """
    if any(isinstance(a, StoreResults) for a in actions) or is_terminal(decision.status.phase or ProgramPhase.PENDING):
        return False
    if not any(a in DELIBERATE_STOPS for a in actions):
        return False
    return not driver_was_running(decision.status.phase, decision.status.conditions)


def epoch(timestamp: str) -> float | None:
    """An API timestamp (RFC 3339, UTC) as seconds since the epoch; None when empty or unreadable."""
    try:
        when = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return when.replace(tzinfo=datetime.UTC).timestamp()


def results_config_map(key: str) -> str:
    """The ConfigMap a program's results go into: ``<program>-results``."""
    return f"{key.partition('/')[2]}-results"
