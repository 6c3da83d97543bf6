"""An object's reconcile loop (``k8s/handlers.py``): it looks again when woken, and it ends when
stopped without waiting for a reconcile in progress, so kopf never holds a deletion for the
daemon's cancellation back-off."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pathways_operator.k8s.handlers import Wakeups, _run_loop

KEY = "program:ns/p"
BOUND_S = 10.0
"""Every wait in these tests ends by then (none should come near it)."""


class Stopped:
    """What kopf passes a daemon as ``stopped``: false until set, and awaitable through ``wait()``."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()


class Reconciles:
    """A reconcile that counts its looks and, until ``released`` is set, does not return."""

    def __init__(self) -> None:
        self.looks = 0
        self.looking = threading.Semaphore(0)
        self.released = threading.Event()
        self.released.set()

    def __call__(self) -> float:
        self.looks += 1
        self.looking.release()
        self.released.wait(BOUND_S * 3)  # past every wait of the test that holds it
        return 600.0  # the next look only when woken


def run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario(), BOUND_S * 2))


async def started(reconciles: Reconciles) -> None:
    assert await asyncio.to_thread(reconciles.looking.acquire, True, BOUND_S), "no reconcile started"


def test_a_loop_stopped_during_a_reconcile_ends_before_the_reconcile_returns() -> None:
    reconciles = Reconciles()
    reconciles.released.clear()
    executor = ThreadPoolExecutor(max_workers=1)

    async def scenario() -> None:
        stopped = Stopped()
        loop = asyncio.ensure_future(
            _run_loop(KEY, reconciles, Wakeups(), executor, stopped, logging.getLogger("test"))  # type: ignore[arg-type]
        )
        await started(reconciles)
        stopped.set()
        done, _ = await asyncio.wait({loop}, timeout=BOUND_S)
        assert loop in done, "the loop waited for the reconcile in progress"
        assert not reconciles.released.is_set()
        loop.result()

    try:
        run(scenario)
    finally:
        reconciles.released.set()
        executor.shutdown(wait=True)
    assert reconciles.looks == 1


def test_a_wake_makes_the_loop_look_again_and_a_stop_ends_it() -> None:
    reconciles = Reconciles()
    executor = ThreadPoolExecutor(max_workers=1)

    async def scenario() -> None:
        wakeups = Wakeups()
        wakeups.bind(asyncio.get_running_loop())
        stopped = Stopped()
        loop = asyncio.ensure_future(
            _run_loop(KEY, reconciles, wakeups, executor, stopped, logging.getLogger("test"))  # type: ignore[arg-type]
        )
        await started(reconciles)
        wakeups.wake(KEY)
        await started(reconciles)
        stopped.set()
        done, _ = await asyncio.wait({loop}, timeout=BOUND_S)
        assert loop in done
        loop.result()

    try:
        run(scenario)
    finally:
        executor.shutdown(wait=True)
    assert reconciles.looks == 2
