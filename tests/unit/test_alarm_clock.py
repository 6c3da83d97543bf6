"""The worker's alarm clock: timers ring once, in order, unless cancelled, and a sooner
timer wakes the sleeping thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pathways_worker.worker.alarm_clock import STALE_SLACK, AlarmClock

WAIT_S = 5.0


class Rung:
    """The timers rung, in order; `event` is set once `want` of them have."""

    def __init__(self, want: int = 1) -> None:
        self.timers: list[int] = []
        self.event = threading.Event()
        self.want = want

    def __call__(self, timer: int) -> None:
        self.timers.append(timer)
        if len(self.timers) >= self.want:
            self.event.set()


@contextmanager
def clock_of(rung: Rung, nap_s: float = 1.0) -> Iterator[AlarmClock]:
    clock = AlarmClock(rung, nap_s=nap_s)
    try:
        yield clock
    finally:
        clock.stop()


def test_a_started_timer_rings_once_after_its_delay() -> None:
    rung = Rung()
    with clock_of(rung) as clock:
        started = time.monotonic()
        clock.start(7, 0.05)
        assert rung.event.wait(WAIT_S)
        assert time.monotonic() - started >= 0.05
        time.sleep(0.1)
        assert rung.timers == [7]


def test_a_cancelled_timer_never_rings_and_the_others_still_do() -> None:
    rung = Rung()
    with clock_of(rung) as clock:
        clock.start(1, 0.05)
        clock.start(2, 0.1)
        clock.cancel(1)
        assert rung.event.wait(WAIT_S)
        time.sleep(0.1)
        assert rung.timers == [2]


def test_a_sooner_timer_wakes_a_thread_sleeping_until_a_later_one() -> None:
    rung = Rung(want=2)
    with clock_of(rung, nap_s=60.0) as clock:
        clock.start(1, 0.4)
        time.sleep(0.1)  # the thread now sleeps until timer 1 is due
        clock.start(2, 0.05)
        assert rung.event.wait(WAIT_S)
        assert rung.timers == [2, 1]


def test_a_timer_started_again_after_a_cancel_rings_at_its_new_time_only() -> None:
    rung = Rung(want=2)
    with clock_of(rung) as clock:
        clock.start(1, 0.05)
        clock.cancel(1)
        clock.start(1, 0.2)
        clock.start(2, 0.3)
        assert rung.event.wait(WAIT_S)
        assert rung.timers == [1, 2]


def test_many_cancelled_timers_do_not_pile_up_in_the_heap() -> None:
    with clock_of(Rung()) as clock:
        for timer in range(1, 2001):
            clock.start(timer, 600.0)
            clock.cancel(timer)
        assert len(clock._alarms) <= STALE_SLACK + 1


def test_stop_ends_the_thread() -> None:
    clock = AlarmClock(lambda timer: None)
    clock.start(1, 600.0)
    clock.stop()
    clock._thread.join(WAIT_S)
    assert not clock._thread.is_alive()
