"""What the worker tells its sidecar about a computation whose values leave the slice."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_worker.worker.finisher import WITH_COMPLETION_BYTES, exports_with_completion
from pathways_worker.worker import outbox as outbox_module
from pathways_worker.worker.outbox import WorkerOutbox, worth_lingering


def test_small_values_leave_with_their_completion() -> None:
    assert exports_with_completion([4096, WITH_COMPLETION_BYTES - 4096])
    assert exports_with_completion([0])  # a failed value: only its error travels


def test_large_values_leave_after_their_completion() -> None:
    assert not exports_with_completion([4096, WITH_COMPLETION_BYTES])


def test_a_finished_computation_and_its_exports_are_one_event_sent_at_once() -> None:
    outbox = WorkerOutbox(lambda: 7, 100, in_hand=lambda: 100)
    done = [pb.Completion(seq=1, call_id="c", node=0, ok=True)]
    exported = [pb.Exported(call_id="c", pieces=[pb.Piece(nbytes=4, data=b"abcd")])]
    outbox.finished(done, exported)
    event = outbox.take_event(0.0)
    assert event is not None
    assert list(event.completions) == done and list(event.exported) == exported
    assert event.store_bytes == 7
    assert outbox.take_event(0.0) is None


def test_completions_linger_only_while_the_host_has_more_left_than_it_holds() -> None:
    assert worth_lingering(in_hand=9, held=8)
    assert not worth_lingering(in_hand=9, held=9)
    assert not worth_lingering(in_hand=0, held=0), "nothing left: a call's end goes at once"


def test_completions_nobody_waits_for_room_for_linger_while_any_work_is_left() -> None:
    assert worth_lingering(in_hand=1, held=96, room_wanted=False)
    assert not worth_lingering(in_hand=0, held=96, room_wanted=False)


@pytest.mark.usefixtures("endless_linger")
def test_completions_lingering_while_no_room_was_wanted_go_once_it_is() -> None:
    wanted = [False]
    asked = threading.Event()

    def room_wanted() -> bool:
        asked.set()
        return wanted[0]

    outbox = WorkerOutbox(lambda: 0, 100, in_hand=lambda: 2, room_wanted=room_wanted)
    outbox.completions([completion(1), completion(2)])
    taker, taken = take_in_thread(outbox)
    try:
        assert asked.wait(timeout=30.0)
        wanted[0] = True
        outbox.reconsider()  # 2 held, 2 left, and now room is wanted: these go
        assert_took(taker, taken, [1, 2], "the completions still linger once room is wanted")
    finally:
        outbox.completions([completion(99)], ends_call=True)
        taker.join(timeout=30.0)


def completion(seq: int, ok: bool = True) -> pb.Completion:
    return pb.Completion(seq=seq, call_id="c", node=seq, ok=ok, error="" if ok else "boom")


def assert_took(
    taker: threading.Thread, taken: list[pb.WorkerEvent | None], seqs: list[int], lingered: str
) -> None:
    """The take on `taker` ended with one event of the completions `seqs`; `lingered` says why not."""
    taker.join(timeout=30.0)
    assert not taker.is_alive(), lingered
    (event,) = taken
    assert event is not None and [c.seq for c in event.completions] == seqs


def take_in_thread(outbox: WorkerOutbox) -> tuple[threading.Thread, list[pb.WorkerEvent | None]]:
    taken: list[pb.WorkerEvent | None] = []
    taker = threading.Thread(target=lambda: taken.append(outbox.take_event(0.0)))
    taker.start()
    return taker, taken


def work_left(grants: int) -> tuple[list[int], threading.Event, Callable[[], int]]:
    """The grants a host has in hand (`left[0]`, for the test to change), and an event set
    once the outbox asked."""
    left, asked = [grants], threading.Event()

    def in_hand() -> int:
        asked.set()
        return left[0]

    return left, asked, in_hand


@pytest.fixture
def endless_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    """A take that lingered to its bound would never end: the tests see whether it lingers."""
    monkeypatch.setattr(outbox_module, "EVENT_LINGER_S", 600.0)


@pytest.mark.usefixtures("endless_linger")
def test_completions_wait_for_company_until_they_are_as_many_as_the_work_left() -> None:
    left, asked, in_hand = work_left(3)
    outbox = WorkerOutbox(lambda: 0, 100, in_hand=in_hand)
    outbox.completions([completion(1)])
    taker, taken = take_in_thread(outbox)
    try:
        assert asked.wait(timeout=30.0)
        left[0] = 2
        outbox.completions([completion(2)])  # 2 held, 2 left: these go
        assert_took(taker, taken, [1, 2], "the completions still linger with as many held as left")
    finally:
        outbox.completions([completion(99)], ends_call=True)
        taker.join(timeout=30.0)


@pytest.mark.usefixtures("endless_linger")
@pytest.mark.parametrize("why", ["ends its call", "failed"])
def test_a_completion_someone_waits_for_goes_at_once_however_much_is_left(why: str) -> None:
    outbox = WorkerOutbox(lambda: 0, 100, in_hand=lambda: 100)
    outbox.completions([completion(1, ok=why != "failed")], ends_call=why == "ends its call")
    taker, taken = take_in_thread(outbox)
    try:
        taker.join(timeout=30.0)
        assert not taker.is_alive(), f"a completion that {why} lingered"
        (event,) = taken
        assert event is not None and [c.seq for c in event.completions] == [1]
    finally:
        outbox.completions([completion(99)], ends_call=True)
        taker.join(timeout=30.0)


@pytest.mark.usefixtures("endless_linger")
def test_a_completion_standing_for_a_run_counts_as_its_grants_when_weighing_the_work_left() -> None:
    left, asked, in_hand = work_left(3)
    outbox = WorkerOutbox(lambda: 0, 100, in_hand=in_hand)
    run = completion(1)
    run.count = 2
    outbox.completions([run])  # 2 grants held, 3 left: it lingers
    taker, taken = take_in_thread(outbox)
    try:
        assert asked.wait(timeout=30.0)
        left[0] = 2
        outbox.nudge()  # nothing new: the run alone now holds as many grants as are left
        outbox.reconsider()
        assert_took(taker, taken, [1], "a run of 2 held back was weighed as 1 completion")
    finally:
        outbox.completions([completion(99)], ends_call=True)
        taker.join(timeout=30.0)


def test_an_attached_session_is_written_by_the_thread_that_puts_what_someone_waits_for() -> None:
    outbox = WorkerOutbox(lambda: 7, 100, in_hand=lambda: 100)
    written: list[tuple[int, list[int]]] = []

    def write(event: pb.WorkerEvent) -> None:
        written.append((threading.get_ident(), [c.seq for c in event.completions]))

    outbox.attach(write)
    outbox.completions([pb.Completion(seq=1, call_id="c", ok=True)])  # more work left: it lingers
    outbox.completions([pb.Completion(seq=2, call_id="c", ok=True)], ends_call=True)
    assert written == [(threading.get_ident(), [1, 2])], "the call's end takes what lingered with it"
    outbox.detach(write)
    outbox.completions([pb.Completion(seq=3, call_id="d", ok=True)], ends_call=True)
    assert len(written) == 1, "detached: the session's writer thread takes it"
    event = outbox.take_event(0.0)
    assert event is not None and [c.seq for c in event.completions] == [3]


def test_an_event_the_putting_thread_could_not_write_is_left_to_the_session_writer() -> None:
    outbox = WorkerOutbox(lambda: 7, 100)

    def broken(event: pb.WorkerEvent) -> None:
        raise BrokenPipeError("the sidecar went away")

    outbox.attach(broken)
    outbox.completions([pb.Completion(seq=1, call_id="c", ok=True)], ends_call=True)
    event = outbox.take_event(0.0, sending=True)
    assert event is not None and [c.seq for c in event.completions] == [1]
    assert outbox.carries_items(event)
    outbox.sent()
