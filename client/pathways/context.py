"""What a program run by the Kubernetes operator gets: its arguments, its slices, its progress.

A PathwaysProgram names an *entrypoint*, ``package.module:function``, that the
operator's driver (``python -m pathways.driver``) calls as ``function(ctx)``
once all of the program's VirtualSlices are Ready. ``ctx`` is a
:class:`ProgramContext`:

``ctx.args``
    ``spec.args`` of the PathwaysProgram (a dict of JSON values).
``ctx.steps`` / ``ctx.start_step``
    run steps ``range(ctx.start_step, ctx.steps)``. ``start_step`` is 0 on the
    first run and the number of steps already completed when the program is
    restarted (its slice was recreated, or the operator restarted).
``ctx.weight``
    ``spec.weight``: pass it to ``@pw.program(weight=ctx.weight)`` so the island
    scheduler gives the program its share of slices it shares with others.
``ctx.slice(name)``
    the :class:`~pathways.VirtualSlice` the program calls ``name`` in
    ``spec.slices``: a *named* slice, so the controller runs it on that
    VirtualSlice's gang of worker pods. Use ``.devices`` with ``pw.pmap`` or the
    slice itself with ``pw.jit``, exactly as with ``add_slice`` locally.
``ctx.step_done(step, metrics, state=None, outputs=None)``
    records that ``step`` finished (reported to the controller by a driver pod,
    or one JSON line in a progress file); the operator turns it into
    ``status.stepsCompleted``. A step whose metrics, state or other ``outputs``
    hold `pw.Array` handles is reported once their values exist, without waiting
    for them in ``step_done``: the entrypoint dispatches the next steps meanwhile,
    at most :data:`PENDING_STEPS` ahead of its reports. It is also where a
    program is *suspended*: when a suspend was asked for (``spec.suspend``, a
    preemption, ``run.suspend()`` locally), ``step_done`` snapshots ``state``
    and raises :class:`ProgramSuspended`, which unwinds the entrypoint.
``ctx.restore(default)``
    the program's persistent state: the pytree of the latest snapshot, or
    ``default`` on a fresh start. With checkpoints configured
    (``spec.checkpoint``: a volume and ``everySteps``), ``step_done`` snapshots
    the ``state`` it is given every ``everySteps`` steps, asynchronously, with
    orbax-checkpoint (:mod:`pathways.checkpoint`), and ``start_step`` is the
    step of the snapshot ``restore`` returns, so state and step always agree::

        params = ctx.restore(default=init_params())
        for step in range(ctx.start_step, ctx.steps):
            params, loss = train_step(params, batch(step))
            ctx.step_done(step, {"loss": loss}, state=params)

The function returns ``dict[str, array-like]``: the program's results, which
the operator stores as JSON in the ConfigMap named by ``status.results``, so
keep them small (metrics, a few parameters): each key is a ConfigMap key
(letters, digits, ``-``, ``_`` and ``.``, at most 253 characters, not ``.`` or
``..``), and keys and JSON values together take at most 1 MiB
(:data:`RESULTS_MAX_BYTES`). The driver checks both before the program ends
(:func:`results_problem`) and fails the program naming the key and the limit;
keep larger arrays in ``spec.checkpoint`` state or storage of your own.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pathways.devices import VirtualSlice, make_virtual_device_set
from pathways.driver_reports import FileReporter, Reporter
from pathways_wire.errors import InvalidProgramError

if TYPE_CHECKING:
    from pathways.array import Array
    from pathways.checkpoint import Checkpointer

PENDING_STEPS = 8
"""Steps `ProgramContext.step_done` holds while the handles of their metrics and state are
still being computed: the entrypoint runs that far ahead of its reports; past it,
``step_done`` waits for the oldest."""


class ProgramSuspended(Exception):
    """Raised by ``ctx.step_done`` once a suspend was asked for and the state is saved.

    ``steps_completed`` is where the program continues when it is resumed.
    """

    def __init__(self, steps_completed: int) -> None:
        super().__init__(f"suspended after {steps_completed} steps")
        self.steps_completed = steps_completed


@dataclass
class CheckpointStats:
    """What snapshots cost the step loop (for ``bench/checkpoints.py`` and logs)."""

    snapshots: int = 0
    held_s: float = 0.0
    """Seconds ``step_done`` blocked in orbax's save (copying, and waiting for the previous write)."""
    bytes: int = 0
    """Bytes of state snapshotted, all snapshots together."""
    steps: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SliceBinding:
    """A slice name of the program bound to a VirtualSlice of the cluster."""

    virtual_slice: str
    devices: int


