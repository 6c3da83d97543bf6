"""Which thread finishes a batch, and that jobs are still carried out in the order given.

The finisher's thread is real; the values are stand-ins whose readiness the test controls.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from pathways_wire.grant_runs import seqs_of
from pathways_worker.worker.finisher import Finisher
from pathways_worker.worker.instructions import FinishBatch, Finished, RoutedValue
from pathways_worker.worker.outbox import WorkerOutbox
from pathways_worker.worker.stimuli import GrantId, Stimulus

WAIT_S = 10.0


class Value:
    """A computation's output that becomes ready when the test says so."""

    def __init__(self, ready: bool = True) -> None:
        self._ready = threading.Event()
        if ready:
            self._ready.set()

    def is_ready(self) -> bool:
        return self._ready.is_set()

    def block_until_ready(self) -> None:
        assert self._ready.wait(WAIT_S), "a value the test never made ready"

    def make_ready(self) -> None:
        self._ready.set()


def batch(*seqs: int, value: Any = None, report: bool = False, routed: bool = False) -> FinishBatch:
    return FinishBatch(tuple(
        Finished(
            GrantId(seq, "c", seq), (value if value is not None else Value(),), "",
            routed=(RoutedValue((seq, 0), None, None),) if routed else (),
        )
        for seq in seqs
    ), report=report)


class Harness:
    def __init__(self) -> None:
        self.outbox = WorkerOutbox(lambda: 0, 1 << 20)
        self.reported: list[Stimulus] = []
        self.finisher = Finisher("host-0", 0, None, self.outbox, self.reported.append)  # type: ignore[arg-type]

    def completed(self, count: int) -> list[int]:
        """The seqs of the next `count` completions the outbox sends, in order."""
        seqs: list[int] = []
        for _ in range(count):
            if len(seqs) == count:
                break
            event = self.outbox.take_event(WAIT_S)
            assert event is not None, f"only {seqs} of {count} completions came"
            seqs += [seq for c in event.completions for seq in seqs_of(c)]
        return seqs

    def stop(self) -> None:
        self.finisher.stop()


def test_a_ready_batch_with_nothing_queued_is_finished_by_the_caller() -> None:
    h = Harness()
    try:
        ready = batch(1, 2, 3)
        assert h.finisher.claim(ready)
        assert h.finisher.pending == 3, "claimed grants count as in hand until reported"
        h.finisher.finish_claimed(ready)
        assert h.finisher.pending == 0
        assert h.completed(3) == [1, 2, 3]
    finally:
        h.stop()


def test_a_batch_still_running_routed_or_reported_back_is_left_to_the_finisher_thread() -> None:
    h = Harness()
    try:
        assert not h.finisher.claim(batch(1, value=Value(ready=False)))
        assert not h.finisher.claim(batch(2, routed=True)), "a routed value is written out"
        assert not h.finisher.claim(batch(3, report=True)), "the machine waits for BatchFinished"
        assert h.finisher.pending == 0, "a refused claim counts nothing"
    finally:
        h.stop()


def test_no_batch_is_claimed_while_an_earlier_job_waits_on_the_finisher_thread() -> None:
    h = Harness()
    try:
        running = Value(ready=False)
        h.finisher.put(batch(1, value=running))
        later = batch(2)
        assert not h.finisher.claim(later), "finishing it here would overtake grant 1"
        h.finisher.put(later)
        running.make_ready()
        assert h.completed(2) == [1, 2]
        assert h.finisher.claim(batch(3)), "once the queue drained, the caller may finish again"
    finally:
        h.stop()


def test_a_job_put_after_a_claimed_batch_waits_for_it() -> None:
    h = Harness()
    try:
        claimed = batch(1)
        assert h.finisher.claim(claimed)
        h.finisher.put(batch(2))
        assert h.outbox.take_event(0.2) is None, "grant 2 went before the claimed grant 1 was finished"
        h.finisher.finish_claimed(claimed)
        assert h.completed(2) == [1, 2]
    finally:
        h.stop()


