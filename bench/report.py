"""Writes a run's figures: `results/<date>.json` and the markdown table `RESULTS.md`."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
from importlib import metadata
from pathlib import Path

from bench.measure import Figure

HERE = Path(__file__).parent


def machine() -> dict[str, str]:
    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **{pkg: version(pkg) for pkg in ("jax", "jaxlib", "grpcio", "numpy", "ray")},
    }


def _num(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"


def markdown(figures: list[Figure], info: dict[str, str], mode: str, title: str) -> str:
    lines = [f"## {title}", "", f"`{mode}` run, {info['date']}: " + ", ".join(
        f"{k} {v}" for k, v in info.items() if k != "date") + ".", ""]
    lines.append("| experiment | figure | median | unit | spread (min–max) | n | vs baseline | target | met |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for f in figures:
        ratio = f"{f.ratio:.3g}× {f.baseline}" if f.ratio is not None else f.baseline
        met = "" if f.met is None else ("yes" if f.met else "**no**")
        value = _num(f.median) or f.note
        note = f" ({f.note})" if f.note and value != f.note else ""
        lines.append(
            f"| {f.experiment} | {f.name}{note} | {value} | {f.unit} | {f.spread()} | {f.repeats} "
            f"| {ratio} | {f.target} | {met} |"
        )
    return "\n".join(lines) + "\n"


def write(figures: list[Figure], mode: str, title: str) -> Path:
    now = datetime.datetime.now()
    info = {"date": now.isoformat(timespec="seconds"), **machine()}
    out = HERE / "results" / f"{now:%Y-%m-%d}{'-quick' if mode == 'quick' else ''}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(
        {"mode": mode, "machine": info, "figures": [dataclasses.asdict(f) for f in figures]},
        indent=1, default=str,
    ))
    table = markdown(figures, info, mode, title)
    results = HERE / "RESULTS.md"
    header = "# Benchmark results\n\nWritten by `make bench` / `make bench-quick` (`python -m bench.run`).\n"
    body = results.read_text() if results.exists() else header
    marker = f"## {title}"
    if marker in body:
        start = body.index(marker)
        end = body.find("\n## ", start + 1)
        body = body[:start] + table + (body[end + 1:] if end != -1 else "")
    else:
        body = body.rstrip("\n") + "\n\n" + table
    results.write_text(body)
    return out
