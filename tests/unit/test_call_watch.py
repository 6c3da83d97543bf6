"""What waits for a call's end without a thread (`controller.call_watch`): once, at the end or the deadline."""

from __future__ import annotations

import threading
import time

from pathways_operator.controller import call_watch
from pathways_operator.controller.call_watch import CallWatch, Once


def test_a_watcher_runs_once_whoever_calls_it() -> None:
    ran: list[int] = []
    once = Once(lambda: ran.append(1))
    assert not once.done
    once()
    once()
    assert ran == [1] and once.done


def test_a_watcher_that_raises_does_not_break_its_caller() -> None:
    def boom() -> None:
        raise RuntimeError("boom")

    Once(boom)()  # logged, not raised


def test_a_deadline_runs_the_watcher_on_the_watchs_thread_and_an_earlier_end_wins() -> None:
    watch = CallWatch()
    fired = threading.Event()
    where: list[str] = []

    def at_deadline() -> None:
        where.append(threading.current_thread().name)
        fired.set()

    late = Once(at_deadline)
    early_ran: list[int] = []
    early = Once(lambda: early_ran.append(1))
    watch.at(time.monotonic() + 0.05, late)
    watch.at(time.monotonic() + 0.02, early)
    early()  # the call ended first
    assert fired.wait(10.0)
    assert where == ["call-watch"] and early_ran == [1]


def test_soon_runs_watchers_on_the_watchs_thread() -> None:
    watch = CallWatch()
    done = threading.Event()
    watch.soon([Once(done.set)])
    assert done.wait(10.0)


def test_soon_with_no_watchers_wakes_and_starts_nothing() -> None:
    watch = CallWatch()
    watch.soon([])
    assert watch._thread is None
    done = threading.Event()
    watch.soon([Once(done.set)])
    assert done.wait(10.0)


def test_deadlines_of_answered_watchers_are_swept_out() -> None:
    watch = CallWatch()
    far = time.monotonic() + 3600
    answered = [Once(lambda: None) for _ in range(call_watch.PRUNE_AT)]
    for once in answered:
        once()
        watch.at(far, once)
    watch.at(far, Once(lambda: None))
    assert len(watch._deadlines) == 1, "the answered ones went when the bound was reached"
