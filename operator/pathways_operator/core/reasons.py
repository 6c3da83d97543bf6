"""Condition types, reasons, and the one way conditions are updated.

Status conditions follow ``metav1.Condition`` as JobSet and Kueue use them: a
condition ``type`` names a question ("is the slice Admitted?"), ``status``
answers it, ``reason`` is a CamelCase constant a program can switch on, and
``message`` is the sentence for a human, naming the object, the numbers and
the fix. Every type and reason the operator writes is declared here so that
``kubectl wait --for=condition=Ready`` and alerting rules have a closed set to
match against.

:func:`set_condition` implements the metav1 rule that ``lastTransitionTime``
moves only when ``status`` changes, so a reconcile that re-asserts the same
answer with a fresher message does not look like a flap. The time is passed in;
nothing here reads a clock.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Literal


class SliceConditionType(enum.StrEnum):
    """Condition types of a VirtualSlice."""

    ADMITTED = "Admitted"
    """True once the gang has a placement on one island (devices reserved)."""
    READY = "Ready"
    """True while every host of the gang is running and the JAX job is formed."""
    DEGRADED = "Degraded"
    """True while the gang is being recreated after losing a host."""
    SUSPENDED = "Suspended"
    """True while ``spec.suspend`` holds the slice without pods."""


class ProgramConditionType(enum.StrEnum):
    """Condition types of a PathwaysProgram (as JobSet's Completed/Failed/Suspended)."""

    RUNNING = "Running"
    """True while steps are being dispatched."""
    SUCCEEDED = "Succeeded"
    """True once every step completed; terminal."""
    FAILED = "Failed"
    """True once the program can no longer succeed; terminal."""
    SUSPENDED = "Suspended"
    """True while ``spec.suspend`` holds the program."""


class Reason(enum.StrEnum):
    """``reason`` values of conditions and of placement/admission outcomes."""

    # Admission and placement (VirtualSlice Admitted).
    ADMITTED = "Admitted"
    """The whole gang was placed on one island."""
    INSUFFICIENT_DEVICES = "InsufficientDevices"
    """Not enough room on any one island now (free devices, or CPU/memory beside them); retried as room frees up."""
    INSUFFICIENT_RESOURCES = "InsufficientResources"
    """A host's CPU or memory requests exceed what the island's machines have allocatable, even when empty."""
    ISLAND_RESERVED = "IslandReserved"
    """It would fit, but the island is held for an older waiting gang (anti-starvation)."""
    EXCEEDS_ISLAND = "ExceedsIsland"
    """More devices, or bigger hosts, than any island has even when empty."""
    INDIVISIBLE_DEVICES = "IndivisibleDevices"
    """``devices`` is not a multiple of the host size on any island that is big enough."""
    NO_ISLAND = "NoIsland"
    """No machine is labelled with the requested island (or with any island)."""
    INVALID_SPEC = "InvalidSpec"
    """The spec contradicts itself in a way the CRD schema cannot express."""
    # Gang life cycle (VirtualSlice Ready / Degraded).
    GANG_LAUNCHING = "GangLaunching"
    """Pods are created and bound; waiting for every host to start."""
    GANG_READY = "GangReady"
    """Every host is up."""
    GANG_RECREATED = "GangRecreated"
    """A host was lost and the whole gang was recreated (counts against maxRestarts)."""
    RESTARTS_EXHAUSTED = "RestartsExhausted"
    """A host was lost after ``failurePolicy.maxRestarts`` recreations."""
    SUSPENDED = "Suspended"
    """``spec.suspend`` is true."""
    PREEMPTED = "Preempted"
    """The gang was evicted to make room for a slice of higher priority; it is queued again."""
    PRIORITY_CLASS_NOT_FOUND = "PriorityClassNotFound"
    """``spec.priorityClassName`` names no PriorityClass; the slice waits until one exists."""
    PRIORITY_CLASS_NOT_ALLOWED = "PriorityClassNotAllowed"
    """``spec.priorityClassName`` is a ``system-`` class the operator is not allowed to hand out; terminal."""
    POD_REFUSED = "PodRefused"
    """The API server refused a pod of the gang (ResourceQuota, admission policy); the gang was
    torn down and is placed again after a back-off."""
    ADMISSION_GROUP_INCOMPLETE = "AdmissionGroupIncomplete"
    """Some slices of the slice's admission group do not exist yet; none is admitted before all are."""
    ADMISSION_GROUP_WAITING = "AdmissionGroupWaiting"
    """The slice would fit, but another slice of its admission group does not: none is admitted."""
    INSUFFICIENT_DRIVER_RESOURCES = "InsufficientDriverResources"
    """The slices would fit, but their program's driver pod fits no Node's free CPU and memory: none is admitted."""
    OBJECT_NOT_OWNED = "ObjectNotOwned"
    """An object the slice needs (its token Secret, its host NetworkPolicy, a pod name) exists and is
    not the slice's own."""
    HOST_POLICY_FORBIDDEN = "HostPolicyForbidden"
    """The operator makes host NetworkPolicies (``--host-network-policy=on``) but may not create the
    slice's: no host starts without it."""
    # Programs.
    WAITING_FOR_SLICES = "WaitingForSlices"
    """A slice the program uses is not Ready yet."""
    SLICE_NOT_FOUND = "SliceNotFound"
    """``spec.slices[].ref`` names a VirtualSlice that does not exist (yet); the program waits."""
    SLICE_FAILED = "SliceFailed"
    """A slice the program uses reached phase Failed."""
    INVALID_PROGRAM = "InvalidProgram"
    """The program's dataflow graph is invalid (cycle, unknown node or slice)."""
    STEPS_RUNNING = "StepsRunning"
    """Steps are being dispatched."""
    STEPS_COMPLETED = "StepsCompleted"
    """Every step completed."""
    COMPUTATION_FAILED = "ComputationFailed"
    """The program failed: it raised, exited on its own, or returned results that cannot be
    stored; the message carries the driver's error and the tail of its log."""
    HOST_LOST = "HostLost"
    """The driver lost a host (or a slice was recreated under it); it runs again from its last step."""
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    """The driver lost a host more times than ``spec.backoffLimit`` allows."""
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    """The program ran longer than ``spec.activeDeadlineSeconds``; it was stopped."""
    START_DEADLINE_EXCEEDED = "StartDeadlineExceeded"
    """The program did not start within ``spec.startDeadlineSeconds`` of its creation."""
    RESULTS_NOT_STORED = "ResultsNotStored"
    """The results ConfigMap could not be written: the API server refused it, or a
    ConfigMap of that name exists that the program does not own."""


WARNING_REASONS = frozenset({
    Reason.EXCEEDS_ISLAND,
    Reason.INDIVISIBLE_DEVICES,
    Reason.NO_ISLAND,
    Reason.INVALID_SPEC,
    Reason.RESTARTS_EXHAUSTED,
    Reason.GANG_RECREATED,
    Reason.PREEMPTED,
    Reason.PRIORITY_CLASS_NOT_FOUND,
    Reason.SLICE_NOT_FOUND,
    Reason.SLICE_FAILED,
    Reason.INVALID_PROGRAM,
    Reason.COMPUTATION_FAILED,
    Reason.HOST_LOST,
    Reason.BACKOFF_LIMIT_EXCEEDED,
    Reason.DEADLINE_EXCEEDED,
    Reason.START_DEADLINE_EXCEEDED,
    Reason.RESULTS_NOT_STORED,
})
"""Reasons that report a problem: their Events are ``Warning``, every other reason's ``Normal``."""


def event_type(reason: Reason) -> Literal["Warning", "Normal"]:
    """The core/v1 Event type for ``reason``: Warning for problems (as kubelet and Job do)."""
    return "Warning" if reason in WARNING_REASONS else "Normal"


ConditionStatus = Literal["True", "False", "Unknown"]

_STATUSES: Mapping[str, ConditionStatus] = {"True": "True", "False": "False", "Unknown": "Unknown"}


@dataclasses.dataclass(frozen=True)
class Condition:
    """One entry of ``status.conditions``, metav1.Condition in Python.

    ``last_transition_time`` is an RFC 3339 string as the API server stores it;
    leave it empty when building a new condition and let :func:`set_condition`
    decide whether it takes ``now`` or keeps the previous one.
    """

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""
    observed_generation: int = 0
    last_transition_time: str = ""

    def to_manifest(self) -> dict[str, object]:
        """The camelCase form written into ``status.conditions``."""
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "observedGeneration": self.observed_generation,
            "lastTransitionTime": self.last_transition_time,
        }

    @classmethod
    def from_manifest(cls, raw: Mapping[str, object]) -> Condition:
        """Read one entry of ``status.conditions`` back; missing fields take defaults."""
        raw_status = str(raw.get("status", "Unknown"))
        status = _STATUSES.get(raw_status)
        if status is None:
            raise ValueError(
                f"condition {raw.get('type')!r} has status {raw_status!r}; "
                "expected True, False or Unknown"
            )
        generation = raw.get("observedGeneration", 0)
        return cls(
            type=str(raw["type"]),
            status=status,
            reason=str(raw.get("reason", "")),
            message=str(raw.get("message", "")),
            observed_generation=generation if isinstance(generation, int) else 0,
            last_transition_time=str(raw.get("lastTransitionTime", "")),
        )


def set_condition(conditions: Iterable[Condition], new: Condition, now: str) -> list[Condition]:
    """Return ``conditions`` with ``new`` in place of the entry of the same type.

    ``lastTransitionTime`` becomes ``now`` when the condition is new or its
    status changed, and is kept otherwise (metav1 semantics); reason, message
    and observedGeneration always take the new values. Order is kept and a new
    type is appended, so the written list is stable between reconciles.
    """
    result: list[Condition] = []
    replaced = False
    for existing in conditions:
        if existing.type != new.type:
            result.append(existing)
            continue
        if replaced:
            continue  # a duplicate type in stored status: keep only the first
        replaced = True
        keep = existing.status == new.status and existing.last_transition_time
        when = existing.last_transition_time if keep else now
        result.append(dataclasses.replace(new, last_transition_time=when))
    if not replaced:
        result.append(dataclasses.replace(new, last_transition_time=now))
    return result


def find_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The condition of ``type_``, or None when it was never set."""
    return next((c for c in conditions if c.type == type_), None)


def is_condition_true(conditions: Iterable[Condition], type_: str) -> bool:
    """True only when the condition exists with status "True"."""
    found = find_condition(conditions, type_)
    return found is not None and found.status == "True"
