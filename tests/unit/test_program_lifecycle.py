"""A program's life decisions: fail at once, retry a lost host up to backoffLimit, deadlines, results."""

from __future__ import annotations

import pytest

from pathways.context import RESULTS_MAX_BYTES, result_key_problem, results_problem
from pathways.driver import DriverError, results_json
from pathways_operator.core.program_lifecycle import (
    Deadlines,
    DriverExit,
    DriverPodFact,
    DriverState,
    Reported,
    Verdict,
    check_deadlines,
    failure_message,
    is_permanent_refusal,
    driver_pod_state,
    driver_was_running,
    judge_exit,
    results_owner_problem,
)
from pathways_wire.driver_protocol import EXIT_RETRYABLE
from pathways_operator.core.phases import ProgramPhase
from pathways_operator.core.reasons import Condition, Reason, event_type

TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 3\nValueError: empty'


def test_results_with_status_zero_succeed() -> None:
    decision = judge_exit(DriverExit(0, Reported.RESULTS), slices_disturbed=False, restarts=2,
                          backoff_limit=6, steps_completed=4)
    assert decision.verdict is Verdict.SUCCEED and decision.restarts == 2


@pytest.mark.parametrize(
    ("end", "words"),
    [
        (DriverExit(1, Reported.ERROR, "the entrypoint called sys.exit(3) instead of returning its results"),
         "sys.exit(3)"),
        (DriverExit(7, Reported.NOTHING, log_tail="hard_exit: leaving"),
         "the driver exited with status 7 without reporting an outcome"),
        (DriverExit(-9, Reported.NOTHING), "was killed by signal 9"),
        (DriverExit(1, Reported.ERROR, "result 'model' (object) is not an array-like"), "result 'model'"),
        (DriverExit(3, Reported.RESULTS), "exited with status 3 after writing its results"),
    ],
    ids=["sys-exit", "os-exit", "signal", "unserializable", "results-then-exit"],
)
def test_programs_own_failures_fail_at_once_without_a_retry(end: DriverExit, words: str) -> None:
    decision = judge_exit(end, slices_disturbed=False, restarts=0, backoff_limit=6, steps_completed=4)
    assert decision.verdict is Verdict.FAIL
    assert decision.reason is Reason.COMPUTATION_FAILED
    assert words in decision.message and decision.restarts == 0


def test_bad_entrypoint_names_the_source_field_without_the_log() -> None:
    end = DriverExit(2, Reported.ERROR, "module 'x' cannot be imported", log_tail="noise")
    decision = judge_exit(end, slices_disturbed=False, restarts=0, backoff_limit=6, steps_completed=0,
                          source_field="spec.source.entrypoint")
    assert decision.message == "spec.source.entrypoint: module 'x' cannot be imported"


@pytest.mark.parametrize(
    ("end", "disturbed"),
    [
        (DriverExit(EXIT_RETRYABLE, Reported.ERROR, "RuntimeUnavailableError: gone", retryable=True), False),
        (DriverExit(EXIT_RETRYABLE, Reported.NOTHING), False),
        (DriverExit(1, Reported.ERROR, "ExecutionError: boom"), True),
        (DriverExit(-9, Reported.NOTHING), True),
    ],
    ids=["driver-says-retryable", "retryable-exit-status", "slice-recreated", "killed-while-slice-recreated"],
)
def test_lost_host_runs_again_and_counts_a_restart(end: DriverExit, disturbed: bool) -> None:
    decision = judge_exit(end, slices_disturbed=disturbed, restarts=1, backoff_limit=6, steps_completed=4)
    assert decision.verdict is Verdict.RETRY and decision.reason is Reason.HOST_LOST
    assert decision.restarts == 2
    assert "runs again from step 4" in decision.message and "restart 2 of spec.backoffLimit 6" in decision.message


def test_lost_host_beyond_backoff_limit_fails() -> None:
    end = DriverExit(EXIT_RETRYABLE, Reported.ERROR, "RuntimeUnavailableError: gone", retryable=True)
    decision = judge_exit(end, slices_disturbed=False, restarts=2, backoff_limit=2, steps_completed=4)
    assert decision.verdict is Verdict.FAIL and decision.reason is Reason.BACKOFF_LIMIT_EXCEEDED
    assert decision.message == (
        "the driver lost a host 3 times, more than spec.backoffLimit (2) allows; "
        "last: RuntimeUnavailableError: gone"
    )
    zero = judge_exit(end, slices_disturbed=False, restarts=0, backoff_limit=0, steps_completed=0)
    assert zero.verdict is Verdict.FAIL


def test_suspended_driver_resumes() -> None:
    decision = judge_exit(DriverExit(0, Reported.SUSPENDED), slices_disturbed=True, restarts=0,
                          backoff_limit=0, steps_completed=4)
    assert decision.verdict is Verdict.RESUME


