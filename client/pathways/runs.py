"""``pw.launch``: run a program entrypoint on the local runtime, suspendable and resumable.

The Kubernetes operator runs ``fn(ctx)`` entrypoints (see :mod:`pathways.context`)
in a driver process and suspends them through ``spec.suspend``. This module
gives the embedded local runtime the same life cycle, in-process::

    run = pw.launch("examples.programs:train_regression", args={"features": 8},
                    steps=40, slices={"main": 8}, checkpoint_dir="/tmp/ckpt", every_steps=5)
    run.suspend()        # the current step finishes, the state is snapshotted, slices released
    run.resume()         # slices placed again, state restored, continues from the next step
    results = run.result()

The entrypoint runs on a background thread with a :class:`~pathways.context.ProgramContext`
whose slices are named slices of the local cluster (``<name>-<slice>``). A suspend sets the
context's suspend event; the entrypoint's next ``ctx.step_done`` saves its state with orbax
and unwinds. Resuming builds a fresh context from the newest snapshot, exactly as the
operator's driver does after ``suspend: false``.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pathways.context import ProgramContext, ProgramSuspended, SliceBinding
from pathways_wire.errors import InvalidProgramError

_runs = itertools.count()


class RunState(enum.StrEnum):
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Run:
    """One launched program; see the module docstring."""

    def __init__(
        self,
        fn: Callable[[ProgramContext], Any],
        *,
        name: str,
        args: Mapping[str, Any],
        steps: int,
        slices: Mapping[str, int],
        checkpoint_dir: Path | None,
        every_steps: int,
        weight: float,
    ) -> None:
        self.name = name
        self._fn = fn
        self._args = dict(args)
        self._steps = steps
        self._bindings = {k: SliceBinding(f"{name}-{k}", v) for k, v in slices.items()}
        self._checkpoint_dir = checkpoint_dir
        self._every = every_steps
        self._weight = weight
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._state = RunState.RUNNING
        self._results: Any = None
        self._error: BaseException | None = None
        self.steps_completed = 0
        self.contexts: list[ProgramContext] = []
        """Every context the program ran with (one per start or resume), for their checkpoint stats."""
        self._ctx: ProgramContext | None = None
        self._thread: threading.Thread | None = None
        self._start()

    @property
    def state(self) -> RunState:
        with self._lock:
            return self._state

    def _start(self) -> None:
        checkpointer = None
        if self._checkpoint_dir is not None:
            from pathways.checkpoint import Checkpointer

            checkpointer = Checkpointer(self._checkpoint_dir)
        ctx = ProgramContext(
            args=self._args,
            steps=self._steps,
            start_step=self.steps_completed,
            slices=self._bindings,
            weight=self._weight,
            checkpointer=checkpointer,
            every_steps=self._every,
        )
        self._ctx = ctx
        self.contexts.append(ctx)
        self._done.clear()
        with self._lock:
            self._state = RunState.RUNNING
        self._thread = threading.Thread(target=self._body, args=(ctx,), name=f"pw-run-{self.name}", daemon=True)
        self._thread.start()

    def _body(self, ctx: ProgramContext) -> None:
        state: RunState
        try:
            results = self._fn(ctx)
            ctx.flush()
        except ProgramSuspended as stop:
            self.steps_completed = stop.steps_completed
            state = RunState.SUSPENDED
        except BaseException as err:  # handed to result()
            self._error = err
            state = RunState.FAILED
        else:
            self._results = results
            self.steps_completed = self._steps
            state = RunState.SUCCEEDED
        finally:
            ctx.close()
        if state is RunState.SUSPENDED:
            ctx.release_slices()
        with self._lock:
            self._state = state
        self._done.set()

    def suspend(self, timeout: float = 120.0) -> RunState:
        """Finish the current step, snapshot the state, release the slices; returns the state reached.

        A program that ends before its next step boundary is Succeeded (or Failed), not Suspended.
        """
        if self._ctx is None or self.state is not RunState.RUNNING:
            return self.state
        self._ctx.suspend_event.set()
        if not self._done.wait(timeout):
            raise TimeoutError(
                f"run {self.name!r} did not reach a step boundary within {timeout:.0f}s; "
                "does the entrypoint call ctx.step_done after every step?"
            )
        return self.state

    def resume(self) -> None:
        """Continue a suspended run from its newest snapshot (its slices are placed again)."""
        if self.state is not RunState.SUSPENDED:
            raise InvalidProgramError(f"run {self.name!r} is {self.state}, not Suspended; nothing to resume")
        self._start()

    def result(self, timeout: float | None = None) -> Any:
        """The entrypoint's return value; raises its error, or TimeoutError."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"run {self.name!r} is still running after {timeout}s")
        if self.state is RunState.SUSPENDED:
            raise InvalidProgramError(f"run {self.name!r} is suspended; call run.resume() first")
        if self._error is not None:
            raise self._error
        return self._results


def launch(
    entrypoint: Callable[[ProgramContext], Any] | str,
    *,
    args: Mapping[str, Any] | None = None,
    steps: int = 1,
    slices: Mapping[str, int] | None = None,
    checkpoint_dir: str | Path | None = None,
    every_steps: int = 0,
    weight: float = 1.0,
    name: str | None = None,
) -> Run:
    """Start ``entrypoint(ctx)`` on the local runtime; see the module docstring.

    ``entrypoint`` is a function or ``"package.module:function"``; ``slices`` maps the
    program's slice names to device counts (default ``{"main": 4}``); ``checkpoint_dir``
    and ``every_steps`` turn on snapshots of the state given to ``ctx.step_done``
    (without a directory, a suspended run resumes from its step count with the
    entrypoint's default state).
    """
    if isinstance(entrypoint, str):
        from pathways.driver import DriverError, load_entrypoint

        try:
            fn = load_entrypoint(entrypoint)
        except DriverError as err:
            raise InvalidProgramError(f"pw.launch(entrypoint=...): {err}") from None
    else:
        fn = entrypoint
    if every_steps < 0:
        raise InvalidProgramError(f"pw.launch(every_steps={every_steps}): give 0 (only on suspend) or more")
    if steps < 1:
        raise InvalidProgramError(f"pw.launch(steps={steps}): a program runs at least 1 step")
    return Run(
        fn,
        name=name or f"run{next(_runs)}",
        args=args or {},
        steps=steps,
        slices=dict(slices or {"main": 4}),
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
        every_steps=every_steps,
        weight=weight,
    )