class ProgramContext:
    """The handle an entrypoint receives; see the module docstring."""

    def __init__(
        self,
        *,
        args: Mapping[str, Any],
        steps: int,
        start_step: int,
        slices: Mapping[str, SliceBinding],
        progress_file: Path | None = None,
        reporter: Reporter | None = None,
        weight: float = 1.0,
        checkpointer: Checkpointer | None = None,
        every_steps: int = 0,
        suspend_event: threading.Event | None = None,
    ) -> None:
        self._checkpointer = checkpointer
        self._restored: tuple[int, Any] | None = None
        if checkpointer is not None:
            self._restored = checkpointer.restore()
            if self._restored is not None:
                start_step = self._restored[0]
        if not 0 <= start_step <= steps:
            raise ValueError(f"start_step {start_step} is outside 0..steps ({steps})")
        self.every_steps = every_steps
        self.suspend_event = suspend_event or threading.Event()
        """Set it (from any thread) to suspend the program at its next ``step_done``."""
        self.checkpoint_stats = CheckpointStats()
        self.args: dict[str, Any] = dict(args)
        self.steps = steps
        self.start_step = start_step
        self.weight = weight
        self._bindings = dict(slices)
        self._reporter = reporter or (
            FileReporter(progress_file) if progress_file else None
        )
        """Where completed steps are recorded: a progress file, or the controller (a driver pod)."""
        self._slices: dict[str, VirtualSlice] = {}
        self._devices = make_virtual_device_set()
        self._pending: deque[tuple[int, Mapping[str, Any], tuple[Array, ...]]] = deque()
        """Steps done but not reported yet, oldest first: the step, its metrics, and the
        handles among its metrics and state, whose values it waits for."""

    @property
    def slice_names(self) -> list[str]:
        """The names the program's spec.slices give its slices."""
        return sorted(self._bindings)

    def slice(self, name: str) -> VirtualSlice:
        """The named virtual slice bound to the VirtualSlice ``spec.slices[name]`` refers to."""
        found = self._slices.get(name)
        if found is not None:
            return found
        binding = self._bindings.get(name)
        if binding is None:
            known = ", ".join(self.slice_names) or "none"
            raise InvalidProgramError(
                f"ctx.slice({name!r}): the program declares no slice of that name in "
                f"spec.slices (declared: {known})"
            )
        found = self._devices.add_slice(devices=binding.devices, name=binding.virtual_slice)
        self._slices[name] = found
        return found

    @property
    def restored_step(self) -> int | None:
        """The step of the snapshot ``restore`` returns (``start_step``), or None without one."""
        return None if self._restored is None else self._restored[0]

    def restore(self, default: Any = None) -> Any:
        """The state of the latest snapshot (the one ``start_step`` continues), else ``default``."""
        if self._restored is None or self._restored[1] is None:
            return default
        return self._restored[1]

    def step_done(
        self, step: int, metrics: Mapping[str, Any] | None = None, *, state: Any = None, outputs: Any = None
    ) -> None:
        """Record that ``step`` completed, with scalar ``metrics`` (e.g. loss).

        ``state`` is the program's persistent state after the step: snapshotted every
        ``every_steps`` steps, and always before a suspend. ``outputs`` is whatever else
        the step made that it is done only once made (a pytree of handles; neither
        reported nor snapshotted). A step whose metrics, state or outputs hold `pw.Array`
        handles is reported once they exist (`PENDING_STEPS`); a failed step's error is
        raised by the ``step_done`` (or `flush`) that reports it. Raises
        :class:`ProgramSuspended` when a suspend was asked for.
        """
        from pathways.array import Array

        import jax

        handles = tuple(
            x for x in jax.tree_util.tree_leaves((metrics, state, outputs)) if isinstance(x, Array)
        )
        self._pending.append((int(step), dict(metrics or {}), handles))
        self._report(PENDING_STEPS)
        done = int(step) + 1
        suspending = self.suspend_event.is_set()
        if self._checkpointer is not None:
            periodic = state is not None and self.every_steps > 0 and done % self.every_steps == 0
            if periodic or suspending:
                self.flush()  # a snapshot follows the steps it says are done
                self._snapshot(done, state)
        if suspending:
            self.flush()
            if self._checkpointer is not None:
                self._checkpointer.wait()
            raise ProgramSuspended(done)

    def flush(self) -> None:
        """Report every step `step_done` holds, waiting for their handles' values (the
        driver calls it when the entrypoint returns)."""
        self._report(0)

    def _report(self, hold: int) -> None:
        """Reports held steps in order: each whose handles' values exist, and, waiting for
        them, the oldest while more than ``hold`` are held."""
        while self._pending:
            step, metrics, handles = self._pending[0]
            if len(self._pending) <= hold and not all(h.is_ready() for h in handles):
                return
            self._pending.popleft()
            for handle in handles:
                handle.block_until_ready()  # a failed step's error surfaces here
            self._record(step, metrics)

    def _snapshot(self, done: int, state: Any) -> None:
        assert self._checkpointer is not None
        from pathways.array import fetch

        state = fetch(state)  # handles' values come to the client here, and only here
        stats = self.checkpoint_stats
        stats.held_s += self._checkpointer.save(done, state)
        stats.snapshots += 1
        stats.steps.append(done)
        stats.bytes += _tree_bytes(state)

    def release_slices(self) -> None:
        """Give back the hosts of every slice the program used (a suspended program holds none)."""
        for vslice in self._slices.values():
            vslice.release()
        self._slices.clear()

    def close(self) -> None:
        """Wait for snapshots still being written (call before the process exits)."""
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None

    def _record(self, step: int, metrics: Mapping[str, Any] | None) -> None:
        if self._reporter is not None:
            self._reporter.step(int(step), {k: _scalar(v) for k, v in (metrics or {}).items()})


