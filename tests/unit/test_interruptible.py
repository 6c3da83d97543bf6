"""Waits of the user's thread end when their condition holds, and let a pending signal through."""

from __future__ import annotations

import signal
import threading
from concurrent.futures import Future
from types import FrameType

import pytest

from pathways import interruptible


class Interrupted(Exception):
    pass


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def test_each_wait_returns_once_its_condition_holds() -> None:
    event = threading.Event()
    future: Future[int] = Future()
    lock = threading.Semaphore(0)

    def finish() -> None:
        event.set()
        future.set_result(7)
        lock.release()

    worker = threading.Thread(target=finish)
    worker.start()
    interruptible.wait_event(event)
    assert interruptible.result(future) == 7
    interruptible.acquire(lock)
    interruptible.join(worker)
    assert not worker.is_alive()


def test_a_failed_future_raises_its_own_error() -> None:
    future: Future[int] = Future()
    future.set_exception(TimeoutError("the host did not answer"))
    with pytest.raises(TimeoutError, match="the host did not answer"):
        interruptible.result(future)


def test_a_signal_sent_while_the_main_thread_waits_interrupts_the_wait() -> None:
    """The signal is delivered to another thread, as when the kernel gives a SIGINT to one of
    gRPC's threads; a plain ``Event.wait()`` in the main thread would sleep through it."""
    previous = signal.signal(signal.SIGUSR2, _raise)
    never = threading.Event()
    sender = threading.Timer(0.3, lambda: signal.pthread_kill(threading.get_ident(), signal.SIGUSR2))
    try:
        sender.start()
        with pytest.raises(Interrupted):
            interruptible.wait_event(never)
    finally:
        sender.cancel()
        signal.signal(signal.SIGUSR2, previous)
