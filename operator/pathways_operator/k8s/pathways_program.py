"""A PathwaysProgram as the operator sees it: typed spec, typed status, and back.

The only module that knows the field names of ``PathwaysProgram`` (see
``crds/pathwaysprogram.yaml``). Each entry of ``spec.slices`` is either a
``ref`` to an existing VirtualSlice or a ``template`` from which the operator
creates VirtualSlice ``<program>-<slice name>``, owned by the program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from pathways_operator.core.object_names import inline_slice_name
from pathways_operator.core.phases import ProgramPhase
from pathways_operator.core.program_lifecycle import DEFAULT_BACKOFF_LIMIT
from pathways_operator.core.program_look import ProgramReport
from pathways_operator.core.reasons import Condition
from pathways_operator.k8s.cluster_api import Json
from pathways_wire.kube_names import API_VERSION, PROGRAM_KIND
from pathways_operator.k8s.virtual_slice import SliceSpec

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class ProgramSlice:
    """One entry of ``spec.slices``: exactly one of ``ref`` and ``template`` is set."""

    name: str
    ref: str | None
    template: SliceSpec | None


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
    """``spec.checkpoint``: snapshot the program's state every ``every_steps`` steps to ``volume``."""

    every_steps: int
    volume: str


@dataclasses.dataclass(frozen=True)
class DriverSpec:
    """``spec.driver``: the driver pod's image, command and pod settings (empty: the operator's defaults).

    The core/v1 parts (env, resources, tolerations) are passed through as the API server
    validated them against the CRD's schema.
    """

    image: str = ""
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[Json, ...] = ()
    resources: Json = dataclasses.field(default_factory=dict)
    service_account_name: str = ""
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[Json, ...] = ()

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> DriverSpec:
        return cls(
            image=str(raw.get("image") or ""),
            command=tuple(str(c) for c in raw.get("command") or ()),
            args=tuple(str(a) for a in raw.get("args") or ()),
            env=tuple(dict(e) for e in raw.get("env") or () if isinstance(e, Mapping)),
            resources=dict(raw.get("resources") or {}),
            service_account_name=str(raw.get("serviceAccountName") or ""),
            node_selector={str(k): str(v) for k, v in (raw.get("nodeSelector") or {}).items()},
            tolerations=tuple(dict(t) for t in raw.get("tolerations") or () if isinstance(t, Mapping)),
        )


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
    """``PathwaysProgram.spec`` with defaults applied."""

    slices: tuple[ProgramSlice, ...]
    entrypoint: str | None
    config_map: str | None
    args: Mapping[str, Any]
    steps: int = 1
    weight: float = 1.0
    suspend: bool = False
    priority_class: str = ""
    checkpoint: CheckpointSpec | None = None
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    active_deadline_s: int | None = None
    start_deadline_s: int | None = None
    driver: DriverSpec = DriverSpec()

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> ProgramSpec:
        slices = []
        for entry in raw.get("slices") or []:
            template = entry.get("template")
            slices.append(
                ProgramSlice(
                    name=str(entry.get("name") or ""),
                    ref=str(entry["ref"]) if entry.get("ref") else None,
                    template=SliceSpec.from_manifest(template) if isinstance(template, Mapping) else None,
                )
            )
        source = raw.get("source") or {}
        steps = raw.get("steps", 1)
        weight = raw.get("weight", 1.0)
        checkpoint = raw.get("checkpoint")
        every = checkpoint.get("everySteps") if isinstance(checkpoint, Mapping) else None
        return cls(
            slices=tuple(slices),
            entrypoint=str(source["entrypoint"]) if source.get("entrypoint") else None,
            config_map=str((source.get("configMapRef") or {}).get("name") or "") or None,
            args=dict(raw.get("args") or {}),
            steps=steps if isinstance(steps, int) and not isinstance(steps, bool) else 1,
            weight=float(weight) if isinstance(weight, (int, float)) else 1.0,
            suspend=bool(raw.get("suspend", False)),
            priority_class=str(raw.get("priorityClassName") or ""),
            checkpoint=CheckpointSpec(every, str(checkpoint.get("volume") or ""))
            if isinstance(checkpoint, Mapping) and isinstance(every, int) else None,
            backoff_limit=_int_or(raw.get("backoffLimit"), DEFAULT_BACKOFF_LIMIT),
            active_deadline_s=_int_or(raw.get("activeDeadlineSeconds"), None),
            start_deadline_s=_int_or(raw.get("startDeadlineSeconds"), None),
            driver=DriverSpec.from_manifest(raw.get("driver") or {}),
        )


