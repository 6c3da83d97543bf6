"""The PathwaysProgram state machine, driven look by look with no API, process or clock."""

from __future__ import annotations

import dataclasses

import pytest

from pathways_operator.core.phases import InvalidTransition, ProgramPhase, SlicePhase
from pathways_operator.core.program_lifecycle import DriverExit, DriverState, Reported
from pathways_operator.core.program_look import (
    DEFAULT_SUSPEND_GRACE_S, DELIBERATE_STOPS, Attempt, CreateInlineSlice, Next, Order, ProgramAction,
    ProgramDecision, ProgramLook, ProgramReport, ProgramSliceFact, StartDriver, StoreResults, epoch, status_first,
)
from pathways_operator.core.program_machine import ProgramMachine
from pathways_operator.core.reasons import Condition, Reason

NOW = "2026-01-01T00:10:00Z"
CREATED = "2026-01-01T00:00:00Z"
KEY = "ns/train"


def ready(name: str = "main", restarts: int = 0) -> ProgramSliceFact:
    return ProgramSliceFact(name, f"train-{name}", True, SlicePhase.READY, restarts, 4)


def look(**changes: object) -> ProgramLook:
    base = ProgramLook(
        key=KEY, generation=1, now=NOW, wall_now=epoch(NOW) or 0.0, monotonic_now=1000.0,
        status=ProgramReport(), created=CREATED, steps=10, backoff_limit=2,
        entrypoint="examples.programs:train", slice_names={"main": "train-main"}, slices=(ready(),),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def after(decision: ProgramDecision, **changes: object) -> ProgramLook:
    """The next look, starting from the status the last one wrote."""
    return look(status=decision.status, **changes)


def condition(decision: ProgramDecision, type_: str) -> Condition:
    found = next((c for c in decision.status.conditions if c.type == type_), None)
    assert found is not None, f"no {type_} condition in {decision.status.conditions}"
    return found


def running() -> ProgramDecision:
    machine = ProgramMachine(look())
    machine.start()
    return machine.decision()


def exited(code: int | None, reported: Reported, **fields: object) -> DriverExit:
    return DriverExit(code, reported, **fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------ admission: slices first


def test_invalid_spec_fails_the_program_naming_the_field() -> None:
    machine = ProgramMachine(look(invalid=(Reason.INVALID_SPEC, "spec.source.entrypoint is missing")))
    assert machine.start() is Next.DONE
    decision = machine.decision()
    assert decision.status.phase is ProgramPhase.FAILED
    assert condition(decision, "Failed").message == "spec.source.entrypoint is missing"
    assert decision.status.completion_time == NOW
    assert machine.take_actions() == []


def test_inline_slices_are_created_and_the_program_waits_for_them() -> None:
    creating = ProgramSliceFact("main", "train-main", exists=False)
    machine = ProgramMachine(look(slices=(creating,), absent_inline=((0, "train-main"),)))
    machine.start()
    assert machine.take_actions() == [CreateInlineSlice(0, "train-main"), Order.FORGET_SUSPEND]
    decision = machine.decision()
    assert decision.status.phase is ProgramPhase.PENDING
    assert decision.status.message == "waiting for slices to be Ready: main (VirtualSlice train-main: being created)"


def test_missing_ref_waits_with_one_event() -> None:
    missing = ("VirtualSlice 'shared' (spec.slices[0].ref) does not exist in namespace ns",)
    machine = ProgramMachine(look(slices=(), missing=missing))
    machine.start()
    decision = machine.decision()
    assert condition(decision, "Running").reason == "SliceNotFound"
    assert [e.reason for e in decision.events] == ["SliceNotFound"]
    again = ProgramMachine(after(decision, slices=(), missing=missing))
    again.start()
    assert again.decision().events == ()


def test_slice_not_ready_is_named_with_why() -> None:
    pending = ProgramSliceFact("main", "train-main", True, SlicePhase.PENDING, 0, 4, (
        Condition("Admitted", "False", "InsufficientDevices", "needs 8 devices"),
    ))
    machine = ProgramMachine(look(slices=(pending,)))
    machine.start()
    assert machine.decision().status.message == (
        "waiting for slices to be Ready: main (VirtualSlice train-main: Pending, needs 8 devices)"
    )


# ------------------------------------------------------------------ launch and progress


def test_ready_slices_start_the_driver_and_run() -> None:
    machine = ProgramMachine(look())
    machine.start()
    actions = machine.take_actions()
    assert actions[-1] == StartDriver(0, {"main": ("train-main", 4)}, Attempt(1, {"main": 0}))
    decision = machine.decision()
    assert decision.status.phase is ProgramPhase.RUNNING
    assert decision.status.start_time == NOW
    assert decision.events[0].message == "Started driver for examples.programs:train (10 steps)"


def test_a_driver_started_again_says_where_it_resumes() -> None:
    restarted = ProgramMachine(after(running(), done=5))
    restarted.start()
    assert restarted.decision().events[0].message.startswith("Restarted from step 5: driver for")
    resumed = ProgramMachine(after(running(), done=5, checkpoint_dir="/ckpt/train", snapshot_step=4))
    resumed.start()
    assert isinstance(resumed.take_actions()[-1], StartDriver)
    assert resumed.decision().events[0].message == (
        "Resumed at step 4 from the snapshot of step 4: driver for examples.programs:train (10 steps)"
    )


def test_running_driver_reports_progress_without_restarting() -> None:
    machine = ProgramMachine(after(running(), driver=DriverState.RUNNING, done=4))
    machine.start()
    assert not any(isinstance(a, StartDriver) for a in machine.take_actions())
    decision = machine.decision()
    assert decision.status.progress == "4/10" and decision.status.message == "4/10 steps completed"


def test_results_owned_by_another_object_fail_before_the_driver_starts() -> None:
    machine = ProgramMachine(look(results_owner_problem="ConfigMap train-results is not this program's"))
    machine.start()
    assert machine.decision().status.phase is ProgramPhase.FAILED


# ------------------------------------------------------------------ the end: results, failure, retry


def test_finished_driver_stores_results_then_succeeds() -> None:
    machine = ProgramMachine(after(
        running(), driver=DriverState.EXITED, driver_exit=exited(0, Reported.RESULTS), results={"loss": 0.5},
        done=10, attempt=Attempt(1, {"main": 0}),
    ))
    assert machine.start() is Next.STORE_RESULTS
    assert StoreResults("train-results", {"loss": 0.5}) in machine.take_actions()
    machine.results_stored()
    decision = machine.decision()
    assert decision.status.phase is ProgramPhase.SUCCEEDED
    assert decision.status.results_keys == ("loss",)
    assert condition(decision, "Succeeded").message == "all 10 steps completed; results in ConfigMap train-results"


def test_results_the_api_refuses_fail_the_program() -> None:
    machine = ProgramMachine(after(
        running(), driver=DriverState.EXITED, driver_exit=exited(0, Reported.RESULTS), results={"bad key": 1},
    ))
    assert machine.start() is Next.STORE_RESULTS
    machine.results_refused("ConfigMap is invalid")
    decision = machine.decision()
    assert decision.status.phase is ProgramPhase.FAILED
    assert condition(decision, "Failed").reason == "ResultsNotStored"


def test_program_error_fails_at_once() -> None:
    machine = ProgramMachine(after(
        running(), driver=DriverState.EXITED,
        driver_exit=exited(1, Reported.ERROR, error="ValueError: bad batch"), attempt=Attempt(1, {"main": 0}),
    ))
    machine.start()
    decision = machine.decision()
    assert decision.status.phase is ProgramPhase.FAILED
    assert "ValueError: bad batch" in condition(decision, "Failed").message


def test_lost_host_sends_the_program_back_to_wait_and_run_again() -> None:
    machine = ProgramMachine(after(
        running(), driver=DriverState.EXITED, driver_exit=exited(75, Reported.NOTHING, retryable=True),
        done=3, attempt=Attempt(1, {"main": 0}), slices=(ready(restarts=1),),
    ))
    machine.start()
    assert Order.DISCARD_OUTCOME in machine.take_actions()
    decision = machine.decision()
    assert decision.status.phase is ProgramPhase.PENDING
    assert decision.status.restarts == 1
    assert decision.events[0].type == "Warning"

    again = ProgramMachine(after(decision, done=3, attempt=Attempt(1, {"main": 0}), slices=(ready(restarts=1),)))
    again.start()
    start = again.take_actions()[-1]
    assert start == StartDriver(3, {"main": ("train-main", 4)}, Attempt(2, {"main": 1}))


def test_failed_slice_fails_the_program_and_stops_its_driver() -> None:
    failed = ProgramSliceFact("main", "train-main", True, SlicePhase.FAILED, 3, 4, (
        Condition("Ready", "False", "RestartsExhausted", "pod train-main-1 failed"),
    ))
    machine = ProgramMachine(after(running(), driver=DriverState.RUNNING, slices=(failed,)))
    machine.start()
    assert Order.STOP_DRIVER in machine.take_actions()
    assert condition(machine.decision(), "Failed").message == (
        "slice 'main' (VirtualSlice train-main) failed: pod train-main-1 failed"
    )


def test_start_deadline_fails_a_program_still_waiting() -> None:
    pending = ProgramSliceFact("main", "train-main", True, SlicePhase.PENDING, 0, 4)
    machine = ProgramMachine(look(slices=(pending,), start_deadline_s=60))
    machine.start()
    decision = machine.decision()
    assert condition(decision, "Failed").reason == "StartDeadlineExceeded"


# ------------------------------------------------------------------ suspend and resume


def test_suspend_asks_the_driver_to_stop_at_a_step_then_releases_slices() -> None:
    asking = ProgramMachine(after(running(), suspend=True, driver=DriverState.RUNNING, done=2))
    asking.start()
    assert asking.take_actions() == [Order.ASK_SUSPEND]
    assert asking.decision().status.phase is ProgramPhase.RUNNING

    late = ProgramMachine(after(
        running(), suspend=True, driver=DriverState.RUNNING, done=2, suspend_asked_at=1000.0 - DEFAULT_SUSPEND_GRACE_S,
    ))
    late.start()
    assert late.take_actions() == [Order.FORGET_SUSPEND, Order.DISCARD_OUTCOME, Order.RELEASE_SLICES]
    decision = late.decision()
    assert decision.status.phase is ProgramPhase.SUSPENDED
    assert [e.reason for e in decision.events] == ["Suspended"]

    resumed = ProgramMachine(after(decision))
    resumed.start()
    resumed_decision = resumed.decision()
    assert resumed_decision.status.phase is ProgramPhase.RUNNING
    assert condition(resumed_decision, "Suspended").status == "False"


def test_the_suspend_grace_is_the_operators_setting() -> None:
    """A driver asked 5 s ago is still waited for with the default 60 s, stopped with a 3 s grace."""
    asked = dict(suspend=True, driver=DriverState.RUNNING, done=2, suspend_asked_at=1000.0 - 5)
    waiting = ProgramMachine(after(running(), **asked))
    waiting.start()
    assert waiting.take_actions() == [Order.ASK_SUSPEND]
    impatient = ProgramMachine(after(running(), **asked, suspend_grace_s=3.0))
    impatient.start()
    assert impatient.take_actions() == [Order.FORGET_SUSPEND, Order.DISCARD_OUTCOME, Order.RELEASE_SLICES]
    assert impatient.decision().status.phase is ProgramPhase.SUSPENDED


def test_suspended_program_creates_no_slices() -> None:
    creating = ProgramSliceFact("main", "train-main", exists=False)
    machine = ProgramMachine(look(suspend=True, slices=(creating,), absent_inline=((0, "train-main"),)))
    machine.start()
    assert not any(isinstance(a, CreateInlineSlice) for a in machine.take_actions())


# ------------------------------------------------------------------ transitions


def test_illegal_transition_names_the_program_and_both_phases() -> None:
    machine = ProgramMachine(look(status=ProgramReport(phase=ProgramPhase.SUSPENDED)))
    with pytest.raises(InvalidTransition) as raised:
        machine.results_stored()
    assert (raised.value.name, raised.value.old, raised.value.new) == (KEY, "Suspended", "Succeeded")


# ------------------------------------------------------------------ driver pods


def test_driver_pod_going_away_is_waited_for_before_the_next_starts() -> None:
    machine = ProgramMachine(after(running(), driver=DriverState.STOPPING, done=3))
    machine.start()
    assert not any(isinstance(a, StartDriver) for a in machine.take_actions())
    assert machine.decision().status.phase is ProgramPhase.RUNNING


def test_deleted_driver_pod_runs_again_from_its_last_step_counting_a_restart() -> None:
    lost = exited(None, Reported.LOST, error="its pod train-driver was deleted before it reported",
                  retryable=True)
    machine = ProgramMachine(after(running(), driver=DriverState.EXITED, driver_exit=lost, done=4,
                                   attempt=Attempt(1, {"main": 0})))
    machine.start()
    assert Order.DISCARD_OUTCOME in machine.take_actions()
    decision = machine.decision()
    assert decision.status.phase is ProgramPhase.PENDING
    assert decision.status.restarts == 1
    assert "train-driver was deleted" in decision.status.message and "step 4" in decision.status.message


# ------------------------------------------------------------------ the order of a look's writes


def decided(program_look: ProgramLook) -> tuple[list[ProgramAction], ProgramDecision]:
    machine = ProgramMachine(program_look)
    machine.start()
    return machine.take_actions(), machine.decision()


def test_a_look_that_stops_the_driver_on_purpose_writes_its_status_first() -> None:
    """Suspended after the grace, or Pending for a slice gone unready: written after the pod's
    deletion, an operator stopped in between would come back to a run lost under the program."""
    suspended = decided(after(running(), suspend=True, driver=DriverState.RUNNING, done=2,
                              suspend_asked_at=1000.0 - DEFAULT_SUSPEND_GRACE_S))
    unready = ProgramSliceFact("main", "train-main", True, SlicePhase.PENDING, 1, 4)
    waiting = decided(after(running(), driver=DriverState.RUNNING, slices=(unready,)))
    for actions, decision in (suspended, waiting):
        assert any(a in DELIBERATE_STOPS for a in actions), actions
        assert status_first(actions, decision)


def test_looks_that_start_run_store_or_end_write_their_status_after_their_actions() -> None:
    """Starting a driver: the status says it runs only once its pod was created. Results and
    ends keep their order (results answer the machine; a driver's log precedes its end)."""
    starting = decided(look())
    steady = decided(after(running(), driver=DriverState.RUNNING, done=3))
    failed = ProgramSliceFact("main", "train-main", True, SlicePhase.FAILED, 3, 4)
    ended = decided(after(running(), driver=DriverState.RUNNING, slices=(failed,)))
    assert Order.STOP_DRIVER in ended[0] and ended[1].status.phase is ProgramPhase.FAILED
    storing = decided(after(running(), driver=DriverState.EXITED, driver_exit=exited(0, Reported.RESULTS),
                            results={"loss": 0.5}, done=10, attempt=Attempt(1, {"main": 0})))
    assert any(isinstance(a, StoreResults) for a in storing[0])
    for actions, decision in (starting, steady, ended, storing):
        assert not status_first(actions, decision)
