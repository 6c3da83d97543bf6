"""What the commands print: kubectl-like tables, ``describe`` pages and documents.

Everything here is a pure function of typed views (:mod:`pathways.kube`) and a ``now``,
so the output is tested without a cluster or a clock. Tables are left-aligned columns
three spaces apart; ``describe`` pages are ``Key:  value`` fields followed by sections
(Conditions, Hosts, Programs, Events); a multi-line message (a driver's traceback) is
printed once in full, and every other place shows its first line and says where the
rest is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

import yaml

from pathways.cli.durations import human_duration
from pathways.kube_views import Condition, EventView, PodView, ProgramView, SliceView
from pathways_wire.wording import plural

RECENT_EVENTS = 10
NONE = "<none>"


def age(when: datetime | None, now: datetime) -> str:
    """How long ago ``when`` was, kubectl's way; ``<none>`` when it is not known."""
    return human_duration((now - when).total_seconds()) if when is not None else NONE


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


Table = tuple[list[str], list[list[str]]]


def _listing(
    headers: Sequence[str], rows: Sequence[Sequence[str]], namespaces: Sequence[str], *, all_namespaces: bool
) -> Table:
    """A kind's columns, with NAMESPACE first when the table spans namespaces (``-A``)."""
    if all_namespaces:
        return ["NAMESPACE", *headers], [[ns, *row] for ns, row in zip(namespaces, rows)]
    return list(headers), [list(row) for row in rows]


def _slice_row(s: SliceView, now: datetime, wide: bool) -> list[str]:
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
    return row


def slice_table(
    slices: Sequence[SliceView], now: datetime, *, wide: bool = False, all_namespaces: bool = False
) -> Table:
    """``pathways status`` rows for VirtualSlices."""
    headers = ["SLICE", "DEVICES", "ISLAND", "PHASE", "READY", "RESTARTS", "AGE"]
    headers += ["PER HOST", "NODES", "WAITING"] if wide else []
    rows = [_slice_row(s, now, wide) for s in slices]
    return _listing(headers, rows, [s.namespace for s in slices], all_namespaces=all_namespaces)


def program_slices_cell(p: ProgramView) -> str:
    return ",".join(f"{name}={vs}" for name, vs in p.virtual_slices().items()) or "-"


def _program_row(p: ProgramView, now: datetime, wide: bool) -> list[str]:
    row = [
        p.name, program_slices_cell(p), _dash(p.phase), f"{p.steps_completed}/{p.steps}",
        _weight(p.weight), age(p.created, now),
    ]  # fmt: skip
    if wide:
        source = p.entrypoint or (f"configmap/{p.config_map}" if p.config_map else "")
        results = f"configmap/{p.results_config_map}" if p.results_config_map else ""
        row += [_dash(source), _dash(results), _dash(p.message)]
    return row


def program_table(
    programs: Sequence[ProgramView], now: datetime, *, wide: bool = False, all_namespaces: bool = False
) -> Table:
    """``pathways status`` rows for PathwaysPrograms."""
    headers = ["PROGRAM", "SLICES", "PHASE", "STEPS", "WEIGHT", "AGE"]
    headers += ["SOURCE", "RESULTS", "MESSAGE"] if wide else []
    rows = [_program_row(p, now, wide) for p in programs]
    return _listing(headers, rows, [p.namespace for p in programs], all_namespaces=all_namespaces)


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


# -- log lines ---------------------------------------------------------------------------


def prefixed(prefix: str, text: str, tail: int | None = None) -> list[str]:
    """Each line of ``text`` (the last ``tail``) after ``prefix``."""
    lines = text.splitlines()
    if tail is not None:
        lines = lines[-tail:] if tail else []
    return [f"{prefix} {line}" for line in lines]


# -- documents ---------------------------------------------------------------------------


class _ManifestDumper(yaml.SafeDumper):
    """YAML as people write manifests: multi-line strings as ``|`` blocks, keys in order."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text and not any(line != line.rstrip() for line in text.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_ManifestDumper.add_representer(str, _represent_str)


def to_yaml(docs: Sequence[Mapping[str, Any]]) -> str:
    return yaml.dump_all(list(docs), Dumper=_ManifestDumper, sort_keys=False)


def dump_documents(docs: Sequence[Mapping[str, Any]], fmt: str, out: IO[str]) -> None:
    """``-o json`` (one object, or a List of several) or ``-o yaml`` (a document each)."""
    if fmt == "json":
        body: Any = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": list(docs)}
        out.write(json.dumps(body, indent=2) + "\n")
    else:
        out.write(to_yaml(docs))


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
