"""When a figure earns a verdict, and what it says.

A run's figures come from shared 2-core machines where another process can
halve a measurement at any moment, so "met" or "missed" is printed only when the
figure could tell: at least `MIN_REPEATS` independent repeats of the figure, and
a baseline measured in the same run whose own repeats agree within
`MAX_BASELINE_SPREAD` (largest over smallest); a count (bytes moved) against
a given number is exact and judged as it is. Otherwise the row says
"noisy, not judged" and why. A value beyond what the quantity can physically be
(a utilization above 1) means its baseline is wrong: the row says "invalid",
which is never "met". For a lost measurement any repeat beyond it voids the
figure; for a ratio whose true value may be the limit itself (a utilization of
1, which windows read as 0.97 or 1.03 by the baseline's own noise) the median
is what must stay within it. Shares are judged relative to each weight's share, so a
small tenant cannot pass with 1.45× its share as an absolute tolerance allowed.

Everything here is a pure function of a `Figure` as stored in a run's JSON, so
a verdict can be recomputed from any recorded run (`python -m bench.report`).
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.measure import Figure

MIN_REPEATS = 5
"""Independent repeats a figure and its measured baseline need before they are judged."""

MAX_BASELINE_SPREAD = 1.5
"""Largest over smallest repeat of the baseline above which the baseline is too noisy to judge by."""

SHARE_TOLERANCE = 0.10
"""A tenant's share may be off its weight's share by this fraction of that share."""

NOT_JUDGED = "noisy, not judged"


def baseline_spread(samples: Sequence[float]) -> float:
    """Largest over smallest repeat; infinite when a repeat is zero or below (nothing to divide by)."""
    low = min(samples)
    return max(samples) / low if low > 0 else float("inf")


def verdict(f: Figure) -> str:
    """What the row's verdict column says: "" (no target), invalid, not judged, met or missed."""
    if not f.target:
        return ""
    beyond = f.high if f.limit_each else f.median
    if f.limit is not None and f.repeats and beyond > f.limit:
        return f"invalid: {beyond:.3g} > {f.limit:g}, {f.limit_reason}"
    if f.met is None:
        return ""
    if f.repeats < MIN_REPEATS and not f.counted:
        return f"{NOT_JUDGED} (n {f.repeats} < {MIN_REPEATS})"
    if not f.baseline_exact:
        n = len(f.baseline_samples)
        if n < MIN_REPEATS:
            return f"{NOT_JUDGED} (baseline n {n} < {MIN_REPEATS})"
        spread = baseline_spread(f.baseline_samples)
        if spread > MAX_BASELINE_SPREAD:
            return f"{NOT_JUDGED} (baseline max/min {spread:.2f} > {MAX_BASELINE_SPREAD:g})"
    return "met" if f.met else "missed"


def share_error(share: float, want: float) -> float:
    """How far a share is from its weight's share, as a fraction of that share."""
    return abs(share / want - 1.0)


def share_met(share: float, want: float) -> bool:
    return share_error(share, want) <= SHARE_TOLERANCE


def spread_text(f: Figure) -> str:
    """min–max over repeats; nothing for a single measurement, which has no spread."""
    if f.repeats <= 1:
        return ""
    return f"{f.low:.3g}–{f.high:.3g}"


def rules_text() -> str:
    """The rules above as RESULTS.md states them, from the same constants."""
    return (
        f"A verdict (met / missed) is printed only for a figure with at least {MIN_REPEATS} repeats "
        f"whose baseline, measured in the same run, also has at least {MIN_REPEATS} repeats with "
        f"max/min ≤ {MAX_BASELINE_SPREAD:g}; otherwise the row says \"{NOT_JUDGED}\" and why. A "
        "baseline that is a given number (a weight's share) has no spread, and a count (bytes moved) "
        "against one is judged from a single count. A figure above what its "
        "quantity can be (utilization above 1: the single-tenant baseline is wrong) is \"invalid\", "
        "never met: a utilization by its median, since windows scatter about a true 1 by the "
        "baseline's own noise; a transfer by any repeat whose move was lost in the noise. "
        f"Shares are judged within {SHARE_TOLERANCE:.0%} of each weight's share, relative. "
        "n is the number of independent repeats; a single measurement has no spread column."
    )
