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
``ctx.step_done(step, metrics)``
    records that ``step`` finished (one JSON line in the progress file); the
    operator turns it into ``status.stepsCompleted``.

The function returns ``dict[str, array-like]``: the program's results, which
the operator stores as JSON in the ConfigMap named by ``status.results``, so
keep them small (metrics, a few parameters).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pathways.devices import VirtualSlice, make_virtual_device_set
from pathways.errors import InvalidProgramError


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
        weight: float = 1.0,
    ) -> None:
        if not 0 <= start_step <= steps:
            raise ValueError(f"start_step {start_step} is outside 0..steps ({steps})")
        self.args: dict[str, Any] = dict(args)
        self.steps = steps
        self.start_step = start_step
        self.weight = weight
        self._bindings = dict(slices)
        self._progress_file = progress_file
        self._slices: dict[str, VirtualSlice] = {}
        self._devices = make_virtual_device_set()

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

    def step_done(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Record that ``step`` completed, with scalar ``metrics`` (e.g. loss)."""
        if self._progress_file is None:
            return
        line = {
            "step": int(step),
            "metrics": {k: _scalar(v) for k, v in (metrics or {}).items()},
            "time": time.time(),
        }
        with open(self._progress_file, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
            out.flush()


def _scalar(value: Any) -> float | int | str:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def steps_completed(progress_file: Path) -> int:
    """Steps recorded in a progress file: one more than the highest step done (0 if none)."""
    if not progress_file.exists():
        return 0
    done = 0
    for line in progress_file.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            done = max(done, record["step"] + 1)
    return done