def _tree_bytes(state: Any) -> int:
    if state is None:
        return 0
    import jax
    import numpy as np

    return sum(int(np.asarray(leaf).nbytes) for leaf in jax.tree_util.tree_leaves(state))


def _scalar(value: Any) -> float | int | str:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


RESULTS_MAX_BYTES = 1024 * 1024
"""The most results may take, keys and JSON values together: what one ConfigMap holds."""
RESULT_KEY_MAX_CHARS = 253
_RESULT_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def result_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a ConfigMap key (the API server's own rules), or None."""
    if not _RESULT_KEY.fullmatch(key):
        return "must be made of letters, digits, '-', '_' and '.' (a ConfigMap key)"
    if len(key) > RESULT_KEY_MAX_CHARS:
        return f"is {len(key)} characters long; a ConfigMap key has at most {RESULT_KEY_MAX_CHARS}"
    if key in (".", "..") or key.startswith(".."):
        return "must not be '.' or '..' nor start with '..' (a ConfigMap key)"
    return None


def results_problem(stored: Mapping[str, str]) -> str | None:
    """Why results (key -> JSON text, as the operator stores them) cannot be stored, or None."""
    for key in stored:
        problem = result_key_problem(key)
        if problem is not None:
            return f"result key {key!r} {problem}; rename it in the dict the entrypoint returns"
    sizes = {key: len(key.encode()) + len(text.encode()) for key, text in stored.items()}
    total = sum(sizes.values())
    if total > RESULTS_MAX_BYTES:
        largest = max(sizes, key=lambda k: sizes[k])
        return (
            f"the results take {total} bytes as JSON, over the limit of {RESULTS_MAX_BYTES} bytes "
            f"(1 MiB, what one ConfigMap holds); the largest is result {largest!r} with "
            f"{sizes[largest]} bytes; return small results (metrics, a few parameters) and keep "
            "large arrays in spec.checkpoint state or storage of your own"
        )
    return None
