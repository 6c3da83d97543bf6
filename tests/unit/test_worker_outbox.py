"""What the worker tells its sidecar about a computation whose values leave the slice."""

from __future__ import annotations

from pathways_wire import pathways_pb2 as pb
from pathways_worker.worker.finisher import WITH_COMPLETION_BYTES, exports_with_completion
from pathways_worker.worker.outbox import WorkerOutbox


def test_small_values_leave_with_their_completion() -> None:
    assert exports_with_completion([4096, WITH_COMPLETION_BYTES - 4096])
    assert exports_with_completion([0])  # a failed value: only its error travels


def test_large_values_leave_after_their_completion() -> None:
    assert not exports_with_completion([4096, WITH_COMPLETION_BYTES])


def test_a_finished_computation_and_its_exports_are_one_event_sent_at_once() -> None:
    outbox = WorkerOutbox(lambda: 7, 100, busy=lambda: True)
    done = [pb.Completion(seq=1, call_id="c", node=0, ok=True)]
    exported = [pb.Exported(call_id="c", pieces=[pb.Piece(nbytes=4, data=b"abcd")])]
    outbox.finished(done, exported)
    event = outbox.take_event(0.0)
    assert event is not None
    assert list(event.completions) == done and list(event.exported) == exported
    assert event.store_bytes == 7
    assert outbox.take_event(0.0) is None
