"""Figures: a median over repeats, its spread, the baseline and the target it is held to."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable


@dataclasses.dataclass
class Figure:
    """One row of a run. `bench.verdicts` judges it from these fields alone, as stored in the run's JSON."""

    experiment: str
    name: str
    unit: str
    median: float
    low: float
    high: float
    repeats: int
    """Independent measurements behind `median`, `low` and `high` (never a count of calls inside one)."""
    baseline: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    """Whether the median is on the target's side; the verdict also weighs repeats and the baseline."""
    note: str = ""
    samples: list[float] = dataclasses.field(default_factory=list)
    baseline_samples: list[float] = dataclasses.field(default_factory=list)
    """The repeats of the baseline measured in the same run, whose spread decides whether to judge."""
    baseline_exact: bool = False
    """The baseline is a given number (a weight's share), not a measurement."""
    limit: float | None = None
    """The most the quantity can physically be (utilization: 1); above it the baseline is wrong."""
    limit_reason: str = "so the baseline is wrong"
    """What a value above `limit` means, for the verdict."""
    limit_each: bool = True
    """Whether any repeat above `limit` voids the figure (a repeat whose measurement was
    lost), or only the median (a ratio whose repeats scatter about a true value that
    may be the limit itself: a utilization of 1 reads 0.97 in one window, 1.03 in the next)."""
    counted: bool = False
    """The value is counted (bytes moved), not timed: one count is exact and needs no repeats."""


def repeat(fn: Callable[[], float], repeats: int) -> list[float]:
    """Runs `fn` (which returns its own measurement) `repeats` times."""
    return [fn() for _ in range(repeats)]


def best_of(sample: Callable[[], float], times: int) -> Callable[[], float]:
    """A sampler whose measurement is the least of `times` runs of `sample`, back to back:
    another process's burst on a shared machine only ever adds time, so one run it hit
    no longer sets the repeat. The repeats built of such samples stay independent, and
    their spread still decides whether a figure is judged."""

    def least() -> float:
        return min(sample() for _ in range(times))

    return least


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def figure(experiment: str, name: str, unit: str, samples: list[float], **kw: object) -> Figure:
    return Figure(
        experiment, name, unit, statistics.median(samples), min(samples), max(samples),
        len(samples), samples=list(samples), **kw,  # type: ignore[arg-type]
    )
