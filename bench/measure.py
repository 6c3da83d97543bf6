"""Figures: a median over repeats, its spread, the baseline and the target it is held to."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable


@dataclasses.dataclass
class Figure:
    experiment: str
    name: str
    unit: str
    median: float
    low: float
    high: float
    repeats: int
    baseline: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""

    def spread(self) -> str:
        if self.repeats <= 1:
            return ""
        return f"{self.low:.3g}–{self.high:.3g}"


def repeat(fn: Callable[[], float], repeats: int) -> list[float]:
    """Runs `fn` (which returns its own measurement) `repeats` times."""
    return [fn() for _ in range(repeats)]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def figure(experiment: str, name: str, unit: str, samples: list[float], **kw: object) -> Figure:
    return Figure(
        experiment, name, unit, statistics.median(samples), min(samples), max(samples),
        len(samples), **kw,  # type: ignore[arg-type]
    )
