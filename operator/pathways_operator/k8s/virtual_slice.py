"""A VirtualSlice as the operator sees it: typed spec, typed status, and back.

The API server hands objects over as JSON. This module is the only place that
knows the field names of ``VirtualSlice`` (see ``crds/virtualslice.yaml``): it
parses an object into frozen dataclasses, applying the documented defaults, and
renders a :class:`SliceStatus` back into the ``status`` the CRD declares. The
reconciler in ``slices`` works with these types only.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from pathways_operator.core.phases import SlicePhase
from pathways_operator.core.reasons import Condition
from pathways_operator.core.slice_look import HostReport
from pathways_operator.k8s.cluster_api import Json
from pathways_wire.kube_names import (
    ADMISSION_GROUP_LABEL,
    ADMISSION_GROUP_SIZE_ANNOTATION,
    API_VERSION,
    SLICE_KIND,
)

DEFAULT_MAX_RESTARTS = 3


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def parse_timestamp(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp as the API writes it (0 if absent)."""
    if not text:
        return 0.0
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclasses.dataclass(frozen=True)
class SliceSpec:
    """``VirtualSlice.spec`` with defaults applied."""

    devices: int
    devices_per_host: int | None = None
    island: str | None = None
    image: str = ""
    resources: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    max_restarts: int = DEFAULT_MAX_RESTARTS
    suspend: bool = False
    priority_class: str = ""

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> SliceSpec:
        policy = raw.get("failurePolicy") or {}
        dph = raw.get("devicesPerHost")
        island = raw.get("island")
        return cls(
            devices=_int(raw.get("devices"), 0),
            devices_per_host=dph if isinstance(dph, int) and not isinstance(dph, bool) else None,
            island=str(island) if island else None,
            image=str(raw.get("image") or ""),
            resources=dict(raw.get("resources") or {}),
            max_restarts=_int(policy.get("maxRestarts"), DEFAULT_MAX_RESTARTS),
            suspend=bool(raw.get("suspend", False)),
            priority_class=str(raw.get("priorityClassName") or ""),
        )

    def to_manifest(self) -> Json:
        """The spec as written into a new VirtualSlice (fields left at their default are omitted)."""
        spec: Json = {"devices": self.devices}
        if self.devices_per_host is not None:
            spec["devicesPerHost"] = self.devices_per_host
        if self.island:
            spec["island"] = self.island
        if self.image:
            spec["image"] = self.image
        if self.resources:
            spec["resources"] = dict(self.resources)
        spec["failurePolicy"] = {"maxRestarts": self.max_restarts}
        if self.suspend:
            spec["suspend"] = True
        if self.priority_class:
            spec["priorityClassName"] = self.priority_class
        return spec


@dataclasses.dataclass(frozen=True)
class HostRecord(HostReport):
    """One entry of ``status.hosts``, as the API holds it."""

    def to_manifest(self) -> Json:
        return {
            "index": self.index,
            "pod": self.pod,
            "node": self.node,
            "podIP": self.pod_ip,
            "devices": self.devices,
        }

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> HostRecord:
        return cls(
            index=_int(raw.get("index"), 0),
            node=str(raw.get("node") or ""),
            devices=_int(raw.get("devices"), 0),
            pod=str(raw.get("pod") or ""),
            pod_ip=str(raw.get("podIP") or ""),
        )


@dataclasses.dataclass(frozen=True)
class SliceStatus:
    """``VirtualSlice.status``, written once per reconcile."""

    phase: SlicePhase | None = None
    conditions: tuple[Condition, ...] = ()
    island: str = ""
    hosts: tuple[HostRecord, ...] = ()
    restarts: int = 0
    ready_hosts: str = ""
    observed_generation: int = 0

    def to_manifest(self) -> Json:
        return {
            "phase": str(self.phase) if self.phase is not None else None,
            "conditions": [c.to_manifest() for c in self.conditions],
            "island": self.island,
            "hosts": [h.to_manifest() for h in self.hosts],
            "restarts": self.restarts,
            "readyHosts": self.ready_hosts,
            "observedGeneration": self.observed_generation,
        }

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> SliceStatus:
        phase_text = raw.get("phase")
        try:
            phase = SlicePhase(phase_text) if phase_text else None
        except ValueError:
            phase = None
        return cls(
            phase=phase,
            conditions=tuple(Condition.from_manifest(c) for c in raw.get("conditions") or []),
            island=str(raw.get("island") or ""),
            hosts=tuple(HostRecord.from_manifest(h) for h in raw.get("hosts") or []),
            restarts=_int(raw.get("restarts"), 0),
            ready_hosts=str(raw.get("readyHosts") or ""),
            observed_generation=_int(raw.get("observedGeneration"), 0),
        )


@dataclasses.dataclass(frozen=True)
class VirtualSliceObject:
    """A VirtualSlice read from the API: identity, spec and status."""

    namespace: str
    name: str
    uid: str
    generation: int
    created: float
    deleting: bool
    labels: Mapping[str, str]
    spec: SliceSpec
    status: SliceStatus
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def admission_group(self) -> str:
        """The admission group the slice is admitted with, whole or not at all ("": none)."""
        return self.labels.get(ADMISSION_GROUP_LABEL, "")

    def admission_group_size(self) -> int | str:
        """How many slices its admission group has; a message naming the annotation if unusable."""
        text = self.annotations.get(ADMISSION_GROUP_SIZE_ANNOTATION, "")
        if text.isdigit() and int(text) >= 1:
            return int(text)
        return (
            f"metadata.annotations[{ADMISSION_GROUP_SIZE_ANNOTATION!r}] is {text!r}: a VirtualSlice "
            f"labelled {ADMISSION_GROUP_LABEL}={self.admission_group} needs the number of slices "
            "in its admission group there, a positive integer such as \"2\""
        )

    @property
    def key(self) -> str:
        """``namespace/name``: how the controller and the admission queue know the slice."""
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> VirtualSliceObject:
        meta = raw.get("metadata") or {}
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta["name"]),
            uid=str(meta.get("uid") or ""),
            generation=_int(meta.get("generation"), 0),
            created=parse_timestamp(str(meta.get("creationTimestamp") or "")),
            deleting=bool(meta.get("deletionTimestamp")),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            spec=SliceSpec.from_manifest(raw.get("spec") or {}),
            status=SliceStatus.from_manifest(raw.get("status") or {}),
        )

    def reference(self) -> Json:
        """Enough of the object for an Event's involvedObject or an ownerReference."""
        return {
            "apiVersion": API_VERSION,
            "kind": SLICE_KIND,
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }

    def owner_reference(self) -> Json:
        return {
            "apiVersion": API_VERSION,
            "kind": SLICE_KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
