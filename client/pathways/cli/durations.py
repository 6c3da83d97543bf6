"""Durations as kubectl prints them (``3m12s``) and reads them (``--timeout 1h30m``)."""

from __future__ import annotations

import argparse
import re


_SECONDS = {"y": 365 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_SHOWN = (
    # below this many seconds: (the larger unit, the smaller unit shown after it, or "")
    (120, ("s", "")),
    (600, ("m", "s")),
    (3 * 3600, ("m", "")),
    (8 * 3600, ("h", "m")),
    (48 * 3600, ("h", "")),
    (192 * 3600, ("d", "h")),
    (730 * 86400, ("d", "")),
)


def human_duration(seconds: float) -> str:
    """kubectl's short duration: 45s, 3m12s, 15m, 2h5m, 10h, 3d4h, 40d, 2y30d."""
    s = max(0, int(seconds))
    large, small = next((units for limit, units in _SHOWN if s < limit), ("y", "d"))
    count, rest = divmod(s, _SECONDS[large])
    smaller = rest // _SECONDS[small] if small else 0
    return f"{count}{large}{smaller}{small}" if smaller else f"{count}{large}"


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1h30m`` -> seconds (an argparse type)."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use e.g. 30s, 5m or 1h30m")
    h, m, s = match.groups()
    return int(h or 0) * 3600 + int(m or 0) * 60 + float(s or 0)