def test_failure_message_says_the_error_once_when_the_log_ends_with_it() -> None:
    message = failure_message("ValueError: empty", TRACEBACK)
    assert message.count("ValueError: empty") == 1
    assert message.endswith(TRACEBACK)
    other = failure_message("the driver exited with status 7", "last line")
    assert other == "the driver exited with status 7; the driver's log ends:\nlast line"
    assert failure_message("boom", "") == "boom"
    printed = failure_message("result key 'a/b' is bad", "pathways.driver: result key 'a/b' is bad")
    assert printed.count("result key 'a/b'") == 1


# -- deadlines --------------------------------------------------------------------------------


def test_no_deadlines_means_wait_and_run_forever() -> None:
    assert check_deadlines(Deadlines(created=0, started=None), now=1e9).exceeded is None
    assert check_deadlines(Deadlines(created=0, started=10), now=1e9).exceeded is None


def test_start_deadline_counts_from_creation_until_the_first_start() -> None:
    d = Deadlines(created=100, started=None, start_deadline_s=30)
    early = check_deadlines(d, now=110)
    assert early.exceeded is None and early.seconds_left == 20
    late = check_deadlines(d, now=130)
    assert late.exceeded is Reason.START_DEADLINE_EXCEEDED
    assert late.message == "spec.startDeadlineSeconds (30) passed before the program started"
    started = Deadlines(created=100, started=120, start_deadline_s=30)
    assert check_deadlines(started, now=1000).exceeded is None


def test_active_deadline_counts_from_the_start() -> None:
    d = Deadlines(created=0, started=100, active_deadline_s=60)
    assert check_deadlines(d, now=150).seconds_left == 10
    passed = check_deadlines(d, now=160)
    assert passed.exceeded is Reason.DEADLINE_EXCEEDED
    assert passed.message.startswith("spec.activeDeadlineSeconds (60) passed: the program ran 60 s")


# -- results ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["a/b", "../x", "", ".", "..", "..x", "a b", "k" * 254])
def test_keys_the_api_server_refuses_are_named(key: str) -> None:
    assert result_key_problem(key) is not None
    problem = results_problem({key: "1"})
    assert problem is not None and f"result key {key!r}" in problem


@pytest.mark.parametrize("key", ["loss", "w.0", "a-b_c", ".hidden", "k" * 253])
def test_configmap_keys_pass(key: str) -> None:
    assert results_problem({key: "[1.0]"}) is None


def test_results_over_one_configmap_name_the_largest_key_and_the_limit() -> None:
    problem = results_problem({"small": "1", "big": "0" * RESULTS_MAX_BYTES})
    assert problem is not None
    assert "over the limit of 1048576 bytes" in problem and "result 'big'" in problem
    assert results_problem({"x": "0" * (RESULTS_MAX_BYTES - 1)}) is None


def test_driver_refuses_results_it_cannot_store() -> None:
    with pytest.raises(DriverError, match="result key 'a/b'"):
        results_json({"a/b": 1.0})
    with pytest.raises(DriverError, match=r"result 'model' \(object\) is not an array-like"):
        results_json({"model": object()})
    with pytest.raises(DriverError, match="result key 3 is a int"):
        results_json({3: 1.0})
    assert results_json({"y": [1, 2]}) == {"y": [1, 2]}


def test_results_configmap_must_be_the_programs_own() -> None:
    assert results_owner_problem("p-results", ["uid-1"], "uid-1") is None
    problem = results_owner_problem("p-results", [], "uid-1")
    assert problem is not None and "ConfigMap 'p-results' already exists and is not owned" in problem
    assert results_owner_problem("p-results", ["uid-2"], "uid-1") is not None


@pytest.mark.parametrize(("status", "permanent"), [
    (422, True), (413, True), (400, True), (403, True), (404, True),
    (409, False), (429, False), (408, False), (500, False), (503, False), (0, False),
])
def test_only_answers_retrying_cannot_change_are_permanent(status: int, permanent: bool) -> None:
    assert is_permanent_refusal(status) is permanent


def test_problems_are_warning_events() -> None:
    for reason in (Reason.SLICE_NOT_FOUND, Reason.DEADLINE_EXCEEDED, Reason.COMPUTATION_FAILED,
                   Reason.EXCEEDS_ISLAND, Reason.RESULTS_NOT_STORED, Reason.HOST_LOST):
        assert event_type(reason) == "Warning"
    for reason in (Reason.STEPS_COMPLETED, Reason.STEPS_RUNNING, Reason.ADMITTED, Reason.GANG_READY):
        assert event_type(reason) == "Normal"


# ------------------------------------------------------------------ driver pods

POD = "train-driver"


