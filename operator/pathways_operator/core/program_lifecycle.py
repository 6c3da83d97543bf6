"""When a PathwaysProgram waits, runs again, fails or is stopped: the decisions of its life.

The program reconciler (``pathways_operator.k8s.program_reconciler``) observes; this module
decides, from plain values and a ``now`` it is given:

* :func:`judge_exit` -- a driver that exited either succeeded, or lost a host
  (its retryable exit status, or a slice recreated under it) and runs again up to
  ``spec.backoffLimit`` times, or failed on its own -- it raised, called
  ``sys.exit``/``os._exit``, or returned results that cannot be stored -- and then
  the program fails at once, with the driver's log tail, because running it
  again would fail the same way (Job's ``podFailurePolicy`` ``FailJob`` for exit
  codes, as users of JobSet configure it by hand).
* :func:`check_deadlines` -- ``spec.startDeadlineSeconds`` bounds the wait for
  the program's slices (to exist and be Ready) from its creation;
  ``spec.activeDeadlineSeconds`` bounds the run from ``status.startTime``, as
  in a Job. Both are off by default.
* :func:`results_owner_problem` and :func:`is_permanent_refusal` -- results are
  written only into a ConfigMap the program owns, and an API answer that
  retrying cannot change fails the program instead of holding its slices forever.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable

from pathways_wire.driver_protocol import EXIT_BAD_PROGRAM, EXIT_RETRYABLE
from pathways_wire.wording import plural
from pathways_operator.core.phases import ProgramPhase
from pathways_operator.core.reasons import Condition, ProgramConditionType, Reason, is_condition_true

DEFAULT_BACKOFF_LIMIT = 6
"""``spec.backoffLimit`` when unset: runs after a lost host before the program Fails (as a Job's)."""



class DriverState(enum.Enum):
    """Where a program's driver is, as its supervisor sees it."""

    ABSENT = "absent"
    """No driver runs and none left an outcome: start one."""
    RUNNING = "running"
    STOPPING = "stopping"
    """Its pod is going away: wait, and start the next one once it is gone."""
    EXITED = "exited"
    """It finished; the supervisor's status says how."""


class Reported(enum.Enum):
    """What the driver wrote into its results file before it exited."""

    RESULTS = "results"
    """It returned: the results are in the file."""
    ERROR = "error"
    """The program raised; the error is in the file."""
    SUSPENDED = "suspended"
    NOTHING = "nothing"
    """It exited without a word: ``os._exit``, a signal, a crash of the interpreter."""
    LOST = "lost"
    """Its pod was deleted or evicted before it reported: as a lost host, it runs again."""


@dataclasses.dataclass(frozen=True)
class DriverExit:
    """How a driver ended, as the supervisor saw it."""

    exit_code: int | None
    """None when the operator restarted and only the results file is left."""
    reported: Reported
    error: str = ""
    retryable: bool = False
    """The driver itself said a host was lost (``retryable`` in its results file)."""
    log_tail: str = ""


class Verdict(enum.Enum):
    """What becomes of a program whose driver exited."""

    SUCCEED = "succeed"
    """Every step ran: store the results, Succeeded."""
    RESUME = "resume"
    """It stopped for a suspend that was lifted meanwhile: start it again, nothing failed."""
    RETRY = "retry"
    """It lost a host: run it again from its last step once the slices are Ready."""
    FAIL = "fail"
    """The program cannot succeed: Failed, with the driver's error and log tail."""


@dataclasses.dataclass(frozen=True)
class ExitDecision:
    """:func:`judge_exit`'s answer: the verdict, and the condition reason and message that go with it."""

    verdict: Verdict
    reason: Reason | None = None
    message: str = ""
    restarts: int = 0
    """``status.restarts`` after this decision."""


def judge_exit(
    end: DriverExit,
    *,
    slices_disturbed: bool,
    restarts: int,
    backoff_limit: int,
    steps_completed: int,
    source_field: str = "spec.source.entrypoint",
) -> ExitDecision:
    """Succeed, resume, retry after a lost host, or fail; see the module docstring.

    ``slices_disturbed``: a slice of the program was recreated, or is not Ready,
    since the driver started -- whatever the driver said, it lost a host.
    """
    if end.reported is Reported.RESULTS and end.exit_code in (0, None):
        return ExitDecision(Verdict.SUCCEED, restarts=restarts)
    if end.reported is Reported.SUSPENDED:
        return ExitDecision(Verdict.RESUME, restarts=restarts)
    lost_host = slices_disturbed or end.exit_code == EXIT_RETRYABLE or end.reported is Reported.LOST or (
        end.reported is Reported.ERROR and end.retryable
    )
    if lost_host:
        why = end.error or _how_it_exited(end.exit_code)
        if restarts >= backoff_limit:
            return ExitDecision(
                Verdict.FAIL,
                Reason.BACKOFF_LIMIT_EXCEEDED,
                f"the driver lost a host {plural(restarts + 1, 'time')}, more than spec.backoffLimit "
                f"({backoff_limit}) allows; last: {why}",
                restarts,
            )
        return ExitDecision(
            Verdict.RETRY,
            Reason.HOST_LOST,
            f"the driver lost a host after {plural(steps_completed, 'step')} ({why}); it runs again from "
            f"step {steps_completed} once every slice is Ready (restart {restarts + 1} of "
            f"spec.backoffLimit {backoff_limit})",
            restarts + 1,
        )
    if end.reported is Reported.ERROR and end.exit_code == EXIT_BAD_PROGRAM:
        return ExitDecision(Verdict.FAIL, Reason.COMPUTATION_FAILED, f"{source_field}: {end.error}", restarts)
    if end.reported is Reported.ERROR:
        return ExitDecision(Verdict.FAIL, Reason.COMPUTATION_FAILED,
                            failure_message(end.error, end.log_tail), restarts)
    if end.reported is Reported.RESULTS:
        what = f"the driver {_how_it_exited(end.exit_code)} after writing its results; they are not kept"
    else:
        what = (f"the driver {_how_it_exited(end.exit_code)} without reporting an outcome (the "
                "program called os._exit, or its process died); it is not run again")
    return ExitDecision(Verdict.FAIL, Reason.COMPUTATION_FAILED, failure_message(what, end.log_tail), restarts)


def _how_it_exited(code: int | None) -> str:
    if code is None:
        return "exited"
    if code < 0:
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


def failure_message(error: str, log_tail: str) -> str:
    """``error`` and the driver's log tail, saying each thing once.

    A traceback in the log already ends with the error line, and the driver prints its
    own errors as ``pathways.driver: <error>``; then the log alone says it.
    """
    tail = log_tail.strip()
    if not tail:
        return error
    last_lines = tail.splitlines()[-3:]
    if error and any(line.strip().endswith(error.strip()) for line in last_lines):
        return f"the program failed; the driver's log ends:\n{tail}"
    return f"{error}; the driver's log ends:\n{tail}"


# ---------------------------------------------------------------- driver pods


@dataclasses.dataclass(frozen=True)
class DriverPodFact:
    """What the API says of a program's driver pod ``<program>-driver``."""

    exists: bool
    phase: str = ""
    """``status.phase``: Pending, Running, Succeeded, Failed (or "" before the first status)."""
    deleting: bool = False
    """``metadata.deletionTimestamp`` is set."""
    exit_code: int | None = None
    """The driver container's ``state.terminated.exitCode``, once it ended."""
    reason: str = ""
    """``status.reason`` (``Evicted``), or the terminated container's reason."""
    node: str = ""
    """``spec.nodeName``: the Node it is bound to ("" while unscheduled)."""
    node_unreachable: bool = False
    """Its Node is deleted, or its kubelet stopped reporting (tainted
    ``node.kubernetes.io/unreachable:NoExecute``): nothing will confirm the pod's end.
    Read only for a pod being deleted whose container has not ended."""


@dataclasses.dataclass(frozen=True)
class DriverPodState:
    state: DriverState
    exit_code: int | None = None
    lost: str = ""
    """Why the run is lost without an outcome (pod deleted or evicted); "" otherwise."""
    remove: bool = False
    """Delete the pod now, with no grace period: it is being deleted on a Node whose
    kubelet will never confirm it, and the program's next driver pod needs its name."""


def driver_was_running(phase: ProgramPhase | None, conditions: Iterable[Condition]) -> bool:
    """Whether the program's status says its driver runs: phase Running with condition
    Running=True. That is written in the look that created the driver's pod, and changed in
    the look that deletes the pod on purpose (Pending, Suspended, an end), so an operator
    that restarted, and finds no pod and no outcome while the status says so, knows the pod
    was deleted under the program while it was away (`driver_pod_state`'s ``started_here``)."""
    return phase is ProgramPhase.RUNNING and is_condition_true(conditions, ProgramConditionType.RUNNING)


def driver_pod_state(pod: DriverPodFact, *, reported: bool, started_here: bool, pod_name: str) -> DriverPodState:
    """Where the driver is, from its pod and whether it reported an outcome.

    ``started_here``: this operator started (or saw running) the pod, or the program's status
    says it runs (`driver_was_running`), so a pod that is gone
    without an outcome was deleted under the program, and the run is lost: it runs again
    from its last snapshot, counted against ``spec.backoffLimit``. So is a pod being deleted
    whose driver ended without an outcome: the status its container ends with is the
    deletion's signal (143), not the program's. A pod this operator is deleting itself
    (``started_here`` is False then: a stop, a suspend, a run discarded) is waited out.
    A restarted operator that finds no pod and no outcome, where the status does not say
    the driver runs, starts one.

    A pod being deleted on an unreachable Node (the taint manager evicted it from a dead
    machine) is never confirmed gone by a kubelet, so it is not waited out: it is taken
    as gone, as the pods of a gang on such a Node are, and removed at once (``remove``).
    """
    if pod.deleting and pod.node_unreachable and pod.exit_code is None:
        gone = driver_pod_state(DriverPodFact(exists=False), reported=reported, started_here=started_here,
                                pod_name=pod_name)
        lost = gone.lost and (
            f"its pod {pod_name} was lost with its Node {pod.node or '(unknown)'}, which stopped "
            "reporting, before it reported"
        )
        return DriverPodState(gone.state, gone.exit_code, lost, remove=True)
    if not pod.exists:
        if reported:
            return DriverPodState(DriverState.EXITED)
        if started_here:
            return DriverPodState(DriverState.EXITED, lost=f"its pod {pod_name} was deleted before it reported")
        return DriverPodState(DriverState.ABSENT)
    if pod.deleting and not reported:
        if not started_here:
            return DriverPodState(DriverState.STOPPING)
        if pod.exit_code is not None or pod.phase in ("Succeeded", "Failed"):
            return DriverPodState(DriverState.EXITED, lost=f"its pod {pod_name} was deleted before it reported")
    if pod.exit_code is not None and pod.phase in ("Succeeded", "Failed"):
        return DriverPodState(DriverState.EXITED, pod.exit_code)
    if pod.phase == "Failed":
        why = pod.reason or "it failed before its container ran"
        return DriverPodState(DriverState.EXITED, lost=f"its pod {pod_name} failed ({why})")
    if pod.deleting:
        return DriverPodState(DriverState.STOPPING)
    return DriverPodState(DriverState.RUNNING)


# ---------------------------------------------------------------- deadlines


@dataclasses.dataclass(frozen=True)
class Deadlines:
    """``spec.startDeadlineSeconds`` and ``spec.activeDeadlineSeconds`` with the times they count from."""

    created: float
    """``metadata.creationTimestamp``, seconds since the epoch."""
    started: float | None
    """``status.startTime`` (the driver's first start since creation or resume), or None."""
    start_deadline_s: int | None = None
    active_deadline_s: int | None = None


@dataclasses.dataclass(frozen=True)
class DeadlineCheck:
    exceeded: Reason | None
    """START_DEADLINE_EXCEEDED, DEADLINE_EXCEEDED, or None."""
    seconds_left: float | None
    """Until the next deadline (to look again then); None when none applies."""
    message: str = ""


def check_deadlines(d: Deadlines, now: float) -> DeadlineCheck:
    """Which deadline has passed at ``now``, else how long until the next one does."""
    if d.started is None:
        if d.start_deadline_s is None:
            return DeadlineCheck(None, None)
        left = d.created + d.start_deadline_s - now
        if left <= 0:
            return DeadlineCheck(
                Reason.START_DEADLINE_EXCEEDED, None,
                f"spec.startDeadlineSeconds ({d.start_deadline_s}) passed before the program started",
            )
        return DeadlineCheck(None, left)
    if d.active_deadline_s is None:
        return DeadlineCheck(None, None)
    left = d.started + d.active_deadline_s - now
    if left <= 0:
        return DeadlineCheck(
            Reason.DEADLINE_EXCEEDED, None,
            f"spec.activeDeadlineSeconds ({d.active_deadline_s}) passed: the program ran "
            f"{now - d.started:.0f} s; it was stopped and its slices released",
        )
    return DeadlineCheck(None, left)


# ---------------------------------------------------------------- results ConfigMap


def results_owner_problem(config_map: str, owner_uids: Iterable[str], program_uid: str) -> str | None:
    """Why the program may not write into an existing ConfigMap, or None when it owns it."""
    if program_uid and program_uid in set(owner_uids):
        return None
    return (
        f"ConfigMap {config_map!r} already exists and is not owned by this PathwaysProgram, so "
        "its results are not written into it; delete or rename that ConfigMap, or give the "
        "program another name"
    )


def is_permanent_refusal(http_status: int) -> bool:
    """An API answer that asking again cannot change (4xx, except timeouts, conflicts, throttling)."""
    return 400 <= http_status < 500 and http_status not in (408, 409, 429)