def test_a_claimed_batch_whose_computation_failed_reports_the_failure() -> None:
    class Failed(Value):
        def block_until_ready(self) -> None:
            raise RuntimeError("XLA runtime error")

    h = Harness()
    try:
        failed = batch(1, value=Failed())
        assert h.finisher.claim(failed)
        h.finisher.finish_claimed(failed)
        event = h.outbox.take_event(WAIT_S)
        assert event is not None
        (completion,) = event.completions
        assert not completion.ok and "XLA runtime error" in completion.error
        assert [type(s).__name__ for s in h.reported] == ["ComputationFailedLate"]
    finally:
        h.stop()


def test_a_batch_whose_hand_off_to_the_outbox_fails_counts_each_grant_off_pending_once() -> None:
    class Late(Value):
        """Not ready when asked, done once waited for: its batch goes in two hand-offs."""

        def is_ready(self) -> bool:
            return False

    class FailingOutbox(WorkerOutbox):
        def __init__(self) -> None:
            super().__init__(lambda: 0, 1 << 20)
            self.calls = 0

        def completions(self, done: list[Any], ends_call: bool = False) -> None:
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("the outbox broke")
            super().completions(done, ends_call)

    h = Harness()
    h.finisher.stop()
    outbox = h.outbox = FailingOutbox()
    h.finisher = Finisher("host-0", 0, None, outbox, h.reported.append)  # type: ignore[arg-type]
    try:
        h.finisher.put(FinishBatch((
            Finished(GrantId(1, "c", 1), (Value(),), ""),
            Finished(GrantId(2, "c", 2), (Late(),), ""),
        )))
        assert h.completed(1) == [1]
        pause = threading.Event()
        for _ in range(100):  # the second hand-off fails on the finisher thread
            if outbox.calls == 2:
                break
            pause.wait(0.05)
        assert outbox.calls == 2
        assert h.finisher.pending == 0, "a grant counted off twice, or never"
    finally:
        h.stop()


def test_consecutive_grants_that_succeeded_go_as_one_completion_and_a_failure_breaks_the_run() -> None:
    h = Harness()
    try:
        failed = Finished(GrantId(4, "c", 4), (), "computation 4 failed")
        run = batch(1, 2, 3)
        other_call = Finished(GrantId(9, "d", 9), (Value(),), "")
        inline = Finished(GrantId(10, "d", 10), (np.zeros(2, np.float32),), "", inline=(0,))
        job = FinishBatch((
            *run.grants, failed, *batch(5, 6).grants, *batch(8).grants, other_call, inline,
            Finished(GrantId(11, "d", 11), (Value(),), ""), Finished(GrantId(12, "d", 12), (Value(),), ""),
        ))
        assert h.finisher.claim(job)
        h.finisher.finish_claimed(job)
        event = h.outbox.take_event(WAIT_S)
        assert event is not None
        assert [(c.seq, c.call_id, c.count, c.ok, len(c.outputs)) for c in event.completions] == [
            (1, "c", 3, True, 0), (4, "c", 0, False, 0), (5, "c", 2, True, 0), (8, "c", 0, True, 0),
            (9, "d", 0, True, 0), (10, "d", 0, True, 1), (11, "d", 2, True, 0),
        ], "a gap, another call, a failure or an output inline each end a run; one inline starts none"
        assert h.finisher.pending == 0, "every grant counted off, runs by their count"
    finally:
        h.stop()


class Failing(Value):
    """An output whose computation fails after its dispatch, as XLA reports it."""

    def __init__(self) -> None:
        super().__init__(ready=False)

    def block_until_ready(self) -> None:
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 640000000768 bytes.")


def test_a_computation_failing_after_dispatch_is_reported_naming_program_computation_and_host() -> None:
    h = Harness()
    try:
        label = "program 'p' computation 'big' (index 3)"
        h.finisher.put(FinishBatch((Finished(GrantId(1, "p-1", 3), (Failing(),), "", label=label),)))
        event = h.outbox.take_event(WAIT_S)
        assert event is not None
        (completion,) = event.completions
        assert not completion.ok
        assert completion.error == (
            f"{label} of call p-1 failed on host host-0: RuntimeError: RESOURCE_EXHAUSTED: "
            "Out of memory allocating 640000000768 bytes."
        )
    finally:
        h.stop()
