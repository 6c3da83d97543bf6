"""One look at a PathwaysProgram, as a state machine: what was observed in, status, Events and actions out.

The program reconciler (``k8s.program_reconciler``) reads the program, its
slices, its driver and the operator's memory of it into a frozen
:class:`ProgramLook` and hands it to a :class:`ProgramMachine`, which decides
in the order a program lives (``core.phases``):

1. a spec the schema could not refuse (``look.invalid``) fails the program;
2. inline slices that do not exist yet are created (:class:`CreateInlineSlice`);
3. ``spec.suspend`` lets the driver finish its step, then releases the slices
   (Kueue's contract: a suspended workload holds nothing);
4. a passed deadline or a Failed slice fails the program and stops its driver;
5. a driver that exited is judged (:func:`~pathways_operator.core.program_lifecycle.judge_exit`):
   succeed (results stored first: :attr:`Next.STORE_RESULTS`), fail, or wait
   to run again from the last completed step;
6. while a slice is missing or not Ready the program waits (a running driver
   is stopped); once all are Ready the driver is started (:class:`StartDriver`)
   and the program is Running.

Nothing here reads a clock, a file or the API: times come in the look.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pathways_wire.wording import fraction, plural
from pathways_operator.core.phases import ProgramPhase, SlicePhase
from pathways_operator.core.program_lifecycle import Deadlines, DriverState, Verdict, check_deadlines, judge_exit
from pathways_operator.core.program_look import (
    Attempt,
    CreateInlineSlice,
    Next,
    Order,
    ProgramAction,
    ProgramDecision,
    ProgramLook,
    StartDriver,
    StoreResults,
    epoch,
    results_config_map,
)
from pathways_operator.core.reasons import ProgramConditionType, Reason, event_type, find_condition
from pathways_operator.core.status_report import Report

SOON = 1.0
IDLE = 15.0

_P = ProgramPhase
_C = ProgramConditionType


class ProgramMachine:
    """The decisions of one look at one program; each method is a stimulus, none does I/O."""

    def __init__(self, look: ProgramLook) -> None:
        self.look = look
        self.report: Report[ProgramPhase, ProgramAction] = Report(
            look.key, look.generation, look.now, look.status.phase or _P.PENDING, look.status.conditions, SOON
        )
        self.status = look.status
        self._results: Mapping[str, object] = {}

    def take_actions(self) -> list[ProgramAction]:
        return self.report.take_actions()

    def decision(self) -> ProgramDecision:
        r = self.report
        status = dataclasses.replace(self.status, phase=r.phase, conditions=tuple(r.conditions))
        return ProgramDecision(status, tuple(r.events), r.delay)

    def _set(self, **changes: object) -> None:
        self.status = dataclasses.replace(self.status, **changes)  # type: ignore[arg-type]

    # ------------------------------------------------------------ the look

    def start(self) -> Next:
        look, r = self.look, self.report
        if look.invalid is not None:
            self.fail(*look.invalid)
            return Next.DONE
        if not look.suspend:  # a suspended program holds no slices of its own
            r.act(*(CreateInlineSlice(i, n) for i, n in look.absent_inline))
        done = look.done
        self._set(
            slice_names=",".join(f"{k}={v}" for k, v in look.slice_names.items()),
            steps_completed=done,
            progress=f"{done}/{look.steps}",
        )
        if look.suspend:
            return self._suspend(done)
        r.act(Order.FORGET_SUSPEND)
        if r.phase is _P.SUSPENDED:
            r.move(_P.PENDING)
            r.condition(_C.SUSPENDED, "False", Reason.SUSPENDED,
                        "spec.suspend is false; the program runs again from its last step")
            # As a Job's: a resumed program's activeDeadlineSeconds counts from its new start.
            self._set(start_time="")

        waiting = [s.summary() for s in look.slices if s.phase is not SlicePhase.READY]
        deadline = check_deadlines(self._deadlines(), look.wall_now)
        if deadline.exceeded is not None:
            r.act(Order.STOP_DRIVER)
            detail = f"; stopped after {done} of {look.steps} steps"
            if deadline.exceeded is Reason.START_DEADLINE_EXCEEDED:
                detail = ": " + "; ".join(
                    [*look.missing, *(["waiting for slices to be Ready: " + ", ".join(waiting)] if waiting else [])]
                )
            self.fail(deadline.exceeded, deadline.message + detail)
            return Next.DONE

        failed = [s for s in look.slices if s.phase is SlicePhase.FAILED]
        if failed:
            ready = find_condition(failed[0].conditions, "Ready")
            why = ready.message if ready is not None else "no reason recorded"
            r.act(Order.STOP_DRIVER)
            self.fail(Reason.SLICE_FAILED,
                      f"slice {failed[0].name!r} (VirtualSlice {failed[0].virtual_slice}) failed: {why}")
            return Next.DONE

        if look.driver is DriverState.EXITED:
            return self._driver_exited()

        if look.missing or waiting:
            self._wait(done, waiting, deadline.seconds_left)
            return Next.DONE

        if look.driver is DriverState.STOPPING:
            r.delay = SOON  # the last driver's pod is going away; the next starts once it is gone
            return Next.DONE

        if look.driver is DriverState.ABSENT:
            if look.results_owner_problem is not None:
                self.fail(Reason.RESULTS_NOT_STORED, look.results_owner_problem)
                return Next.DONE
            number = 1 if look.attempt is None else look.attempt.number + 1
            r.act(StartDriver(
                done,
                {s.name: (s.virtual_slice, s.devices) for s in look.slices if s.exists},
                Attempt(number, {s.name: s.restarts for s in look.slices if s.exists}),
            ))
            if look.snapshot_step is not None:
                what = f"Resumed at step {look.snapshot_step} from the snapshot of step {look.snapshot_step}:"
            else:
                what = "Started" if done == 0 else f"Restarted from step {done}:"
            source = look.entrypoint or f"ConfigMap {look.config_map}"
            r.event(event_type(Reason.STEPS_RUNNING), Reason.STEPS_RUNNING,
                    f"{what} driver for {source} ({plural(look.steps, 'step')})")
        r.move(_P.RUNNING)
        message = f"{fraction(done, look.steps, 'step')} completed"
        r.condition(_C.RUNNING, "True", Reason.STEPS_RUNNING, message)
        self._set(message=message, start_time=self.status.start_time or look.now)
        r.delay = SOON
        return Next.DONE

    def _wait(self, done: int, waiting: list[str], seconds_left: float | None) -> None:
        """A slice is missing or not Ready: the program waits (Pending), its driver stopped."""
        look, r = self.look, self.report
        if look.driver is DriverState.RUNNING:
            r.act(Order.STOP_DRIVER)
            r.event(event_type(Reason.WAITING_FOR_SLICES), Reason.WAITING_FOR_SLICES,
                    f"Driver stopped at step {done}: a slice is not Ready")
        r.move(_P.PENDING)
        if look.missing:
            message = "; ".join(look.missing) + "; the program starts once it is created"
            if look.start_deadline_s is not None and not self.status.start_time:
                message += f" (or fails when spec.startDeadlineSeconds={look.start_deadline_s} passes)"
            previous = r.find(_C.RUNNING)
            if previous is None or previous.reason != Reason.SLICE_NOT_FOUND:
                r.event(event_type(Reason.SLICE_NOT_FOUND), Reason.SLICE_NOT_FOUND, message)
            r.condition(_C.RUNNING, "False", Reason.SLICE_NOT_FOUND, message)
            r.delay = IDLE  # a new VirtualSlice in the namespace wakes the program
        else:
            message = "waiting for slices to be Ready: " + ", ".join(waiting)
            r.condition(_C.RUNNING, "False", Reason.WAITING_FOR_SLICES, message)
            r.delay = SOON
        self._set(message=message)
        if seconds_left is not None:
            r.delay = min(r.delay, seconds_left + 0.1)

    def _deadlines(self) -> Deadlines:
        """The program's deadlines; a resume restarts the wait for its start, as a creation does."""
        look = self.look
        created = epoch(look.created) or look.wall_now
        resumed = self.report.find(_C.SUSPENDED)
        if resumed is not None and resumed.status == "False":
            created = max(created, epoch(resumed.last_transition_time) or created)
        return Deadlines(
            created=created,
            started=epoch(self.status.start_time),
            start_deadline_s=look.start_deadline_s,
            active_deadline_s=look.active_deadline_s,
        )

    def _suspend(self, done: int) -> Next:
        """spec.suspend: let the driver finish its step and snapshot, then release the slices.

        The driver gets SIGUSR1 and stops at its next ``ctx.step_done`` (after writing a
        checkpoint); one that does not get there within ``look.suspend_grace_s`` is stopped, and
        resumes from its last snapshot.
        """
        look, r = self.look, self.report
        if look.driver is DriverState.RUNNING:
            asked = look.monotonic_now if look.suspend_asked_at is None else look.suspend_asked_at
            if look.monotonic_now - asked < look.suspend_grace_s:
                r.act(Order.ASK_SUSPEND)
                message = (f"suspending: the driver finishes its current step (after {done}) "
                           "and writes its state, then the program's slices are released")
                r.condition(_C.SUSPENDED, "False", Reason.SUSPENDED, message)
                self._set(message=message)
                r.delay = SOON / 2
                return Next.DONE
        elif look.driver is DriverState.EXITED and look.results is not None:
            return self._succeed(look.results)  # it ended before it could stop
        r.act(Order.FORGET_SUSPEND, Order.DISCARD_OUTCOME, Order.RELEASE_SLICES)
        where = look.checkpoint_dir
        message = (f"spec.suspend is true: stopped after {done} of {plural(look.steps, 'step')}; "
                   "it holds no slices of its own and continues from "
                   + (f"its last checkpoint in {where}" if where else f"step {done}")
                   + " when spec.suspend is false")
        if r.phase is not _P.SUSPENDED:
            r.event(event_type(Reason.SUSPENDED), Reason.SUSPENDED, message)
        r.move(_P.SUSPENDED)
        r.condition(_C.SUSPENDED, "True", Reason.SUSPENDED, message)
        r.condition(_C.RUNNING, "False", Reason.SUSPENDED, message)
        self._set(message=message)
        r.delay = IDLE
        return Next.DONE

    # ------------------------------------------------------------ the driver's end

    def _driver_exited(self) -> Next:
        """Act on a finished driver: succeed, fail, or wait to run it again from the last step."""
        look, r = self.look, self.report
        attempt = look.attempt
        disturbed = attempt is not None and any(
            not s.exists or s.restarts != attempt.slice_restarts.get(s.name, s.restarts)
            or s.phase is not SlicePhase.READY
            for s in look.slices
        )
        assert look.driver_exit is not None
        source = "configMapRef" if look.config_map else "entrypoint"
        decision = judge_exit(
            look.driver_exit,
            slices_disturbed=disturbed,
            restarts=self.status.restarts,
            backoff_limit=look.backoff_limit,
            steps_completed=self.status.steps_completed,
            source_field=f"spec.source.{source}",
        )
        if decision.verdict is Verdict.SUCCEED:
            return self._succeed(look.results or {})
        if decision.verdict is Verdict.RESUME:  # asked to suspend, then resumed before we saw it stop
            r.act(Order.DISCARD_OUTCOME)
            r.move(_P.PENDING)
            r.delay = SOON
            return Next.DONE
        assert decision.reason is not None
        if decision.verdict is Verdict.FAIL:
            self.fail(decision.reason, decision.message)
            return Next.DONE
        r.act(Order.DISCARD_OUTCOME)
        r.move(_P.PENDING)
        r.condition(_C.RUNNING, "False", Reason.WAITING_FOR_SLICES, decision.message)
        self._set(message=decision.message, restarts=decision.restarts)
        r.event(event_type(decision.reason), decision.reason, decision.message)
        r.delay = 2 * SOON
        return Next.DONE

    def _succeed(self, results: Mapping[str, object]) -> Next:
        problem = self.look.results_owner_problem
        if problem is not None:
            self.fail(Reason.RESULTS_NOT_STORED, f"the program finished, but its results are not stored: {problem}")
            return Next.DONE
        self._results = results
        self.report.act(StoreResults(results_config_map(self.look.key), results))
        return Next.STORE_RESULTS

    def results_stored(self) -> None:
        """The results are in their ConfigMap: Succeeded."""
        look, r = self.look, self.report
        steps, config_map = look.steps, results_config_map(look.key)
        message = f"{'all ' if steps != 1 else ''}{plural(steps, 'step')} completed; results in ConfigMap {config_map}"
        r.move(_P.SUCCEEDED)
        r.condition(_C.RUNNING, "False", Reason.STEPS_COMPLETED, message)
        r.condition(_C.SUCCEEDED, "True", Reason.STEPS_COMPLETED, message)
        self._set(
            steps_completed=steps,
            progress=f"{steps}/{steps}",
            results_config_map=config_map,
            results_keys=tuple(sorted(self._results)),
            message=message,
            completion_time=look.now,
            start_time=self.status.start_time or look.now,
        )
        r.event(event_type(Reason.STEPS_COMPLETED), Reason.STEPS_COMPLETED, message)
        r.delay = IDLE

    def results_refused(self, error: str) -> None:
        """The API server refused the results for good: Failed, saying what results it takes."""
        self.fail(Reason.RESULTS_NOT_STORED,
                  f"the program finished, but the API server refused its results: {error}; "
                  "return result keys made of letters, digits, '-', '_' and '.', and at most "
                  "1 MiB of results in all")

    def fail(self, reason: Reason, message: str) -> None:
        """Failed, with the whole message once in the Failed condition (and status.message)."""
        r = self.report
        r.move(_P.FAILED)
        r.condition(_C.RUNNING, "False", reason, "the program failed; see the Failed condition")
        r.condition(_C.FAILED, "True", reason, message)
        self._set(message=message, completion_time=self.look.now)
        r.event("Warning", reason, message)
        r.delay = IDLE
