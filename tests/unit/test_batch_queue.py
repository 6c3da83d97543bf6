"""BatchQueue: what a take returns, when a batch lingers for company, and which nudges end a wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pathways_worker.batch_queue import BatchQueue


def recording(answer: bool, asked: list[bool]) -> Callable[[int], bool]:
    def more_coming(held: int) -> bool:
        asked.append(answer)
        return answer

    return more_coming


def test_an_urgent_item_goes_without_lingering() -> None:
    queue: BatchQueue[int] = BatchQueue()
    asked: list[bool] = []
    queue.put(1)
    queue.put(2, urgent=True)
    items, nudged = queue.take(0.0, linger_s=60.0, more_coming=recording(True, asked))
    assert items == [1, 2] and not nudged
    assert asked == []


def lingering_take(
    queue: BatchQueue[int], more_coming: Callable[[int], bool]
) -> tuple[threading.Thread, list[list[int]]]:
    """A take on its own thread that would linger for ten minutes; what it took, once it ends."""
    taken: list[list[int]] = []
    taker = threading.Thread(
        target=lambda: taken.append(queue.take(0.0, linger_s=600.0, more_coming=more_coming)[0])
    )
    taker.start()
    return taker, taken


def test_urgent_items_end_a_linger_under_way() -> None:
    queue: BatchQueue[int] = BatchQueue()
    queue.put(1)
    lingering = threading.Event()

    def more_coming(held: int) -> bool:
        lingering.set()
        return True

    taker, taken = lingering_take(queue, more_coming)
    try:
        assert lingering.wait(timeout=30.0)
        queue.put_many([2, 3], urgent=True)
        taker.join(timeout=30.0)
        assert not taker.is_alive(), "the take still lingers after urgent items came"
        assert taken == [[1, 2, 3]]
    finally:
        queue.put(4, urgent=True)
        taker.join(timeout=30.0)


def test_a_batch_without_urgent_items_asks_whether_to_linger() -> None:
    queue: BatchQueue[int] = BatchQueue()
    asked: list[bool] = []
    queue.put(1, urgent=True)
    queue.take(0.0)
    queue.put(2)
    items, _ = queue.take(0.0, linger_s=60.0, more_coming=recording(False, asked))
    assert items == [2]
    assert asked[-1] is False


def test_a_nudge_alone_ends_a_take_with_an_empty_batch() -> None:
    queue: BatchQueue[int] = BatchQueue()
    queue.nudge()
    assert queue.take(5.0) == ([], True)
    assert queue.take(0.0) == ([], False), "the nudge was taken"


def _take_beside(act: Callable[[BatchQueue[int]], None]) -> tuple[list[tuple[list[int], bool]], float]:
    """What a take of up to 0.3 s returns while `act` runs beside it, and how long it took."""
    queue: BatchQueue[int] = BatchQueue()
    got: list[tuple[list[int], bool]] = []
    taker = threading.Thread(target=lambda: got.append(queue.take(0.3)))
    started = time.monotonic()
    taker.start()
    time.sleep(0.02)
    act(queue)
    taker.join(timeout=30.0)
    return got, time.monotonic() - started


def test_a_nudge_wakes_no_waiting_take_which_reports_it_when_its_wait_ends() -> None:
    got, took = _take_beside(lambda queue: queue.nudge())
    assert got == [([], True)]
    assert took >= 0.3, "the nudge woke the take"


def test_a_nudge_made_while_a_batch_is_written_wakes_no_waiting_take_when_that_batch_is_sent() -> None:
    def write_a_batch_and_nudge_meanwhile(queue: BatchQueue[int]) -> None:
        assert queue.put_and_take([4]) == [4]  # this thread writes the batch
        queue.nudge()
        queue.sent()

    got, took = _take_beside(write_a_batch_and_nudge_meanwhile)
    assert got == [([], True)]
    assert took >= 0.3, "the batch sent after the nudge woke the take"


def test_a_batch_taken_after_a_nudge_answers_it() -> None:
    queue: BatchQueue[int] = BatchQueue()
    queue.nudge()
    assert queue.put_and_take([4]) == [4]
    queue.sent()
    assert queue.take(0.0) == ([], False), "the batch written carried what the nudge asked for"


def test_a_take_that_nudges_do_not_wake_reports_the_nudge_when_nothing_came() -> None:
    queue: BatchQueue[int] = BatchQueue()
    queue.nudge()
    assert queue.take(0.01, nudges_wake=False) == ([], True)
    assert queue.take(0.0) == ([], False), "the nudge was taken"


def test_a_take_that_nudges_do_not_wake_ends_with_the_next_item_and_the_nudge() -> None:
    queue: BatchQueue[int] = BatchQueue()
    queue.nudge()
    arriving = threading.Timer(0.01, queue.put, args=(7,))
    arriving.start()
    try:
        assert queue.take(30.0, nudges_wake=False) == ([7], True)
    finally:
        arriving.cancel()


def test_items_put_together_as_urgent_go_without_lingering_in_their_order() -> None:
    queue: BatchQueue[int] = BatchQueue()
    asked: list[bool] = []
    queue.put_many([3, 1, 2], urgent=True)
    items, _ = queue.take(0.0, linger_s=60.0, more_coming=recording(True, asked))
    assert items == [3, 1, 2]
    assert asked == []


def lingering_below(limit: int) -> tuple[Callable[[int], bool], threading.Event, list[tuple[int, int]]]:
    """A `more_coming` that lingers while fewer than `limit` items are held; an event set
    once it was first asked; and (asking thread, items held) for every ask."""
    asked: list[tuple[int, int]] = []
    lingering = threading.Event()

    def more_coming(held: int) -> bool:
        asked.append((threading.get_ident(), held))
        lingering.set()
        return held < limit

    return more_coming, lingering, asked


def test_a_linger_ends_once_the_items_held_make_lingering_pointless() -> None:
    """`more_coming` is asked again with the count held at every item put."""
    queue: BatchQueue[int] = BatchQueue()
    more_coming, lingering, asked = lingering_below(3)
    queue.put(1)
    taker, taken = lingering_take(queue, more_coming)
    try:
        assert lingering.wait(timeout=30.0)
        queue.put(2)
        queue.put(3)
        taker.join(timeout=30.0)
        assert not taker.is_alive(), "the take still lingers with 3 items held"
        assert taken == [[1, 2, 3]]
        assert asked[0][1] == 1 and asked[-1][1] == 3
    finally:
        queue.put(4, urgent=True)
        taker.join(timeout=30.0)


def test_items_that_leave_a_linger_under_way_do_not_wake_the_taker() -> None:
    """Whether the taker would go on lingering is asked on the putting thread; the
    taker itself runs again only once it would not."""
    queue: BatchQueue[int] = BatchQueue()
    more_coming, lingering, asked = lingering_below(4)
    queue.put(1)
    taker, taken = lingering_take(queue, more_coming)

    def asked_by_taker() -> int:
        return sum(1 for thread, _ in asked if thread == taker.ident)

    try:
        assert lingering.wait(timeout=30.0)
        queue.put(2)
        queue.put_many([3])
        queue.nudge()
        time.sleep(0.2)  # room for a woken taker to ask again
        assert asked_by_taker() == 1, "woken with nothing to do"
        queue.put(4)
        taker.join(timeout=30.0)
        assert not taker.is_alive(), "the take still lingers with 4 items held"
        assert taken == [[1, 2, 3, 4]]
        assert asked_by_taker() == 2, "woken once, when lingering stopped paying off"
    finally:
        queue.put(5, urgent=True)
        taker.join(timeout=30.0)


def test_a_taker_that_lost_the_queue_leaves_everything_to_the_next() -> None:
    q: BatchQueue[int] = BatchQueue()
    q.put_many([1, 2])
    q.nudge()
    assert q.take(0.0, owner=lambda: False) == ([], False)
    assert q.take(0.0, owner=lambda: True) == ([1, 2], True)


def test_an_urgent_put_takes_the_queue_for_its_thread_to_write_unless_a_batch_is_being_written() -> None:
    queue: BatchQueue[int] = BatchQueue()
    queue.put(1)
    assert queue.put_and_take([2]) == [1, 2], "the putter writes what was queued before its items too"
    assert queue.put_and_take([3]) == [], "a batch is being written: this one waits its turn"
    assert queue.put_and_take([4], urgent=False) == []
    queue.sent()
    assert queue.put_and_take([5], urgent=False) == [], "not urgent: left to the stream's writer"
    assert queue.take(0.0, sending=True)[0] == [3, 4, 5]
    assert queue.put_and_take([6]) == [], "the writer's batch is being written"
    queue.sent()
    assert queue.put_and_take([7]) == [6, 7]


def test_a_sending_take_waits_for_the_batch_another_thread_writes_and_keeps_the_order() -> None:
    queue: BatchQueue[int] = BatchQueue()
    assert queue.put_and_take([1]) == [1]
    queue.put(2)
    taken: list[list[int]] = []
    taker = threading.Thread(target=lambda: taken.append(queue.take(10.0, sending=True)[0]))
    taker.start()
    time.sleep(0.05)
    assert taken == [], "batch [1] is not written yet, so [2] may not be taken"
    queue.sent()
    taker.join(10.0)
    assert taken == [[2]]


def test_a_sending_take_gives_up_empty_when_the_batch_being_written_outlasts_its_timeout() -> None:
    queue: BatchQueue[int] = BatchQueue()
    assert queue.put_and_take([1]) == [1]
    queue.put(2)
    assert queue.take(0.01, sending=True) == ([], False)
    queue.sent()
    assert queue.take(0.0, sending=True) == ([2], False)
