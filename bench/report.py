"""Records a run's figures as `results/<date>T<time>.json` and renders RESULTS.md from such a record.

The table is always rendered from the JSON just written (or any older one, with
`python -m bench.report`), so every figure and verdict in RESULTS.md can be traced
to a named run; the verdicts follow `bench.verdicts`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from bench.measure import Figure
from bench.verdicts import rules_text, spread_text, verdict

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


def _cell(text: str) -> str:
    """`text` as one table cell: its first line (a failed experiment's error runs to many, its
    whole text kept in the run's JSON), with the table's own separator escaped."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    more = " … (the whole text is in the run's JSON)" if len(lines) > 1 else ""
    return (first + more).replace("|", "\\|")


def markdown(figures: list[Figure], info: dict[str, str], mode: str, title: str, run: str = "") -> str:
    """One run's section of RESULTS.md: where it came from, then a row per figure with its verdict."""
    source = f"From run `{run}` (`{mode}`), {info['date']}" if run else f"`{mode}` run, {info['date']}"
    lines = [f"## {title}", "", source + ": " + ", ".join(
        f"{k} {v}" for k, v in info.items() if k != "date") + ".", ""]
    lines.append("| experiment | figure | median | unit | spread (min–max) | n | vs baseline | target | verdict |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for f in figures:
        ratio = f"{f.ratio:.3g}× {f.baseline}" if f.ratio is not None else f.baseline
        note_cell = _cell(f.note)
        value = _num(f.median) or note_cell
        note = f" ({note_cell})" if f.note and value != note_cell else ""
        said = verdict(f)
        said = f"**{said}**" if said == "missed" or said.startswith("invalid") else said
        lines.append(
            f"| {f.experiment} | {f.name}{note} | {value} | {f.unit} | {spread_text(f)} | {f.repeats} "
            f"| {ratio} | {f.target} | {said} |"
        )
    return "\n".join(lines) + "\n"


def read_run(path: Path) -> tuple[str, dict[str, str], list[Figure]]:
    """A recorded run: its mode, its machine and date, and its figures."""
    run = json.loads(path.read_text())
    return run["mode"], run["machine"], [Figure(**f) for f in run["figures"]]


def write(figures: list[Figure], mode: str, title: str, info: dict[str, str] | None = None) -> Path:
    """Records a run as `results/<date>T<time>[-quick].json`, then renders its section of RESULTS.md from it."""
    now = datetime.datetime.now()
    info = {"date": now.isoformat(timespec="seconds"), **machine(), **(info or {})}
    suffix = "-quick" if mode == "quick" else ""
    out = HERE / "results" / f"{now:%Y-%m-%dT%H-%M}{suffix}.json"
    if out.exists():  # two runs ending in one minute: neither record is lost
        out = out.with_name(f"{now:%Y-%m-%dT%H-%M-%S}{suffix}.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(
        {"mode": mode, "machine": info, "figures": [dataclasses.asdict(f) for f in figures]},
        indent=1, default=str,
    ))
    render(out, title)
    return out


HEADER = (
    "# Benchmark results\n\n"
    "Written by `make bench` / `make bench-quick` (`python -m bench.run`), or from a recorded run\n"
    "by `python -m bench.report bench/results/<run>.json --title <title>`. Every figure in the\n"
    "tables is read from the named run's JSON.\n\n"
)


def render(run: Path, title: str) -> None:
    """Replaces (or adds) the section ``title`` of RESULTS.md with the recorded run ``run``."""
    mode, info, figures = read_run(run)
    name = str(run.relative_to(HERE.parent)) if run.is_relative_to(HERE.parent) else str(run)
    table = markdown(figures, info, mode, title, name)
    results = HERE / "RESULTS.md"
    body = results.read_text() if results.exists() else ""
    first = body.find("\n## ")
    body = HEADER + wrap(rules_text()) + "\n" + (body[first + 1:] if first != -1 else "")
    marker = f"## {title}\n"
    if marker in body:
        start = body.index(marker)
        end = body.find("\n## ", start + 1)
        body = body[:start] + table + (body[end:] if end != -1 else "")
    else:
        body = body.rstrip("\n") + "\n\n" + table
    results.write_text(body)


def wrap(text: str, width: int = 92) -> str:
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report",
                                     description="Render a recorded run into bench/RESULTS.md.")
    parser.add_argument("run", type=Path, help="a run's JSON under bench/results/")
    parser.add_argument("--title", required=True, help="the section of RESULTS.md to replace or add")
    args = parser.parse_args()
    render(args.run.resolve(), args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
