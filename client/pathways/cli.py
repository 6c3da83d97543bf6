"""``pathways``: watch and drive Kube-Pathways from a terminal, with kubectl's habits.

Cluster commands read what the operator wrote into the objects' ``status`` (through
:mod:`pathways.kube`), so they need only API access, never the operator itself::

    pathways status [-A] [-o table|wide|yaml|json] [-w [--until-done] [--timeout 10m]]
    pathways describe slice|program NAME
    pathways logs program|slice NAME [-c CONTAINER | --all-containers] [--tail N] [--log-dir DIR]

``logs program`` starts with the driver's log (``[driver]``), which the operator keeps in
ConfigMap ``<program>-driver-log`` when the program ends, so it is there after the
program's own slices are gone.

Program commands load a Python file that defines ``program`` (a ``@pw.program``) and
``example_args()`` (the arguments to trace and run it with, a tuple)::

    pathways compile prog.py -o manifest.yaml    # ConfigMap (IR + jax.export artifacts) + PathwaysProgram
    pathways submit prog.py [--wait [-o json]]   # the same, created in the cluster; --wait prints the results
    pathways run prog.py                         # on the embedded local runtime, no cluster

Every cluster command takes ``--kubeconfig``, ``--context``, ``-n/--namespace`` (before
or after the command, as with kubectl). Exit status: 0 ok; 1 not found, failed or timed
out; 2 usage (bad flags or arguments); 130 interrupted. Errors go to stderr and say
what to do next; tables and documents go to stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import yaml

from pathways.errors import PathwaysError
from pathways.kube import (
    DRIVER_LOG_KEY,
    PROGRAM_KIND,
    SIDECAR_CONTAINER,
    SLICE_KIND,
    SLICE_LABEL,
    WORKER_CONTAINER,
    Condition,
    EventView,
    Kube,
    KubeError,
    NotFoundError,
    PodView,
    ProgramView,
    SliceView,
    driver_log_config_map,
)
from pathways_wire.wording import fraction, plural

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
RECENT_EVENTS = 10
NONE = "<none>"


class CliError(Exception):
    """A command cannot go on; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


# -- durations and ages ------------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """kubectl's short duration: 45s, 3m12s, 15m, 2h5m, 10h, 3d4h, 40d, 2y30d."""
    s = max(0, int(seconds))
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 730:
        return f"{days}d"
    years = days // 365
    return f"{years}y{days % 365}d" if days % 365 else f"{years}y"


def age(when: datetime | None, now: datetime) -> str:
    return human_duration((now - when).total_seconds()) if when is not None else NONE


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1h30m`` -> seconds (an argparse type)."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use e.g. 30s, 5m or 1h30m")
    h, m, s = match.groups()
    return int(h or 0) * 3600 + int(m or 0) * 60 + float(s or 0)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


# -- tables ------------------------------------------------------------------------------


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Left-aligned columns three spaces apart, as kubectl prints them."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
    lines = [
        indent + "   ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
        for row in (list(headers), *rows)
    ]
    return "\n".join(lines)


def _weight(value: float) -> str:
    return f"{value:g}"


def _dash(text: str) -> str:
    return text or "-"


def slice_table(
    slices: Sequence[SliceView], now: datetime, *, wide: bool = False, all_namespaces: bool = False
) -> tuple[list[str], list[list[str]]]:
    """``pathways status`` rows for VirtualSlices."""
    headers = ["SLICE", "DEVICES", "ISLAND", "PHASE", "READY", "RESTARTS", "AGE"]
    if wide:
        headers += ["PER HOST", "NODES", "WAITING"]
    if all_namespaces:
        headers = ["NAMESPACE", *headers]
    rows = []
    for s in slices:
        row = [
            s.name, str(s.devices), _dash(s.island or (f"({s.island_pin})" if s.island_pin else "")),
            _dash(s.phase), _dash(s.ready_hosts), str(s.restarts), age(s.created, now),
        ]  # fmt: skip
        if wide:
            waiting = s.waiting_reason
            per_host = s.devices_per_host or next((h.devices for h in s.hosts if h.devices), 0)
            row += [
                str(per_host) if per_host else "-",
                _dash(",".join(sorted({h.node for h in s.hosts if h.node}))),
                f"{waiting.reason}: {waiting.message}" if waiting else "-",
            ]
        rows.append([s.namespace, *row] if all_namespaces else row)
    return headers, rows