@dataclasses.dataclass(frozen=True)
class ProgramStatus(ProgramReport):
    """``PathwaysProgram.status``, written once per reconcile: the program machine's report, and
    the generation it answers."""

    observed_generation: int = 0

    def to_manifest(self) -> Json:
        results: Json | None = None
        if self.results_config_map:
            results = {"configMap": self.results_config_map, "keys": list(self.results_keys)}
        return {
            "phase": str(self.phase) if self.phase is not None else None,
            "conditions": [c.to_manifest() for c in self.conditions],
            "sliceNames": self.slice_names,
            "stepsCompleted": self.steps_completed,
            "progress": self.progress,
            "startTime": self.start_time or None,
            "completionTime": self.completion_time or None,
            "results": results,
            "message": self.message,
            "observedGeneration": self.observed_generation,
            "restarts": self.restarts,
        }

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> ProgramStatus:
        phase_text = raw.get("phase")
        try:
            phase = ProgramPhase(phase_text) if phase_text else None
        except ValueError:
            phase = None
        results = raw.get("results") or {}
        steps = raw.get("stepsCompleted", 0)
        generation = raw.get("observedGeneration", 0)
        return cls(
            phase=phase,
            conditions=tuple(Condition.from_manifest(c) for c in raw.get("conditions") or []),
            slice_names=str(raw.get("sliceNames") or ""),
            steps_completed=steps if isinstance(steps, int) else 0,
            progress=str(raw.get("progress") or ""),
            start_time=str(raw.get("startTime") or ""),
            completion_time=str(raw.get("completionTime") or ""),
            results_config_map=str(results.get("configMap") or ""),
            results_keys=tuple(str(k) for k in results.get("keys") or []),
            message=str(raw.get("message") or ""),
            observed_generation=generation if isinstance(generation, int) else 0,
            restarts=_int_or(raw.get("restarts"), 0),
        )


@dataclasses.dataclass(frozen=True)
class ProgramObject:
    """A PathwaysProgram read from the API."""

    namespace: str
    name: str
    uid: str
    generation: int
    deleting: bool
    spec: ProgramSpec
    status: ProgramStatus
    created: str = ""
    """``metadata.creationTimestamp`` (RFC 3339)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> ProgramObject:
        meta = raw.get("metadata") or {}
        generation = meta.get("generation", 0)
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta["name"]),
            uid=str(meta.get("uid") or ""),
            generation=generation if isinstance(generation, int) else 0,
            deleting=bool(meta.get("deletionTimestamp")),
            spec=ProgramSpec.from_manifest(raw.get("spec") or {}),
            status=ProgramStatus.from_manifest(raw.get("status") or {}),
            created=str(meta.get("creationTimestamp") or ""),
        )

    def reference(self) -> Json:
        return {
            "apiVersion": API_VERSION,
            "kind": PROGRAM_KIND,
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }

    def owner_reference(self) -> Json:
        return {
            "apiVersion": API_VERSION,
            "kind": PROGRAM_KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def inline_slice_name(self, slice_name: str) -> str:
        """The VirtualSlice created for template ``slice_name``: ``<program>-<slice name>``."""
        return inline_slice_name(self.name, slice_name)


def _int_or(value: object, default: _T) -> int | _T:
    """An integer field of the manifest, or ``default`` when it is unset or not an integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default
