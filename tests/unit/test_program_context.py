"""`ProgramContext.step_done` with `pw.Array` handles: a step is reported once the values of
its metrics and state exist, in order, without holding the entrypoint back, at most
`PENDING_STEPS` steps behind it. No processes: handles over stand-in calls the test ends."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

import pathways as pw
from pathways.array import Array, CallFuture
from pathways.context import PENDING_STEPS, ProgramContext, ProgramSuspended
from pathways_wire import ir
from pathways_wire.driver_protocol import RunStart


class Recorder:
    """A reporter that keeps the steps it is told of."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, dict[str, Any]]] = []

    def step(self, step: int, metrics: Mapping[str, float | int | str]) -> None:
        self.steps.append((step, dict(metrics)))

    def outcome(self, payload: Mapping[str, Any]) -> None:
        pass

    def started(self, run: RunStart) -> None:
        pass


def context(reporter: Recorder, steps: int = 100) -> ProgramContext:
    return ProgramContext(args={}, steps=steps, start_step=0, slices={}, reporter=reporter)


def loss_of(step: int) -> tuple[Array, CallFuture]:
    """A scalar loss whose call the test ends (`CallFuture.end`)."""
    call = CallFuture("train", f"train-{step}")
    handle = Array(ir.TensorSpec.of((), np.float32), call=call, ref=ir.ValueRef(0, 0),
                   fetch=lambda _: np.asarray(step / 10, np.float32))
    return handle, call


def test_steps_with_pending_handles_are_reported_in_order_once_their_values_exist() -> None:
    reporter = Recorder()
    ctx = context(reporter)
    calls = []
    for step in range(3):
        loss, call = loss_of(step)
        calls.append(call)
        ctx.step_done(step, {"loss": loss, "lr": 0.1})
    assert reporter.steps == [], "step_done waited for no value"

    calls[1].end("")
    ctx.step_done(3, {"lr": 0.1})  # numbers only, but after the pending steps
    assert reporter.steps == [], "step 1 is ready, but step 0 comes first"
    calls[0].end("")
    ctx.step_done(4, {})
    assert [s for s, _ in reporter.steps] == [0, 1], "ready steps go in order, up to the first pending one"
    assert reporter.steps[1][1] == {"loss": pytest.approx(0.1), "lr": 0.1}

    calls[2].end("")
    ctx.flush()
    assert [s for s, _ in reporter.steps] == [0, 1, 2, 3, 4]


def test_step_done_waits_for_the_oldest_step_past_the_bound() -> None:
    reporter = Recorder()
    ctx = context(reporter)
    first, first_call = loss_of(0)
    ctx.step_done(0, {"loss": first})
    for step in range(1, PENDING_STEPS):
        ctx.step_done(step, {"loss": loss_of(step)[0]})
    assert reporter.steps == []

    threading.Timer(0.2, first_call.end, args=("",)).start()
    ctx.step_done(PENDING_STEPS, {})  # one past the bound: waits for step 0
    assert [s for s, _ in reporter.steps] == [0]


def test_a_failed_steps_error_is_raised_where_it_is_reported_and_suspend_reports_all_first() -> None:
    reporter = Recorder()
    ctx = context(reporter)
    bad, bad_call = loss_of(0)
    ctx.step_done(0, {"loss": bad})
    bad_call.end("program 'train' computation 'step' (index 0) of call train-0 on host host-0 failed: boom")
    with pytest.raises(pw.ExecutionError, match="boom"):
        ctx.flush()

    reporter = Recorder()
    ctx = context(reporter)
    late, late_call = loss_of(1)
    ctx.step_done(0, {"loss": late})
    ctx.suspend_event.set()
    threading.Timer(0.2, late_call.end, args=("",)).start()
    with pytest.raises(ProgramSuspended):
        ctx.step_done(1, {}, state={"w": late})
    assert [s for s, _ in reporter.steps] == [0, 1], "a suspend reports every step it ends with"