def program_slices_cell(p: ProgramView) -> str:
    return ",".join(f"{name}={vs}" for name, vs in p.virtual_slices().items()) or "-"


def program_table(
    programs: Sequence[ProgramView], now: datetime, *, wide: bool = False, all_namespaces: bool = False
) -> tuple[list[str], list[list[str]]]:
    """``pathways status`` rows for PathwaysPrograms."""
    headers = ["PROGRAM", "SLICES", "PHASE", "STEPS", "WEIGHT", "AGE"]
    if wide:
        headers += ["SOURCE", "RESULTS", "MESSAGE"]
    if all_namespaces:
        headers = ["NAMESPACE", *headers]
    rows = []
    for p in programs:
        row = [
            p.name, program_slices_cell(p), _dash(p.phase), f"{p.steps_completed}/{p.steps}",
            _weight(p.weight), age(p.created, now),
        ]  # fmt: skip
        if wide:
            source = p.entrypoint or (f"configmap/{p.config_map}" if p.config_map else "")
            results = f"configmap/{p.results_config_map}" if p.results_config_map else ""
            row += [_dash(source), _dash(results), _dash(p.message)]
        rows.append([p.namespace, *row] if all_namespaces else row)
    return headers, rows


def status_text(
    slices: Sequence[SliceView],
    programs: Sequence[ProgramView],
    now: datetime,
    *,
    namespace: str | None,
    wide: bool = False,
) -> str:
    """Both tables, or a kubectl-like line when there is nothing to show."""
    all_namespaces = namespace is None
    if not slices and not programs:
        where = "any namespace" if all_namespaces else f"namespace {namespace}"
        return f"No VirtualSlices or PathwaysPrograms in {where}."
    parts = []
    if slices:
        parts.append(render_table(*slice_table(slices, now, wide=wide, all_namespaces=all_namespaces)))
    if programs:
        parts.append(render_table(*program_table(programs, now, wide=wide, all_namespaces=all_namespaces)))
    return "\n\n".join(parts)


# -- describe ----------------------------------------------------------------------------


FIELD_INDENT = " " * 15