@pytest.mark.parametrize(
    ("pod", "reported", "started_here", "state", "code"),
    [
        (DriverPodFact(exists=True, phase="Pending"), False, True, DriverState.RUNNING, None),
        (DriverPodFact(exists=True, phase="Running"), False, False, DriverState.RUNNING, None),
        (DriverPodFact(exists=True, phase="Running", deleting=True), False, True, DriverState.STOPPING, None),
        (DriverPodFact(exists=True, phase="Succeeded", exit_code=0), True, True, DriverState.EXITED, 0),
        (DriverPodFact(exists=True, phase="Failed", exit_code=75), True, True, DriverState.EXITED, 75),
        (DriverPodFact(exists=True, phase="Failed", exit_code=143, deleting=True), True, True,
         DriverState.EXITED, 143),
        (DriverPodFact(exists=True, phase="Failed", exit_code=143, deleting=True), False, False,
         DriverState.STOPPING, None),
        (DriverPodFact(exists=False), True, False, DriverState.EXITED, None),
        (DriverPodFact(exists=False), False, False, DriverState.ABSENT, None),
    ],
)
def test_driver_pod_state_follows_the_pod_and_its_exit_code(
    pod: DriverPodFact, reported: bool, started_here: bool, state: DriverState, code: int | None
) -> None:
    where = driver_pod_state(pod, reported=reported, started_here=started_here, pod_name=POD)
    assert (where.state, where.exit_code, where.lost) == (state, code, "")


def test_a_driver_pod_deleted_or_evicted_before_it_reported_is_lost_and_runs_again() -> None:
    deleted = driver_pod_state(DriverPodFact(exists=False), reported=False, started_here=True, pod_name=POD)
    evicted = driver_pod_state(DriverPodFact(exists=True, phase="Failed", reason="Evicted"), reported=False,
                               started_here=True, pod_name=POD)
    killed_by_deletion = driver_pod_state(
        DriverPodFact(exists=True, phase="Failed", exit_code=143, deleting=True), reported=False,
        started_here=True, pod_name=POD)
    assert deleted.state is evicted.state is killed_by_deletion.state is DriverState.EXITED
    assert deleted.lost == killed_by_deletion.lost == "its pod train-driver was deleted before it reported"
    assert killed_by_deletion.exit_code is None
    assert evicted.lost == "its pod train-driver failed (Evicted)"
    decision = judge_exit(DriverExit(None, Reported.LOST, deleted.lost, retryable=True), slices_disturbed=False,
                          restarts=0, backoff_limit=6, steps_completed=5)
    assert decision.verdict is Verdict.RETRY and decision.restarts == 1
    assert "train-driver was deleted" in decision.message and "from step 5" in decision.message


def test_lost_driver_pods_count_against_the_backoff_limit() -> None:
    decision = judge_exit(DriverExit(None, Reported.LOST, "its pod train-driver was deleted before it reported"),
                          slices_disturbed=False, restarts=2, backoff_limit=2, steps_completed=5)
    assert decision.verdict is Verdict.FAIL and decision.reason is Reason.BACKOFF_LIMIT_EXCEEDED


@pytest.mark.parametrize(
    ("phase", "running", "was"),
    [
        (ProgramPhase.RUNNING, "True", True),
        (ProgramPhase.RUNNING, "False", False),  # waiting out a stop: the pod goes on purpose
        (ProgramPhase.PENDING, "False", False),
        (ProgramPhase.SUSPENDED, "False", False),
        (None, None, False),
    ],
)
def test_the_status_says_the_driver_runs_only_while_running_with_its_condition_true(
    phase: ProgramPhase | None, running: str | None, was: bool,
) -> None:
    conditions = [] if running is None else [Condition("Running", running, "StepsRunning")]  # type: ignore[arg-type]
    assert driver_was_running(phase, conditions) is was


@pytest.mark.parametrize(("reported", "started_here", "state", "lost"), [
    (False, True, DriverState.EXITED,
     "its pod train-driver was lost with its Node n-1, which stopped reporting, before it reported"),
    (True, True, DriverState.EXITED, ""),
    (False, False, DriverState.ABSENT, ""),  # deleted on purpose: the next driver may start at once
])
def test_a_driver_pod_deleted_on_an_unreachable_node_is_taken_as_gone_and_removed_at_once(
    reported: bool, started_here: bool, state: DriverState, lost: str
) -> None:
    evicted = DriverPodFact(exists=True, phase="Running", deleting=True, node="n-1", node_unreachable=True)
    where = driver_pod_state(evicted, reported=reported, started_here=started_here, pod_name=POD)
    assert (where.state, where.lost, where.remove) == (state, lost, True)


@pytest.mark.parametrize("pod", [
    DriverPodFact(exists=True, phase="Running", deleting=True, node="n-1"),  # its kubelet will confirm
    DriverPodFact(exists=True, phase="Running", node="n-1", node_unreachable=True),  # not evicted (yet)
    DriverPodFact(exists=True, phase="Failed", exit_code=143, deleting=True, node="n-1", node_unreachable=True),
])
def test_a_driver_pod_is_removed_at_once_only_when_deleted_unconfirmable_and_still_running(
    pod: DriverPodFact,
) -> None:
    assert not driver_pod_state(pod, reported=False, started_here=False, pod_name=POD).remove
