"""The worker's alarm clock: timers ring once, in order, unless cancelled, and a sooner
timer wakes the sleeping thread."""

from __future__ import annotations

import threading
import time

from pathways_worker.worker.alarm_clock import STALE_SLACK, AlarmClock

WAIT_S = 5.0


class Rung:
    def __init__(self) -> None:
        self.timers: list[int] = []
        self.event = threading.Event()
        self.want = 1

    def __call__(self, timer: int) -> None:
        self.timers.append(timer)
        if len(self.timers) >= self.want:
            self.event.set()


def test_a_started_timer_rings_once_after_its_delay() -> None:
    rung = Rung()
    clock = AlarmClock(rung)
    try:
        started = time.monotonic()
        clock.start(7, 0.05)
        assert rung.event.wait(WAIT_S)
        assert time.monotonic() - started >= 0.05
        time.sleep(0.1)
        assert rung.timers == [7]
    finally:
        clock.stop()


def test_a_cancelled_timer_never_rings_and_the_others_still_do() -> None:
    rung = Rung()
    clock = AlarmClock(rung)
    try:
        clock.start(1, 0.05)
        clock.start(2, 0.1)
        clock.cancel(1)
        assert rung.event.wait(WAIT_S)
        time.sleep(0.1)
        assert rung.timers == [2]
    finally:
        clock.stop()


def test_a_sooner_timer_wakes_a_thread_sleeping_until_a_later_one() -> None:
    rung = Rung()
    rung.want = 2
    clock = AlarmClock(rung, nap_s=60.0)
    try:
        clock.start(1, 0.4)
        time.sleep(0.1)  # the thread now sleeps until timer 1 is due
        clock.start(2, 0.05)
        assert rung.event.wait(WAIT_S)
        assert rung.timers == [2, 1]
    finally:
        clock.stop()


def test_a_timer_started_again_after_a_cancel_rings_at_its_new_time_only() -> None:
    rung = Rung()
    rung.want = 2
    clock = AlarmClock(rung)
    try:
        clock.start(1, 0.05)
        clock.cancel(1)
        clock.start(1, 0.2)
        clock.start(2, 0.3)
        assert rung.event.wait(WAIT_S)
        assert rung.timers == [1, 2]
    finally:
        clock.stop()


def test_many_cancelled_timers_do_not_pile_up_in_the_heap() -> None:
    clock = AlarmClock(lambda timer: None)
    try:
        for timer in range(1, 2001):
            clock.start(timer, 600.0)
            clock.cancel(timer)
        assert len(clock._alarms) <= STALE_SLACK + 1
    finally:
        clock.stop()


def test_stop_ends_the_thread() -> None:
    clock = AlarmClock(lambda timer: None)
    clock.start(1, 600.0)
    clock.stop()
    clock._thread.join(WAIT_S)
    assert not clock._thread.is_alive()