def _fields(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """``Key:  value`` lines; a value's further lines are indented under its first."""
    return [f"{key + ':':<14} " + value.strip().replace("\n", "\n" + FIELD_INDENT) for key, value in pairs]


@dataclass
class _LongMessages:
    """Multi-line messages (a driver's traceback) are printed once, in full.

    The operator puts the same text in ``status.message``, in its conditions and in an
    Event; tables show only its first line and say where the rest is.
    """

    shown: str = ""
    """The text already printed in full (the program's Message), "" for none."""
    details: list[tuple[str, str]] = field(default_factory=list)

    def cell(self, message: str, where: str) -> str:
        lines = message.strip().splitlines()
        if len(lines) <= 1:
            return message.strip()
        more = plural(len(lines) - 1, "more line")
        if message.strip() == self.shown.strip():
            return f"{lines[0]} [{more}: see Message]"
        if all(text != message.strip() for _, text in self.details):
            self.details.append((where, message.strip()))
        return f"{lines[0]} [{more}: see Details]"

    def section(self) -> list[str]:
        if not self.details:
            return []
        lines = ["Details:"]
        for where, text in self.details:
            lines += [f"  {where}:", *(f"    {line}" for line in text.splitlines())]
        return lines


def _section(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    if not rows:
        return [f"{title + ':':<14} {NONE}"]
    return [f"{title}:", render_table(headers, rows, indent="  ")]


def conditions_section(
    conditions: Sequence[Condition], now: datetime, long: _LongMessages | None = None
) -> list[str]:
    long = long or _LongMessages()
    rows = [
        [c.type, c.status, _dash(c.reason), age(c.last_transition, now), long.cell(c.message, f"condition {c.type}")]
        for c in conditions
    ]
    return _section("Conditions", ["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"], rows)


def events_section(events: Sequence[EventView], now: datetime, long: _LongMessages | None = None) -> list[str]:
    long = long or _LongMessages()
    rows = []
    for e in list(events)[-RECENT_EVENTS:]:
        when = age(e.last_seen, now)
        if e.count > 1:
            when += f" (x{e.count} over {age(e.first_seen, now)})"
        rows.append([e.type, e.reason, when, _dash(e.source), long.cell(e.message, f"event {e.reason}")])
    return _section("Events", ["TYPE", "REASON", "AGE", "FROM", "MESSAGE"], rows)


NOT_RECONCILED = (
    "not written yet: no operator has reconciled this object (is it running? "
    "`kubectl get deploy -A -l app.kubernetes.io/name=kube-pathways`)"
)


def describe_slice(
    s: SliceView,
    pods: Sequence[PodView],
    programs: Sequence[ProgramView],
    events: Sequence[EventView],
    now: datetime,
) -> str:
    """``pathways describe slice``: what it is, where it runs, why it waits, what happened."""
    per_host = f"{s.devices_per_host} per host" if s.devices_per_host else "per host: the island's Node size"
    pairs = [
        ("Name", s.name),
        ("Namespace", s.namespace),
        ("Age", age(s.created, now)),
        ("Devices", f"{s.devices} ({per_host})"),
        ("Island", (s.island or "-") + (f" (pinned to {s.island_pin})" if s.island_pin else "")),
        ("Phase", s.phase or "-"),
    ]
    if not s.reconciled:
        pairs.append(("Status", NOT_RECONCILED))
    else:
        pairs += [("Ready hosts", _dash(s.ready_hosts)), ("Restarts", f"{s.restarts} (at most {s.max_restarts})")]
    if s.suspend:
        pairs.append(("Suspended", "yes: spec.suspend is true, the slice holds no pods"))
    waiting = s.waiting_reason
    if waiting is not None:
        pairs.append(("Waiting", f"{waiting.reason}: {waiting.message}"))
    lines = _fields(pairs)
    long = _LongMessages()
    lines += conditions_section(s.conditions, now, long)
    by_name = {p.name: p for p in pods}
    hosts: list[list[str]] = []
    seen: set[str] = set()
    for h in sorted(s.hosts, key=lambda h: h.index):
        pod = by_name.get(h.pod)
        seen.add(h.pod)
        hosts.append([
            str(h.index), _dash(h.pod), _dash(h.node or (pod.node if pod else "")),
            _dash(h.pod_ip or (pod.pod_ip if pod else "")), str(h.devices) if h.devices else "-",
            _pod_state(pod), str(pod.restarts) if pod else "-",
        ])  # fmt: skip
    for pod in pods:
        if pod.name not in seen:
            index = str(pod.host_index) if pod.host_index is not None else "?"
            hosts.append([index, pod.name, _dash(pod.node), _dash(pod.pod_ip), "-", _pod_state(pod), str(pod.restarts)])
    lines += _section("Hosts", ["HOST", "POD", "NODE", "POD IP", "DEVICES", "STATE", "RESTARTS"], hosts)
    users = [[p.name, _dash(p.phase), f"{p.steps_completed}/{p.steps}", _weight(p.weight)] for p in programs]
    lines += _section("Programs", ["PROGRAM", "PHASE", "STEPS", "WEIGHT"], users)
    lines += events_section(events, now, long)
    lines += long.section()
    return "\n".join(lines)


def _pod_state(pod: PodView | None) -> str:
    if pod is None:
        return "missing"
    return f"{pod.phase or 'Unknown'}{', ready' if pod.ready else ''}"


def describe_program(
    p: ProgramView,
    slices: Mapping[str, SliceView | None],
    events: Sequence[EventView],
    now: datetime,
) -> str:
    """``pathways describe program``: source, progress, its slices' state, what happened."""
    if p.entrypoint:
        source = f"entrypoint {p.entrypoint}"
    else:
        source = f"ConfigMap {p.config_map} (IR and jax.export artifacts from `pathways compile`)"
    pairs = [
        ("Name", p.name),
        ("Namespace", p.namespace),
        ("Age", age(p.created, now)),
        ("Source", source),
        ("Phase", p.phase or "-"),
        ("Steps", f"{p.steps_completed}/{p.steps}"),
        ("Weight", _weight(p.weight)),
    ]
    if not p.reconciled:
        pairs.append(("Status", NOT_RECONCILED))
    if p.suspend:
        pairs.append(("Suspended", "yes: spec.suspend is true, no computations are scheduled"))
    if p.start_time:
        pairs.append(("Started", f"{p.start_time.isoformat()} ({age(p.start_time, now)} ago)"))
    if p.completion_time:
        pairs.append(("Completed", f"{p.completion_time.isoformat()} ({age(p.completion_time, now)} ago)"))
    if p.results_config_map:
        pairs.append(("Results", f"ConfigMap {p.results_config_map}"))
    if p.message:
        pairs.append(("Message", p.message))
    for name, vs in p.virtual_slices().items():
        view = slices.get(name)
        waiting = view.waiting_reason if view is not None else None
        if waiting is not None:
            pairs.append(("Waiting", f"slice {name} (VirtualSlice {vs}): {waiting.reason}: {waiting.message}"))
    lines = _fields(pairs)
    rows = []
    inline = {s.name for s in p.slices if s.inline}
    for name, vs in p.virtual_slices().items():
        view = slices.get(name)
        kind = "inline" if name in inline else "shared"
        if view is None:
            rows.append([name, vs, kind, "-", "-", "not found", "-"])
        else:
            rows.append([
                name, vs, kind, str(view.devices), _dash(view.island), _dash(view.phase), _dash(view.ready_hosts),
            ])  # fmt: skip
    lines += _section("Slices", ["NAME", "VIRTUALSLICE", "KIND", "DEVICES", "ISLAND", "PHASE", "READY"], rows)
    long = _LongMessages(shown=p.message)
    lines += conditions_section(p.conditions, now, long)
    lines += events_section(events, now, long)
    lines += long.section()
    return "\n".join(lines)


# -- logs --------------------------------------------------------------------------------


def prefixed(prefix: str, text: str, tail: int | None = None) -> list[str]:
    """Each line of ``text`` (the last ``tail``) after ``prefix``."""
    lines = text.splitlines()
    if tail is not None:
        lines = lines[-tail:] if tail else []
    return [f"{prefix} {line}" for line in lines]


def log_file(log_dir: Path, namespace: str, pod: str, container: str) -> Path:
    """Where a node writes a container's log: ``<dir>/<namespace>_<pod>/<container>.log``.

    That is the test cluster's node agent layout (``<state-dir>/pods/...``; the state
    directory itself is accepted too).
    """
    direct = log_dir / f"{namespace}_{pod}" / f"{container}.log"
    nested = log_dir / "pods" / f"{namespace}_{pod}" / f"{container}.log"
    return nested if not direct.exists() and nested.exists() else direct


# -- programs from files -----------------------------------------------------------------


@dataclass(frozen=True)
class ProgramFile:
    """A ``prog.py``: its ``program`` and the arguments ``example_args()`` returns."""

    path: Path
    function: Any
    args: tuple[Any, ...]


PROGRAM_FILE_HELP = (
    "define a module-level `program` (a function decorated with @pw.program) and "
    "`example_args()` returning its arguments as a tuple"
)


def load_program_file(path: Path) -> ProgramFile:
    """Imports ``path`` (its directory first on sys.path, so its siblings import) and checks it."""
    from pathways.tracing import ProgramFunction

    if not path.is_file():
        raise CliError(f"{path}: no such file")
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(f"pathways_program_file_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise CliError(f"{path}: not a Python file Python can import")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except PathwaysError as err:
        raise CliError(f"{path}: {err}") from None
    function = getattr(module, "program", None)
    if not isinstance(function, ProgramFunction):
        found = f"`program` is a {type(function).__name__}" if function is not None else "it has no `program`"
        raise CliError(f"{path}: {found}; {PROGRAM_FILE_HELP}")
    example_args = getattr(module, "example_args", None)
    if not callable(example_args):
        raise CliError(f"{path}: it has no `example_args()`; {PROGRAM_FILE_HELP}")
    args = example_args()
    return ProgramFile(path, function, args if isinstance(args, tuple) else (args,))


def compile_program_file(
    path: Path, name: str | None, namespace: str | None, steps: int
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The ConfigMap and PathwaysProgram for ``path``, and a one-line summary."""
    from pathways.compiled import CompiledProgram, resource_name

    loaded = load_program_file(path)
    try:
        compiled = CompiledProgram.trace(loaded.function, loaded.args)
        program_name = resource_name(name or compiled.program.name)
        cm_name = resource_name(program_name, "-compiled")
        config_map = compiled.to_config_map(cm_name, namespace)
    except PathwaysError as err:
        raise CliError(f"{path}: {err}") from None
    program = compiled.to_program(program_name, cm_name, namespace, steps)
    size = sum(len(v) * 3 // 4 for v in config_map["binaryData"].values())
    p = compiled.program
    summary = (
        f"program '{p.name}': {plural(len(p.computations), 'computation')} on "
        f"{plural(len(p.slices), 'slice')}, {plural(len(p.inputs), 'input')}, {size / 1024:.1f} KiB compiled"
    )
    return config_map, program, summary


# -- commands ----------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _connect(args: argparse.Namespace) -> Kube:
    return Kube.connect(args.kubeconfig, args.context, args.namespace)


class _ManifestDumper(yaml.SafeDumper):
    """YAML as people write manifests: multi-line strings as ``|`` blocks, keys in order."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text and not any(line != line.rstrip() for line in text.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_ManifestDumper.add_representer(str, _represent_str)


def to_yaml(docs: Sequence[Mapping[str, Any]]) -> str:
    return yaml.dump_all(list(docs), Dumper=_ManifestDumper, sort_keys=False)


def _dump(docs: Sequence[Mapping[str, Any]], fmt: str, out: IO[str]) -> None:
    if fmt == "json":
        body: Any = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": list(docs)}
        out.write(json.dumps(body, indent=2) + "\n")
    else:
        out.write(to_yaml(docs))


def cmd_status(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    kube = _connect(args)
    namespace = None if args.all_namespaces else kube.namespace
    deadline = time.monotonic() + args.timeout if args.timeout else None
    last: tuple[tuple[str, str], ...] | None = None
    while True:
        raw_slices, raw_programs = kube.list_slices(namespace), kube.list_programs(namespace)
        snapshot = tuple(
            (str(o["metadata"].get("uid")), str(o["metadata"].get("resourceVersion")))
            for o in (*raw_slices, *raw_programs)
        )
        programs = [ProgramView.from_object(o) for o in raw_programs]
        if snapshot != last:
            if args.output in ("yaml", "json"):
                if args.watch:
                    _dump([*raw_slices, *raw_programs], args.output, out)
                else:
                    items = [*raw_slices, *raw_programs]
                    _dump([{"apiVersion": "v1", "kind": "List", "items": items}], args.output, out)
            else:
                if last is not None:
                    out.write(f"\n--- {datetime.now().strftime('%H:%M:%S')} ---\n")
                slices = [SliceView.from_object(o) for o in raw_slices]
                out.write(status_text(slices, programs, _now(), namespace=namespace, wide=args.output == "wide") + "\n")
            out.flush()
            last = snapshot
        if not args.watch:
            return EXIT_OK
        if args.until_done and programs and all(p.done for p in programs):
            failed = [p.name for p in programs if p.phase == "Failed"]
            if failed:
                err.write(f"error: programs failed: {', '.join(failed)} (see `pathways describe program NAME`)\n")
                return EXIT_FAILED
            return EXIT_OK
        if deadline is not None and time.monotonic() >= deadline:
            if args.until_done:
                pending = [p.name for p in programs if not p.done] or ["(no programs yet)"]
                err.write(
                    f"error: timed out after {human_duration(args.timeout)} waiting for "
                    f"{', '.join(pending)} to finish\n"
                )
                return EXIT_FAILED
            return EXIT_OK
        pause = args.interval if deadline is None else min(args.interval, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)


def _slice_views_of(kube: Kube, program: ProgramView) -> dict[str, SliceView | None]:
    found: dict[str, SliceView | None] = {}
    for name, vs in program.virtual_slices().items():
        try:
            found[name] = SliceView.from_object(kube.get_slice(program.namespace, vs))
        except NotFoundError:
            found[name] = None
    return found


def cmd_describe(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    kube = _connect(args)
    ns, now = kube.namespace, _now()
    if args.kind == "slice":
        view = SliceView.from_object(kube.get_slice(ns, args.name))
        pods = kube.pods(ns, f"{SLICE_LABEL}={view.name}")
        users = [
            p for p in map(ProgramView.from_object, kube.list_programs(ns))
            if view.name in p.virtual_slices().values()
        ]  # fmt: skip
        out.write(describe_slice(view, pods, users, kube.events(ns, SLICE_KIND, view.name), now) + "\n")
    else:
        program = ProgramView.from_object(kube.get_program(ns, args.name))
        slices = _slice_views_of(kube, program)
        out.write(describe_program(program, slices, kube.events(ns, PROGRAM_KIND, program.name), now) + "\n")
    return EXIT_OK


def _driver_log(kube: Kube, program: ProgramView, tail: int | None, out: IO[str], err: IO[str]) -> bool:
    """Prints the driver's log the operator kept for ``program``; False when there is none (yet)."""
    name = driver_log_config_map(program.name)
    try:
        text = kube.config_map_data(program.namespace, name).get(DRIVER_LOG_KEY, "")
    except NotFoundError:
        text = ""
    if not text:
        if program.done:
            err.write(f"note: no driver log kept for program {program.name} (no ConfigMap {name}): "
                      "its driver never started\n")  # fmt: skip
        else:
            err.write(f"note: the driver's log of program {program.name} is kept in ConfigMap {name} "
                      "once the program ends\n")  # fmt: skip
        return False
    for line in prefixed("[driver]", text, tail):
        out.write(line + "\n")
    return True


def cmd_logs(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    kube = _connect(args)
    ns = kube.namespace
    driver_shown = False
    if args.kind == "program":
        program = ProgramView.from_object(kube.get_program(ns, args.name))
        virtual_slices = sorted(set(program.virtual_slices().values()))
        what = f"program {args.name} (slices {', '.join(virtual_slices) or 'none'})"
        driver_shown = _driver_log(kube, program, args.tail, out, err)
    else:
        kube.get_slice(ns, args.name)
        virtual_slices = [args.name]
        what = f"slice {args.name}"
    pods = [pod for vs in virtual_slices for pod in kube.pods(ns, f"{SLICE_LABEL}={vs}")]
    if not pods:
        if driver_shown:
            return EXIT_OK  # a finished program's slices are gone; its driver's log is what is left
        raise CliError(
            f"{what} has no worker pods in namespace {ns} yet: see `pathways describe {args.kind} {args.name}`"
        )
    log_dir = Path(args.log_dir) if args.log_dir else None
    for pod in pods:
        containers = list(pod.containers) if args.all_containers else [args.container or WORKER_CONTAINER]
        for container in containers:
            host = f"host-{pod.host_index}" if pod.host_index is not None else pod.name
            prefix = f"[{pod.slice}/{host}" + (f"/{container}]" if len(containers) > 1 else "]")
            if log_dir is not None:
                path = log_file(log_dir, ns, pod.name, container)
                if not path.exists():
                    err.write(f"warning: {path}: no log for container {container} of pod {pod.name}\n")
                    continue
                text = path.read_text(errors="replace")
            else:
                try:
                    text = kube.pod_log(ns, pod.name, container, args.tail)
                except KubeError as e:
                    raise CliError(
                        f"{e}\nThe API server reads logs from the node's kubelet. Where nodes run "
                        "no kubelet (the test cluster's node agent), read the log files directly: "
                        "--log-dir DIR (DIR/<namespace>_<pod>/<container>.log)"
                    ) from None
            for line in prefixed(prefix, text, args.tail):
                out.write(line + "\n")
    return EXIT_OK


def cmd_compile(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    config_map, program, summary = compile_program_file(Path(args.file), args.name, args.namespace, args.steps)
    text = to_yaml([config_map, program])
    if args.output == "-":
        out.write(text)
    else:
        Path(args.output).write_text(text)
        err.write(
            f"{summary}\nwrote {args.output}: ConfigMap {config_map['metadata']['name']} and "
            f"PathwaysProgram {program['metadata']['name']}; apply with `kubectl apply --server-side -f {args.output}`\n"
            "(server-side: a client-side apply copies the ConfigMap into an annotation limited to 256 KiB)\n"
        )
    return EXIT_OK


def cmd_submit(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    kube = _connect(args)
    ns = kube.namespace
    config_map, program, summary = compile_program_file(Path(args.file), args.name, ns, args.steps)
    name = program["metadata"]["name"]
    err.write(summary + "\n")
    try:
        kube.get_program(ns, name)
    except NotFoundError:
        pass
    else:
        raise CliError(
            f"PathwaysProgram {name} already exists in namespace {ns}: delete it "
            f"(`kubectl delete pwprog {name} -n {ns}`) or pass --name"
        )
    kube.create(config_map, ns)
    created = kube.create(program, ns)
    kube.adopt_config_map(ns, config_map["metadata"]["name"], created)
    out.write(f"pathwaysprogram.pathways.dev/{name} created (ConfigMap {config_map['metadata']['name']})\n")
    if not args.wait:
        err.write(f"watch it with `pathways status -w -n {ns}` or `pathways describe program {name} -n {ns}`\n")
        return EXIT_OK
    view = _wait_program(kube, ns, name, args.timeout, err)
    if view is None:
        return EXIT_FAILED
    if view.phase != "Succeeded":
        err.write(f"see `pathways logs program {name} -n {ns}` for the driver's output\n")
        return EXIT_FAILED
    if not view.results_config_map:
        raise CliError(f"{name} Succeeded but its status names no results ConfigMap")
    data = kube.config_map_data(ns, view.results_config_map)
    out.write(results_text(data, args.output) + "\n")
    return EXIT_OK


def _natural(key: str) -> tuple[str, int]:
    stem, _, number = key.rpartition("_")
    return (stem, int(number)) if number.isdigit() else (key, -1)


def results_text(data: Mapping[str, str], fmt: str) -> str:
    """A results ConfigMap's values (JSON each), as ``pathways run`` prints outputs.

    ``text``: one ``key: value`` line per result (``output_0``, ``output_1``, ... in order);
    ``json``: one object.
    """
    results = {key: json.loads(data[key]) for key in sorted(data, key=_natural)}
    if fmt == "json":
        return json.dumps(results)
    return "\n".join(f"{key}: {json.dumps(value)}" for key, value in results.items())


def _wait_program(kube: Kube, ns: str, name: str, timeout: float, err: IO[str]) -> ProgramView | None:
    """Follows the program until it ends (its view), or None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout if timeout else None
    shown = ""
    while True:
        view = ProgramView.from_object(kube.get_program(ns, name))
        line = f"{view.phase or 'Pending'} {fraction(view.steps_completed, view.steps, 'step')}"
        if view.message:
            line += f": {view.message}"
        if line != shown:
            err.write(f"{name}: {line}\n")
            err.flush()
            shown = line
        if view.done:
            return view
        if deadline is not None and time.monotonic() >= deadline:
            err.write(
                f"error: {name} is still {view.phase or 'Pending'} after {human_duration(timeout)}: "
                f"see `pathways describe program {name} -n {ns}`\n"
            )
            return None
        time.sleep(1.0)


def cmd_run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    import jax
    import numpy as np

    import pathways as pw

    loaded = load_program_file(Path(args.file))
    err.write(f"running '{loaded.function.name}' on the embedded local runtime ({plural(args.steps, 'step')})\n")
    try:
        outputs: Any = None
        for step in range(args.steps):
            started = time.monotonic()
            outputs = loaded.function(*loaded.args)
            err.write(f"step {step + 1}/{args.steps} done in {time.monotonic() - started:.2f} s\n")
    except PathwaysError as e:
        raise CliError(f"{args.file}: {e}") from None
    finally:
        pw.shutdown()
    if args.output == "json":
        out.write(json.dumps(jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), outputs)) + "\n")
    else:
        out.write(repr(jax.tree_util.tree_map(np.asarray, outputs)) + "\n")
    return EXIT_OK


# -- the parser --------------------------------------------------------------------------


def _cluster_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """kubectl's connection flags; on subcommands they only override when given."""
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument("--kubeconfig", default=default, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--context", default=default, help="kubeconfig context (default: the current one)")
    parser.add_argument(
        "-n", "--namespace", default=default, help="namespace (default: the context's, else default)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pathways",
        description="Watch and drive Kube-Pathways: VirtualSlices and PathwaysPrograms.",
        epilog="Exit status: 0 ok, 1 not found/failed/timed out, 2 usage error.",
    )
    _cluster_options(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    status = commands.add_parser("status", help="table of slices and programs")
    _cluster_options(status, suppress=True)
    status.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    status.add_argument("-o", "--output", choices=("table", "wide", "yaml", "json"), default="table")
    status.add_argument("-w", "--watch", action="store_true", help="print again whenever something changes")
    status.add_argument(
        "--timeout", type=parse_duration, default=0.0, help="stop watching after this long (e.g. 10m; default: never)"
    )
    status.add_argument(
        "--until-done", action="store_true",
        help="with -w: stop when every program has Succeeded or Failed (exit 1 if any Failed)",
    )  # fmt: skip
    status.add_argument("--interval", type=parse_duration, default=1.0, help=argparse.SUPPRESS)
    status.set_defaults(run=cmd_status)

    describe = commands.add_parser("describe", help="conditions, hosts, events and why a slice waits")
    _cluster_options(describe, suppress=True)
    describe.add_argument("kind", choices=("slice", "program"))
    describe.add_argument("name")
    describe.set_defaults(run=cmd_describe)

    logs = commands.add_parser(
        "logs", help="a program's driver log and its workers' logs, each line prefixed by where it came from"
    )
    _cluster_options(logs, suppress=True)
    logs.add_argument("kind", choices=("program", "slice"))
    logs.add_argument("name")
    which = logs.add_mutually_exclusive_group()
    which.add_argument(
        "-c", "--container", default=None, choices=(WORKER_CONTAINER, SIDECAR_CONTAINER),
        help=f"container of each worker pod (default {WORKER_CONTAINER})",
    )  # fmt: skip
    which.add_argument("--all-containers", action="store_true", help="worker and dataflow sidecar")
    logs.add_argument("--tail", type=int, default=None, help="only the last N lines of each container")
    logs.add_argument(
        "--log-dir", default=None,
        help="read DIR/<namespace>_<pod>/<container>.log instead of the pod log API "
        "(for nodes without a kubelet, such as the test cluster's node agent)",
    )  # fmt: skip
    logs.set_defaults(run=cmd_logs)

    compile_ = commands.add_parser("compile", help="trace prog.py into a ConfigMap + PathwaysProgram manifest")
    compile_.add_argument("file", help=f"a Python file that must {PROGRAM_FILE_HELP}")
    compile_.add_argument("-o", "--output", default="-", help="manifest file (default: stdout)")
    compile_.add_argument("--name", default=None, help="PathwaysProgram name (default: the program's)")
    compile_.add_argument("-n", "--namespace", default=argparse.SUPPRESS, help="namespace to write into the manifest")
    compile_.add_argument("--steps", type=positive_int, default=1, help="spec.steps (default 1)")
    compile_.set_defaults(run=cmd_compile)

    submit = commands.add_parser("submit", help="compile prog.py and create it in the cluster")
    _cluster_options(submit, suppress=True)
    submit.add_argument("file", help=f"a Python file that must {PROGRAM_FILE_HELP}")
    submit.add_argument("--name", default=None, help="PathwaysProgram name (default: the program's)")
    submit.add_argument("--steps", type=positive_int, default=1, help="spec.steps (default 1)")
    submit.add_argument(
        "--wait", action="store_true",
        help="wait for Succeeded (print the results, exit 0) or Failed (exit 1)",
    )  # fmt: skip
    submit.add_argument("-o", "--output", choices=("text", "json"), default="text", help="with --wait: results as")
    submit.add_argument("--timeout", type=parse_duration, default=0.0, help="with --wait: give up after this long")
    submit.set_defaults(run=cmd_submit)

    run = commands.add_parser("run", help="run prog.py on the embedded local runtime (no cluster)")
    run.add_argument("file", help=f"a Python file that must {PROGRAM_FILE_HELP}")
    run.add_argument("--steps", type=positive_int, default=1, help="calls of the program (default 1)")
    run.add_argument("-o", "--output", choices=("text", "json"), default="text")
    run.set_defaults(run=cmd_run)
    return parser


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help (0) or a usage error (2, message already printed)
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    if args.command == "status" and args.until_done and not args.watch:
        err.write("error: --until-done needs -w (watch)\n")
        return EXIT_USAGE
    command: Callable[[argparse.Namespace, IO[str], IO[str]], int] = args.run
    try:
        return command(args, out, err)
    except CliError as e:
        err.write(f"error: {e}\n")
        return e.code
    except KubeError as e:
        err.write(f"error: {e}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
