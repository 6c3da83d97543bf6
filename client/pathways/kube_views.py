"""Typed, read-only views of the Kube-Pathways objects the ``pathways`` CLI shows.

Each view (:class:`SliceView`, :class:`ProgramView`, :class:`PodView`,
:class:`EventView`) is parsed once from the JSON the API server returns, with the
CRDs' documented defaults applied, so renderers take these and never raw dicts. The
``json_*`` readers turn a field of that JSON into the type a view wants, whatever the
server (or a hand-edited object) put there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pathways_wire.kube_names import HOST_INDEX_LABEL, SLICE_LABEL

DEFAULT_MAX_RESTARTS = 3
TERMINAL_PROGRAM_PHASES = frozenset({"Succeeded", "Failed"})


def parse_time(text: object) -> datetime | None:
    """An RFC 3339 timestamp as the API writes it, or None when absent or malformed."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def json_int(value: object, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def json_str(value: object) -> str:
    return value if isinstance(value, str) else ""


def json_map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def json_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class Condition:
    """One metav1-style condition of a slice or program."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition: datetime | None = None

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> Condition:
        return cls(
            type=json_str(raw.get("type")),
            status=json_str(raw.get("status")) or "Unknown",
            reason=json_str(raw.get("reason")),
            message=json_str(raw.get("message")),
            last_transition=parse_time(raw.get("lastTransitionTime")),
        )


def conditions_of(status: Mapping[str, Any]) -> tuple[Condition, ...]:
    return tuple(Condition.from_object(json_map(c)) for c in json_list(status.get("conditions")))


@dataclass(frozen=True)
class Host:
    """One entry of ``VirtualSlice.status.hosts``: a worker pod of the gang."""

    index: int
    pod: str = ""
    node: str = ""
    pod_ip: str = ""
    devices: int = 0


@dataclass(frozen=True)
class SliceView:
    """A VirtualSlice: the spec the user asked for and the status the operator wrote."""

    namespace: str
    name: str
    devices: int
    devices_per_host: int | None = None
    island_pin: str = ""
    max_restarts: int = DEFAULT_MAX_RESTARTS
    suspend: bool = False
    created: datetime | None = None
    phase: str = ""
    island: str = ""
    ready_hosts: str = ""
    restarts: int = 0
    conditions: tuple[Condition, ...] = ()
    hosts: tuple[Host, ...] = ()
    reconciled: bool = False

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> SliceView:
        meta, spec, status = json_map(raw.get("metadata")), json_map(raw.get("spec")), json_map(raw.get("status"))
        dph = spec.get("devicesPerHost")
        return cls(
            namespace=json_str(meta.get("namespace")),
            name=json_str(meta.get("name")),
            devices=json_int(spec.get("devices")),
            devices_per_host=json_int(dph) if json_int(dph) > 0 else None,
            island_pin=json_str(spec.get("island")),
            max_restarts=json_int(json_map(spec.get("failurePolicy")).get("maxRestarts"), DEFAULT_MAX_RESTARTS),
            suspend=bool(spec.get("suspend", False)),
            created=parse_time(meta.get("creationTimestamp")),
            phase=json_str(status.get("phase")),
            island=json_str(status.get("island")),
            ready_hosts=json_str(status.get("readyHosts")),
            restarts=json_int(status.get("restarts")),
            conditions=conditions_of(status),
            hosts=tuple(
                Host(
                    index=json_int(h.get("index")),
                    pod=json_str(h.get("pod")),
                    node=json_str(h.get("node")),
                    pod_ip=json_str(h.get("podIP")),
                    devices=json_int(h.get("devices")),
                )
                for h in map(json_map, json_list(status.get("hosts")))
            ),
            reconciled=bool(status),
        )

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def waiting_reason(self) -> Condition | None:
        """Why the gang is not placed: the Admitted condition while it is False."""
        admitted = self.condition("Admitted")
        return admitted if admitted is not None and admitted.status == "False" else None


@dataclass(frozen=True)
class ProgramSlice:
    """One entry of ``PathwaysProgram.spec.slices``: a shared VirtualSlice or an inline one."""

    name: str
    ref: str = ""
    template_devices: int = 0

    @property
    def inline(self) -> bool:
        return not self.ref


@dataclass(frozen=True)
class ProgramView:
    """A PathwaysProgram: its slices, source and progress."""

    namespace: str
    name: str
    slices: tuple[ProgramSlice, ...] = ()
    entrypoint: str = ""
    config_map: str = ""
    steps: int = 1
    weight: float = 1.0
    suspend: bool = False
    created: datetime | None = None
    phase: str = ""
    steps_completed: int = 0
    slice_names: str = ""
    conditions: tuple[Condition, ...] = ()
    start_time: datetime | None = None
    completion_time: datetime | None = None
    results_config_map: str = ""
    message: str = ""
    reconciled: bool = False

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> ProgramView:
        meta, spec, status = json_map(raw.get("metadata")), json_map(raw.get("spec")), json_map(raw.get("status"))
        source = json_map(spec.get("source"))
        weight = spec.get("weight", 1)
        return cls(
            namespace=json_str(meta.get("namespace")),
            name=json_str(meta.get("name")),
            slices=tuple(
                ProgramSlice(
                    name=json_str(s.get("name")),
                    ref=json_str(s.get("ref")),
                    template_devices=json_int(json_map(s.get("template")).get("devices")),
                )
                for s in map(json_map, json_list(spec.get("slices")))
            ),
            entrypoint=json_str(source.get("entrypoint")),
            config_map=json_str(json_map(source.get("configMapRef")).get("name")),
            steps=json_int(spec.get("steps"), 1),
            weight=float(weight) if isinstance(weight, (int, float)) else 1.0,
            suspend=bool(spec.get("suspend", False)),
            created=parse_time(meta.get("creationTimestamp")),
            phase=json_str(status.get("phase")),
            steps_completed=json_int(status.get("stepsCompleted")),
            slice_names=json_str(status.get("sliceNames")),
            conditions=conditions_of(status),
            start_time=parse_time(status.get("startTime")),
            completion_time=parse_time(status.get("completionTime")),
            results_config_map=json_str(json_map(status.get("results")).get("configMap")),
            message=json_str(status.get("message")),
            reconciled=bool(status),
        )

    def virtual_slices(self) -> dict[str, str]:
        """Each slice name of the program -> the VirtualSlice it runs on.

        From ``status.sliceNames`` once the operator wrote it; before that, refs as given
        and inline slices by the operator's naming rule ``<program>-<slice name>``.
        """
        found: dict[str, str] = {}
        for pair in self.slice_names.split(","):
            key, sep, value = pair.partition("=")
            if sep and key.strip():
                found[key.strip()] = value.strip()
        for s in self.slices:
            found.setdefault(s.name, s.ref or f"{self.name}-{s.name}")
        return found

    @property
    def done(self) -> bool:
        return self.phase in TERMINAL_PROGRAM_PHASES


@dataclass(frozen=True)
class PodView:
    """A worker pod, as far as the CLI reports it."""

    namespace: str
    name: str
    slice: str = ""
    host_index: int | None = None
    node: str = ""
    pod_ip: str = ""
    phase: str = ""
    ready: bool = False
    restarts: int = 0
    containers: tuple[str, ...] = ()

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> PodView:
        meta, spec, status = json_map(raw.get("metadata")), json_map(raw.get("spec")), json_map(raw.get("status"))
        labels = json_map(meta.get("labels"))
        index = json_str(labels.get(HOST_INDEX_LABEL))
        statuses = [json_map(s) for s in json_list(status.get("containerStatuses"))]
        return cls(
            namespace=json_str(meta.get("namespace")),
            name=json_str(meta.get("name")),
            slice=json_str(labels.get(SLICE_LABEL)),
            host_index=int(index) if index.isdigit() else None,
            node=json_str(spec.get("nodeName")),
            pod_ip=json_str(status.get("podIP")),
            phase=json_str(status.get("phase")),
            ready=any(
                json_str(c.get("type")) == "Ready" and json_str(c.get("status")) == "True"
                for c in map(json_map, json_list(status.get("conditions")))
            ),
            restarts=sum(json_int(s.get("restartCount")) for s in statuses),
            containers=tuple(json_str(json_map(c).get("name")) for c in json_list(spec.get("containers"))),
        )


@dataclass(frozen=True)
class EventView:
    """A core/v1 Event about a slice or program ("Admitted on island-a", ...)."""

    type: str
    reason: str
    message: str
    count: int = 1
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    source: str = ""

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> EventView:
        meta, series = json_map(raw.get("metadata")), json_map(raw.get("series"))
        last = (
            parse_time(series.get("lastObservedTime"))
            or parse_time(raw.get("lastTimestamp"))
            or parse_time(raw.get("eventTime"))
            or parse_time(meta.get("creationTimestamp"))
        )
        return cls(
            type=json_str(raw.get("type")) or "Normal",
            reason=json_str(raw.get("reason")),
            message=json_str(raw.get("message")),
            count=max(json_int(raw.get("count"), 1), json_int(series.get("count"), 1)),
            first_seen=parse_time(raw.get("firstTimestamp")) or parse_time(raw.get("eventTime")) or last,
            last_seen=last,
            source=json_str(json_map(raw.get("source")).get("component")) or json_str(raw.get("reportingComponent")),
        )
