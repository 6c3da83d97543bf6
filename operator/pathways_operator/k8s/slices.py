"""The resource manager: each VirtualSlice becomes a gang of worker pods on one island.

:meth:`SliceReconciler.reconcile` is level-based: it reads the slice and its
pods from the API, compares them with what the slice should be, acts, and
writes ``status`` once. It runs again and again (a kopf daemon per slice, woken
early by pod events), so it must be idempotent: after an operator restart the
same reads lead to the same decisions, no pod is created twice and none is
orphaned.

A slice goes through the phases declared in ``core.phases``:

Pending
    queued for devices. The *admission pass* (:meth:`SliceReconciler._admit`)
    takes every queued slice, the machines from ``inventory`` and calls
    ``core.admission.admit``, so a gang is placed on one island as a whole, or
    not at all, before any of its pods exists; a slice that does not fit says
    why (``Admitted=False``, the core's reason and message). Slices labelled
    with one ``pathways.dev/admission-group`` (a program's inline slices) are
    admitted together or not at all. Admitted placements go into the
    reservation ledger, which keeps their devices counted as used until the
    pods exist and hold them.
Launching
    pods are created and bound by the operator itself (``schedulerName:
    pathways``, the Binding API), host 0 first; the others once host 0 has a
    pod IP, which they need as JAX coordinator address.
Ready
    every pod runs and is ready and every sidecar answers ``Dataflow.Health``
    with ``worker_ready``; then, and only then, the gang is registered with the
    controller (the island scheduler) so programs can use it.
Preemption
    a slice left waiting for devices asks ``core.preemption.choose_victims``
    whether evicting running gangs of strictly lower priority (its
    ``priorityClassName``'s value, read from the scheduling API) makes room on
    one island. Each victim, at its next look, has its pods deleted and goes
    back to Pending with ``Admitted=False, reason=Preempted`` and an Event
    naming the preemptor; it is queued like any other slice and comes back
    when room returns (its programs continue from their last checkpoint).
    Pods still terminating count as freed for this decision only, so one
    preemptor never evicts more than it needs while its victims drain.
Recovering
    a pod of the gang failed or was deleted, or the Node under it was (its
    pods are then deleted at once: no kubelet is left to confirm). The whole
    gang is torn down (``restarts`` + 1, the controller told with
    ``gang_lost``) and, once its
    pods are gone, queued again for a fresh placement — JobSet's "recreate",
    since a JAX job cannot take a replacement process. After
    ``failurePolicy.maxRestarts`` recreations the slice is Failed instead.

Where the truth lives, so that a restart loses nothing and a forged
``status`` changes nothing: pods carry their generation (the restart count at
creation) and the whole placement (annotation); the *slice record* (restarts,
and why the slice failed for good) is kept in the operator's annotations on the
VirtualSlice (``pathways.dev/restarts``, ``pathways.dev/failure``). Each reconcile starts from the phase ``core.slice_phase`` derives from
these, never from ``status``, which is only written (and read back only to keep
conditions' transition times and to post Events on changes). The reservation
ledger is a cache, rebuilt from pods on first use.

Ownership: each slice's token (the credential its hosts demand) lives in a
Secret the slice controls, created before it is admitted. The operator acts
only on objects whose controller ownerReference is the slice's uid
(``core.ownership``): a Secret or pod that merely bears the slice's name or
label is never used, adopted or deleted; the slice waits out of the admission
queue, ``Admitted=False, reason=ObjectNotOwned``, naming the object.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb
from pathways_wire.slice_token import new_token
from pathways_wire.wording import fraction, plural
from pathways_operator.core.admission import QueuedGang, admit
from pathways_operator.core.admission_policy import priority_class_refusal, refused_backoff
from pathways_operator.core.object_names import slice_name_problem
from pathways_operator.core.ownership import Ownership, describe_controller, owner_refs, ownership
from pathways_operator.core.phases import SlicePhase, check_transition
from pathways_operator.core.placement import (
    GangRequest,
    HostAssignment,
    HostResources,
    Machine,
    Placement,
    Unplaceable,
)
from pathways_operator.core.preemption import RunningGang, choose_victims
from pathways_operator.core.reasons import (
    Condition,
    ConditionStatus,
    Reason,
    SliceConditionType,
    event_type,
    find_condition,
    is_condition_true,
    set_condition,
)
from pathways_operator.core.slice_phase import (
    SliceObservation,
    SliceRecord,
    current_generation,
    observed_phase,
    parse_record,
)
from pathways_operator.k8s import inventory
from pathways_operator.k8s.cluster_api import AlreadyExists, ClusterApi, Json, KubeError, now_rfc3339
from pathways_operator.k8s.gang_pods import (
    TOKEN_KEY,
    PodView,
    WorkerDefaults,
    host_name,
    host_pod_manifest,
    host_resources,
    placement_from_json,
    pod_name,
    token_secret_manifest,
    token_secret_name,
)
from pathways_operator.k8s.inventory import Reservation, ReservationLedger
from pathways_operator.k8s.metrics import OperatorMetrics
from pathways_operator.k8s.resources import (
    FAILURE_ANNOTATION,
    RESTARTS_ANNOTATION,
    SIDECAR_PORT,
    SLICE_KIND,
    SLICE_LABEL,
)
from pathways_operator.k8s.sidecar_health import unready_hosts
from pathways_operator.k8s.virtual_slice import HostRecord, SliceStatus, VirtualSliceObject

log = logging.getLogger(__name__)

# Seconds until the next look, by what the slice is waiting for. Pod events
# wake a slice earlier; these bound how long a missed event can delay it.
_SOON = 0.5
_QUEUED = 1.0
_STEADY = 2.0
_IDLE = 10.0

_S = SlicePhase
_C = SliceConditionType

_REFUSED_STATUSES = frozenset({400, 403, 422})
"""HTTP statuses of a pod creation the API server refused on its merits (quota, policy, validation)."""


class _PodRefused(Exception):
    """Creating a pod of the gang was refused by the API server; carries its answer."""

    def __init__(self, error: KubeError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclasses.dataclass(frozen=True)
class GangHost:
    """A host as the controller sees it: a name for messages, an address to stream to."""

    name: str
    sidecar_address: str


class GangRegistry(Protocol):
    """What the resource manager tells the island scheduler (``pathways_operator.controller``)."""

    def register_gang(
        self, key: str, decl: ir.SliceDecl, placement: Placement, hosts: Sequence[GangHost],
        token: str = "",
    ) -> None: ...

    def gang_lost(self, key: str, reason: str) -> None: ...

    def unregister_gang(self, key: str) -> None: ...

    def describe(self) -> pb.ClusterInfo: ...


@dataclasses.dataclass(frozen=True)
class _SliceSecret:
    """The slice's own token Secret: the hosts' credential."""

    uid: str
    token: str


@dataclasses.dataclass(frozen=True)
class _InTheWay:
    """An object the slice needs is not its own (or not usable yet); the message says which and what to do."""

    message: str
    warning: bool = False
    """True when a person must act (a Warning Event); False while it resolves by itself."""


class _PodInTheWay(Exception):
    """Creating a host pod found a pod of that name that the slice does not control."""

    def __init__(self, pod: str, why: _InTheWay) -> None:
        super().__init__(why.message)
        self.pod = pod
        self.why = why


@dataclasses.dataclass
class _Outcome:
    """What one reconcile decided: the status to write and the events to record."""

    phase: SlicePhase
    conditions: list[Condition]
    restarts: int
    island: str = ""
    hosts: tuple[HostRecord, ...] = ()
    ready_hosts: str = ""
    events: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    delay: float = _QUEUED


class SliceReconciler:
    """Places, launches, watches and recreates the gangs of every VirtualSlice in scope."""

    def __init__(
        self,
        api: ClusterApi,
        registry: GangRegistry,
        *,
        defaults: WorkerDefaults = WorkerDefaults(),
        wake: Callable[[str], None] = lambda key: None,
        clock: Callable[[], float] = time.time,
        metrics: OperatorMetrics | None = None,
        allow_system_priority_classes: bool = False,
    ) -> None:
        self._api = api
        self._registry = registry
        self._defaults = defaults
        self._wake = wake
        self._clock = clock
        self._ledger = ReservationLedger()
        self._admission_lock = threading.Lock()
        self._slice_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._registered: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._secrets: dict[str, _SliceSecret] = {}
        """Slice key -> its token Secret, as last read or written."""
        self._blocked: dict[str, str] = {}
        """Slice key -> the object in its way (kept out of the admission queue until it is gone)."""
        self._pod_conflicts: dict[str, str] = {}
        """Slice key -> the name of a pod, not the slice's own, that took one of its pod names."""
        self._seen: dict[str, tuple[Reservation, frozenset[int]]] = {}
        """Slice key -> host indices whose pods this process has seen for its current reservation."""
        self._summaries: dict[str, str] = {}
        self._machines: list[Machine] = []
        self._priorities: dict[str, int] = {}
        self._metrics = metrics or OperatorMetrics()
        self._queued_since: dict[str, float] = {}
        self._evicting: dict[str, str] = {}
        """Victim slice key -> why it is preempted (naming the preemptor), until its next look."""
        self._drained: dict[str, int] = {}
        """Preempted slice key -> generation whose terminating pods must not be adopted again."""
        self._allow_system_priority = allow_system_priority_classes
        self._refusals: dict[str, tuple[int, float, Unplaceable]] = {}
        """Slice key -> (pod refusals in a row, when it may be placed again, why) after the API refused a pod."""

    # ------------------------------------------------------------ queries

    def machines(self) -> list[Machine]:
        """The inventory of the last admission pass (for the controller's Describe)."""
        return list(self._machines)

    def explain(self, key: str) -> str:
        """Why the slice ``namespace/name`` is not usable, from its last reconcile."""
        return self._summaries.get(key) or f"no VirtualSlice {key} has been seen by the operator"

    # ------------------------------------------------------------ reconcile

    def _lock_for(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._slice_locks.setdefault(key, threading.Lock())

    def reconcile(self, namespace: str, name: str) -> float:
        """Bring one slice one step closer to its spec; returns seconds until it wants another look."""
        key = f"{namespace}/{name}"
        with self._lock_for(key):
            raw = self._api.get_slice(namespace, name)
            if raw is None:
                return _IDLE
            vslice = VirtualSliceObject.from_manifest(raw)
            if vslice.deleting:
                return _IDLE  # the deletion handler tears the gang down
            problem = slice_name_problem(vslice.name)
            if problem is not None:  # stored before the CRD refused it: no label can select its pods
                self._write_status(vslice, self._refused(vslice, problem))
                return _IDLE
            pods = self._pods_of(vslice)
            outcome = self._decide(vslice, pods)
            self._write_status(vslice, outcome)
            return outcome.delay

    def deleted(self, namespace: str, name: str, uid: str) -> None:
        """The slice ``uid`` is being deleted: tell the controller, free its devices, remove its objects.

        Only objects this slice controls are deleted (its Secret, its pods); a Secret
        or pod that merely has the slice's name or label is someone else's and stays.
        """
        key = f"{namespace}/{name}"
        with self._lock_for(key):
            self._registry.unregister_gang(key)
            self._registered.pop(key, None)
            self._ledger.release(key)
            for state in (self._summaries, self._queued_since, self._drained, self._refusals, self._secrets,
                          self._blocked, self._pod_conflicts, self._seen):
                state.pop(key, None)
            self._metrics.slice_phase(key, None)
            secret_name = token_secret_name(name)
            secret = self._api.get_secret(namespace, secret_name)
            if secret is not None:
                meta = secret["metadata"]
                refs = owner_refs(meta)
                if ownership(refs, kind=SLICE_KIND, name=name, uid=uid) is Ownership.OWNED:
                    self._api.delete_secret(namespace, secret_name, str(meta.get("uid") or ""))
                else:
                    log.info("%s: leaving Secret %s alone: it is not this VirtualSlice's (%s)",
                             key, secret_name, describe_controller(refs))
            for raw in self._api.list_pods(namespace, f"{SLICE_LABEL}={name}"):
                pod = PodView.from_manifest(raw)
                if pod.controller_uid == uid and not pod.deleting:
                    self._api.delete_pod(namespace, pod.name, pod.uid)
        with self._locks_guard:
            self._slice_locks.pop(key, None)

    def _refused(self, vslice: VirtualSliceObject, problem: str) -> _Outcome:
        """Failed for a spec the operator cannot serve; nothing was created for it."""
        status = vslice.status
        outcome = _Outcome(phase=status.phase or _S.PENDING, conditions=list(status.conditions),
                           restarts=status.restarts, delay=_IDLE)
        if outcome.phase is not _S.FAILED:
            self._move(vslice, outcome, _S.FAILED)
            self._condition(vslice, outcome, _C.ADMITTED, "False", Reason.INVALID_SPEC, problem)
            self._condition(vslice, outcome, _C.READY, "False", Reason.INVALID_SPEC, problem)
            outcome.events.append(("Warning", str(Reason.INVALID_SPEC), problem))
        return outcome

    def _pods_of(self, vslice: VirtualSliceObject) -> list[PodView]:
        """The slice's pods: labelled with its name and controlled by this incarnation of it."""
        raw = self._api.list_pods(vslice.namespace, f"{SLICE_LABEL}={vslice.name}")
        return [p for p in map(PodView.from_manifest, raw) if p.controller_uid == vslice.uid]

    def _decide(self, vslice: VirtualSliceObject, pods: list[PodView]) -> _Outcome:
        key = vslice.key
        secret = self._secret(vslice)
        record = _record(vslice)
        generation = current_generation(record.restarts, ((p.generation or 0, p.deleting) for p in pods))
        failure = record.failure
        reservation = None if failure else self._reservation(vslice, pods, generation)
        current = {
            p.host_index: p
            for p in pods
            if p.generation == generation and p.host_index is not None and reservation is not None
        }
        strays = [p for p in pods if p.host_index not in current or current[p.host_index] is not p]
        registered = self._registered.get(key)
        observed = SliceObservation(
            failure=failure,
            suspended=vslice.spec.suspend,
            placed=reservation is not None,
            hosts=len(reservation.placement.hosts) if reservation is not None else 0,
            pods=len(current),
            registered=registered is not None and registered[0] == generation,
            draining=bool(strays),
            preempted=self._drained.get(key) == generation,
        )
        outcome = _Outcome(
            phase=observed_phase(observed),
            conditions=list(vslice.status.conditions),
            restarts=generation,
        )
        if outcome.phase is _S.FAILED:
            return self._failed_for_good(vslice, pods, outcome, failure)
        if vslice.spec.suspend:
            return self._suspend(vslice, pods, outcome)
        evicted = self._evicting.pop(key, None)
        if evicted is not None and outcome.phase in (_S.LAUNCHING, _S.READY):
            return self._preempted(vslice, pods, outcome, evicted)
        if is_condition_true(outcome.conditions, _C.SUSPENDED):
            self._condition(vslice, outcome, _C.SUSPENDED, "False", Reason.SUSPENDED,
                            "spec.suspend is false; the slice is queued for devices again")

        self._teardown(vslice, strays)

        if reservation is not None:
            loss = self._loss(vslice, reservation, current)
            if loss:
                return self._recreate(vslice, list(current.values()), outcome, loss)
            return self._launch(vslice, reservation, current, outcome)

        if strays:
            outcome.delay = _SOON
            self._summaries[key] = (
                f"VirtualSlice {key} is {outcome.phase}: waiting for "
                f"{plural(len(strays), 'pod')} of its previous gang to terminate"
            )
            return outcome
        in_the_way = secret if isinstance(secret, _InTheWay) else self._pod_in_the_way(vslice)
        if in_the_way is not None:
            return self._not_owned(vslice, outcome, in_the_way)
        self._blocked.pop(key, None)
        placed = self._admit(vslice, generation)
        if isinstance(placed, Reservation):
            return self._launch(vslice, placed, {}, outcome)
        return self._queued(vslice, placed, outcome)

    # ------------------------------------------------------------ ownership and the slice record

    def _secret(self, vslice: VirtualSliceObject) -> _SliceSecret | _InTheWay:
        """The slice's token Secret (made first if missing), or what is in its way.

        The Secret is used only if this slice controls it: one of that name that is
        someone else's is neither adopted nor changed, and the slice says so.
        """
        cached = self._secrets.get(vslice.key)
        if cached is not None:
            return cached
        namespace, name = vslice.namespace, token_secret_name(vslice.name)
        secret = self._api.get_secret(namespace, name)
        if secret is None:
            try:
                secret = self._api.create_secret(namespace, token_secret_manifest(vslice, new_token()))
            except AlreadyExists:
                return _InTheWay(f"Secret {namespace}/{name} appeared while creating it; looking again")
            log.info("%s: created Secret %s with the slice token", vslice.key, name)
        meta = secret["metadata"]
        refs = owner_refs(meta)
        owner = ownership(refs, kind=SLICE_KIND, name=vslice.name, uid=vslice.uid)
        if owner is Ownership.EARLIER:
            return _InTheWay(
                f"Secret {namespace}/{name} belongs to an earlier VirtualSlice {vslice.name} that was "
                "deleted; waiting for the garbage collector to delete it"
            )
        if owner is Ownership.FOREIGN:
            return _InTheWay(
                f"Secret {namespace}/{name} exists and is not this VirtualSlice's "
                f"({describe_controller(refs)}); the operator neither uses nor deletes a Secret it does "
                "not control: delete or rename that Secret, or give the VirtualSlice another name",
                warning=True,
            )
        raw = (secret.get("data") or {}).get(TOKEN_KEY, "")
        token = base64.b64decode(raw).decode() if raw else ""
        if not token:
            return _InTheWay(
                f"Secret {namespace}/{name} has no data.{TOKEN_KEY}; delete it and the operator makes a new one",
                warning=True,
            )
        found = _SliceSecret(uid=str(meta.get("uid") or ""), token=token)
        self._secrets[vslice.key] = found
        return found

    def _save_record(self, vslice: VirtualSliceObject, record: SliceRecord) -> None:
        """Keep ``record`` in the slice's annotations, where a restarted operator finds it."""
        try:
            self._api.annotate_slice(
                vslice.namespace, vslice.name, vslice.uid,
                {RESTARTS_ANNOTATION: str(record.restarts), FAILURE_ANNOTATION: record.failure or None},
            )
        except KubeError as err:
            if err.status not in (404, 409, 422):
                raise
            log.info("%s: the slice was deleted or replaced; its record (%s) is not kept: %s",
                     vslice.key, record, err)

    def _pod_in_the_way(self, vslice: VirtualSliceObject) -> _InTheWay | None:
        """The pod, not this slice's, that took one of its pod names, while it is still there."""
        name = self._pod_conflicts.get(vslice.key)
        if name is None:
            return None
        found = self._api.get_pod(vslice.namespace, name)
        if found is None or self._pod_ownership(vslice, found) is not Ownership.FOREIGN:
            self._pod_conflicts.pop(vslice.key, None)
            return None
        return _foreign_pod(vslice, name, found)

    @staticmethod
    def _pod_ownership(vslice: VirtualSliceObject, pod: Json) -> Ownership:
        return ownership(owner_refs(pod.get("metadata") or {}), kind=SLICE_KIND, name=vslice.name, uid=vslice.uid)

    def _not_owned(self, vslice: VirtualSliceObject, outcome: _Outcome, why: _InTheWay) -> _Outcome:
        """Wait, out of the admission queue, for an object in the slice's way to go; say which."""
        self._blocked[vslice.key] = why.message
        self._move(vslice, outcome, _S.PENDING)
        previous = find_condition(outcome.conditions, _C.ADMITTED)
        if previous is None or (previous.reason, previous.message) != (str(Reason.OBJECT_NOT_OWNED), why.message):
            kind = "Warning" if why.warning else "Normal"
            outcome.events.append((kind, str(Reason.OBJECT_NOT_OWNED), why.message))
        self._condition(vslice, outcome, _C.ADMITTED, "False", Reason.OBJECT_NOT_OWNED, why.message)
        self._condition(vslice, outcome, _C.READY, "False", Reason.OBJECT_NOT_OWNED,
                        "the gang is not placed; see the Admitted condition")
        outcome.island, outcome.hosts, outcome.ready_hosts = "", (), ""
        outcome.delay = _STEADY
        self._summaries[vslice.key] = f"VirtualSlice {vslice.key} is {outcome.phase}: {why.message}"
        return outcome

    def _failed_for_good(
        self, vslice: VirtualSliceObject, pods: Sequence[PodView], outcome: _Outcome, failure: str
    ) -> _Outcome:
        """A slice whose record says it failed: no pods, no devices, and a status that says why."""
        if self._registered.pop(vslice.key, None) is not None:
            self._registry.gang_lost(vslice.key, failure)
        self._ledger.release(vslice.key)
        self._teardown(vslice, pods)
        self._condition(vslice, outcome, _C.READY, "False", Reason.RESTARTS_EXHAUSTED, failure)
        self._condition(vslice, outcome, _C.DEGRADED, "True", Reason.RESTARTS_EXHAUSTED, failure)
        outcome.delay = _IDLE
        self._summaries[vslice.key] = f"VirtualSlice {vslice.key} is Failed: {failure}"
        return outcome

    # ------------------------------------------------------------ admission

    def _reservation(
        self, vslice: VirtualSliceObject, pods: Sequence[PodView], generation: int
    ) -> Reservation | None:
        """The slice's admitted placement for this generation: the ledger's, else its pods' annotation."""
        held = self._ledger.get(vslice.key)
        if held is not None and held.generation == generation:
            return held
        if held is not None:
            self._ledger.release(vslice.key)
        if self._drained.get(vslice.key) == generation:
            return None  # preempted: its old pods are going, it waits for a new placement
        recovered = _recorded_reservation(vslice, pods, generation)
        return None if recovered is None else self._ledger.adopt(recovered)

    def _host_size(self, vslice: VirtualSliceObject) -> int | None:
        return vslice.spec.devices_per_host or self._defaults.devices_per_host or None

    def _priority(self, name: str) -> int:
        """The PriorityClass's value (0 for none, for a class that does not exist yet, or one refused)."""
        if priority_class_refusal(name, allow_system=self._allow_system_priority):
            return 0
        found = self._priority_or_none(name)
        return 0 if found is None else found

    def _priority_or_none(self, name: str) -> int | None:
        if not name:
            return 0
        if name not in self._priorities:
            value = self._api.priority_value(name)
            if value is None:
                return None  # not cached: it may be created later
            self._priorities[name] = value
        return self._priorities[name]

    def _admit(self, vslice: VirtualSliceObject, generation: int) -> Reservation | Unplaceable:
        """One admission pass over every queued slice; returns this slice's outcome.

        Slices of one admission group are admitted together or not at all
        (``core.admission``); ``holding`` tells the core which of a group's slices
        already hold devices.
        """
        with self._admission_lock:
            held = self._ledger.get(vslice.key)
            if held is not None:
                return held
            size = vslice.admission_group_size() if vslice.admission_group else 1
            if isinstance(size, str):
                return Unplaceable(vslice.key, Reason.INVALID_SPEC, size)
            wanted = vslice.spec.priority_class
            refused = priority_class_refusal(wanted, allow_system=self._allow_system_priority)
            if refused:
                return Unplaceable(vslice.key, Reason.PRIORITY_CLASS_NOT_ALLOWED, refused)
            try:
                needs = host_resources(vslice, self._defaults)
            except ValueError as err:
                return Unplaceable(vslice.key, Reason.INVALID_SPEC, f"VirtualSlice {vslice.key}: {err}")
            backing_off = self._backing_off(vslice.key)
            if backing_off is not None:
                return backing_off
            if wanted and self._priority_or_none(wanted) is None:
                return Unplaceable(
                    vslice.key, Reason.PRIORITY_CLASS_NOT_FOUND,
                    f"spec.priorityClassName {wanted!r}: no PriorityClass of that name exists; create "
                    f"it (kubectl create priorityclass {wanted} --value=N) or remove the field",
                )
            slices = [VirtualSliceObject.from_manifest(s) for s in self._api.list_slices()]
            all_pods = [PodView.from_manifest(p) for p in self._api.list_pods(None)]
            nodes = self._api.list_nodes()
            owned: dict[str, list[PodView]] = {}
            uids = {s.uid: s.key for s in slices}
            for pod in all_pods:
                if pod.controller_uid in uids:
                    owned.setdefault(uids[pod.controller_uid], []).append(pod)
            alive = {s.key for s in slices if not s.deleting}
            for stale in self._ledger.all():
                if stale.key not in alive:
                    self._ledger.release(stale.key)  # deleted: its pods, if any, still count
            queue: list[QueuedGang] = []
            generations: dict[str, int] = {}
            for other in slices:
                if other.deleting:
                    continue
                mine = owned.get(other.key, [])
                other_generation = (
                    generation if other.key == vslice.key
                    else current_generation(_record(other).restarts, ((p.generation or 0, p.deleting) for p in mine))
                )
                if self._ledger.get(other.key) is None and self._drained.get(other.key) != other_generation:
                    recorded = _recorded_reservation(other, mine, other_generation)
                    if recorded is not None:
                        self._ledger.adopt(recorded)
                        continue
                if other.key != vslice.key and not self._wants_devices(other, mine):
                    continue
                if self._ledger.get(other.key) is not None:
                    continue
                other_needs = needs if other.key == vslice.key else self._admissible_needs(other)
                if other_needs is None:
                    continue  # refused or backing off: it says so at its own reconcile
                gang = self._queued_gang(other, other_needs)
                if gang is None:
                    continue  # its own look reports what is wrong
                generations[other.key] = other_generation
                queue.append(gang)
            if vslice.key not in generations:
                own = self._queued_gang(vslice, needs)
                if own is None:  # its admission group size was read above; it cannot change here
                    raise AssertionError(f"admission pass lost slice {vslice.key}")
                generations[vslice.key] = generation
                queue.append(own)
            holding: dict[str, int] = {}
            for other in slices:
                group = other.admission_group
                if group and not other.deleting and (self._ledger.get(other.key) or owned.get(other.key)):
                    holding[group] = holding.get(group, 0) + 1
            machines = inventory.machines(nodes, all_pods, self._ledger.all())
            self._machines = machines
            result = admit(queue, machines, now=self._clock(), holding=holding)
            mine_result: Reservation | Unplaceable | None = None
            now = self._clock()
            created = {s.key: s.created for s in slices}
            for placement in result.admitted:
                namespace, _, name = placement.slice.partition("/")
                reservation = Reservation(namespace, name, generations[placement.slice], placement)
                self._ledger.reserve(reservation)
                self._drained.pop(placement.slice, None)
                since = self._queued_since.pop(placement.slice, created.get(placement.slice, now))
                self._metrics.admission_wait.observe(max(0.0, now - since))
                if placement.slice == vslice.key:
                    mine_result = reservation
                else:
                    self._wake(placement.slice)
            by_island: dict[str, int] = {}
            for waiting in result.waiting:
                island = waiting.closest_island or "none"
                by_island[island] = by_island.get(island, 0) + 1
                if waiting.slice == vslice.key:
                    mine_result = waiting
            self._metrics.queue(by_island)
            assert mine_result is not None, f"admission pass lost slice {vslice.key}"
            if isinstance(mine_result, Unplaceable) and mine_result.reason is Reason.INSUFFICIENT_DEVICES:
                mine_result = self._preempt_for(vslice, mine_result, slices, all_pods, nodes, needs)
            return mine_result

    def _admissible_needs(self, vslice: VirtualSliceObject) -> HostResources | None:
        """What one host of another queued slice needs, or None if that slice is not to be placed now."""
        if priority_class_refusal(vslice.spec.priority_class, allow_system=self._allow_system_priority):
            return None
        if self._backing_off(vslice.key) is not None:
            return None
        try:
            return host_resources(vslice, self._defaults)
        except ValueError:
            return None

    def _backing_off(self, key: str) -> Unplaceable | None:
        """Why the slice is not placed yet if the API server refused its pods a moment ago."""
        refusal = self._refusals.get(key)
        if refusal is None:
            return None
        _, until, why = refusal
        left = until - self._clock()
        if left <= 0:
            return None
        return dataclasses.replace(why, message=f"{why.message}; placing the gang again in {left:.0f} s")

    def _wants_devices(self, other: VirtualSliceObject, pods: Sequence[PodView]) -> bool:
        """In the admission queue: alive, not suspended, not failed or blocked, and holding no pods."""
        return not (
            other.deleting
            or other.spec.suspend
            or _record(other).failure
            or other.key in self._blocked
            or pods
        )

    def _queued_gang(self, other: VirtualSliceObject, needs: HostResources) -> QueuedGang | None:
        """The slice as the admission queue sees it; None if its admission group is unreadable."""
        size = other.admission_group_size() if other.admission_group else 1
        if isinstance(size, str):
            return None
        return QueuedGang(
            GangRequest(
                slice=other.key,
                devices=other.spec.devices,
                devices_per_host=self._host_size(other),
                island=other.spec.island,
                host_resources=needs,
            ),
            priority=self._priority(other.spec.priority_class),
            queued_at=other.created,
            group=other.admission_group,
            group_size=size,
        )

    def _preempt_for(
        self,
        vslice: VirtualSliceObject,
        waiting: Unplaceable,
        slices: Sequence[VirtualSliceObject],
        all_pods: Sequence[PodView],
        nodes: Sequence[Json],
        needs: HostResources,
    ) -> Unplaceable:
        """Evict lower-priority gangs if that makes room for ``vslice``; says so in its message."""
        priority = self._priority(vslice.spec.priority_class)
        by_key = {s.key: s for s in slices}
        running = [
            RunningGang(r.placement, self._priority(by_key[r.key].spec.priority_class), by_key[r.key].created)
            for r in self._ledger.all()
            if r.key != vslice.key and r.key in by_key
        ]
        if not any(g.priority < priority for g in running):
            return waiting
        draining = [p for p in all_pods if not p.deleting]
        machines = inventory.machines(nodes, draining, self._ledger.all())
        request = GangRequest(vslice.key, vslice.spec.devices, self._host_size(vslice), vslice.spec.island, needs)
        plan = choose_victims(request, priority, running, machines)
        if plan is None or not plan.victims:
            return waiting
        names = ", ".join(plan.victims)
        for victim in plan.victims:
            if victim not in self._evicting:
                self._evicting[victim] = (
                    f"preempted by VirtualSlice {vslice.key} (priority {priority} > "
                    f"{self._priority(by_key[victim].spec.priority_class)}), which needs its devices on "
                    f"{plan.island}; the slice is queued again and resumes when room returns"
                )
                log.info("%s: preempting %s on %s", vslice.key, victim, plan.island)
            self._wake(victim)
        return Unplaceable(
            vslice.key, Reason.INSUFFICIENT_DEVICES,
            f"{waiting.message}; preempting {names} (lower priority) to make room on {plan.island}",
            closest_island=plan.island,
        )

    def _queued(self, vslice: VirtualSliceObject, why: Unplaceable, outcome: _Outcome) -> _Outcome:
        if why.reason in (Reason.INVALID_SPEC, Reason.PRIORITY_CLASS_NOT_ALLOWED):
            self._move(vslice, outcome, _S.FAILED)
            previous = find_condition(outcome.conditions, _C.ADMITTED)
            if previous is None or previous.reason != why.reason:
                outcome.events.append(("Warning", str(why.reason), why.message))
            self._condition(vslice, outcome, _C.ADMITTED, "False", why.reason, why.message)
            self._condition(vslice, outcome, _C.READY, "False", why.reason, why.message)
            outcome.delay = _IDLE
        else:
            self._move(vslice, outcome, _S.PENDING)
            previous = find_condition(outcome.conditions, _C.ADMITTED)
            if previous is None or previous.reason != why.reason:
                outcome.events.append((event_type(why.reason), str(why.reason), why.message))
            self._condition(vslice, outcome, _C.ADMITTED, "False", why.reason, why.message)
            self._condition(vslice, outcome, _C.READY, "False", why.reason,
                            "the gang is not placed yet; see the Admitted condition")
            outcome.delay = _QUEUED
        outcome.island, outcome.hosts = "", ()
        outcome.ready_hosts = ""
        self._summaries[vslice.key] = f"VirtualSlice {vslice.key} is {outcome.phase}: {why.message}"
        return outcome

    # ------------------------------------------------------------ launching and ready

    def _launch(
        self,
        vslice: VirtualSliceObject,
        reservation: Reservation,
        current: dict[int, PodView],
        outcome: _Outcome,
    ) -> _Outcome:
        placement = reservation.placement
        hosts = placement.hosts
        if not is_condition_true(outcome.conditions, _C.ADMITTED):
            nodes = ", ".join(sorted({h.machine for h in hosts}))
            outcome.events.append((
                "Normal", str(Reason.ADMITTED),
                f"Admitted on {placement.island}: {plural(len(hosts), 'host')} of "
                f"{plural(placement.devices_per_host, 'device')} on {nodes}",
            ))
        if outcome.phase is not _S.READY:
            self._move(vslice, outcome, _S.LAUNCHING)
        self._condition(
            vslice, outcome, _C.ADMITTED, "True", Reason.ADMITTED,
            f"gang of {plural(len(hosts), 'host')} of {plural(placement.devices_per_host, 'device')} placed on "
            f"{placement.island} ({', '.join(h.machine for h in hosts)})",
        )
        outcome.island = placement.island
        secret = self._secret(vslice)
        if isinstance(secret, _InTheWay):
            return self._give_back(vslice, current, outcome, secret)
        token = secret.token
        try:
            problem = self._ensure_pods(vslice, reservation, current)
        except _PodRefused as refused:
            return self._pods_refused(vslice, reservation, outcome, refused.error)
        except _PodInTheWay as err:
            self._pod_conflicts[vslice.key] = err.pod
            return self._give_back(vslice, current, outcome, err.why)
        ready = [current[h.index] for h in hosts if h.index in current and _serving(current[h.index])]
        outcome.hosts = tuple(
            HostRecord(
                index=h.index,
                node=h.machine,
                devices=h.devices,
                pod=current[h.index].name if h.index in current else "",
                pod_ip=current[h.index].ip if h.index in current else "",
            )
            for h in hosts
        )
        outcome.ready_hosts = f"{len(ready)}/{len(hosts)}"
        if len(ready) < len(hosts):
            waiting = problem or f"{fraction(len(ready), len(hosts), 'host')} running and ready"
            return self._not_ready(vslice, outcome, waiting)

        addresses = tuple(f"{current[h.index].ip}:{SIDECAR_PORT}" for h in hosts)
        if self._registered.get(vslice.key) == (reservation.generation, addresses):
            if not self._controller_has(addresses):
                log.warning("%s: the controller dropped the gang while its pods run; registering it again",
                            vslice.key)
                self._registered.pop(vslice.key, None)
        if self._registered.get(vslice.key) != (reservation.generation, addresses):
            problems = unready_hosts(addresses)
            if problems:
                return self._not_ready(vslice, outcome, "; ".join(problems))
            decl = ir.SliceDecl(
                id=vslice.name,
                name=vslice.name,
                devices=vslice.spec.devices,
                devices_per_host=placement.devices_per_host,
                island=placement.island,
            )
            gang = [
                GangHost(host_name(vslice.name, h.index), address)
                for h, address in zip(hosts, addresses)
            ]
            try:
                self._registry.register_gang(vslice.key, decl, placement, gang, token)
            except Exception as err:  # the controller refused: report and retry next look
                log.exception("registering the gang of %s with the controller failed", vslice.key)
                return self._not_ready(vslice, outcome, f"the controller refused the gang: {err}")
            self._registered[vslice.key] = (reservation.generation, addresses)
        if not is_condition_true(outcome.conditions, _C.READY):
            outcome.events.append((
                "Normal", str(Reason.GANG_READY),
                f"Gang ready on {placement.island}: {', '.join(addresses)}",
            ))
        self._move(vslice, outcome, _S.READY)
        message = f"{'all ' if len(hosts) != 1 else ''}{plural(len(hosts), 'host')} ready on {placement.island}"
        self._condition(vslice, outcome, _C.READY, "True", Reason.GANG_READY, message)
        if find_condition(outcome.conditions, _C.DEGRADED) is not None:
            self._condition(vslice, outcome, _C.DEGRADED, "False", Reason.GANG_READY, message)
        self._summaries[vslice.key] = f"VirtualSlice {vslice.key} is Ready"
        self._refusals.pop(vslice.key, None)
        outcome.delay = _STEADY
        return outcome

    def _give_back(
        self, vslice: VirtualSliceObject, current: dict[int, PodView], outcome: _Outcome, why: _InTheWay
    ) -> _Outcome:
        """An object in the way of an admitted gang: release its devices and pods, wait out of the queue."""
        if self._registered.pop(vslice.key, None) is not None:
            self._registry.gang_lost(vslice.key, why.message)
        self._ledger.release(vslice.key)
        self._teardown(vslice, list(current.values()))
        return self._not_owned(vslice, outcome, why)

    def _controller_has(self, addresses: tuple[str, ...]) -> bool:
        """Whether the controller still streams to exactly these hosts (a broken link drops a gang)."""
        return any(
            tuple(h.address for h in info.hosts) == addresses for info in self._registry.describe().slices
        )

    def _not_ready(self, vslice: VirtualSliceObject, outcome: _Outcome, waiting: str) -> _Outcome:
        self._condition(vslice, outcome, _C.READY, "False", Reason.GANG_LAUNCHING, waiting)
        self._summaries[vslice.key] = f"VirtualSlice {vslice.key} is {outcome.phase}: {waiting}"
        outcome.delay = _SOON
        return outcome

    def _ensure_pods(
        self, vslice: VirtualSliceObject, reservation: Reservation, current: dict[int, PodView]
    ) -> str:
        """Create and bind missing pods, host 0 first; returns what the gang waits for, if anything."""
        placement = reservation.placement
        host0 = current.get(0)
        if host0 is None:
            return self._create(vslice, reservation, placement.hosts[0], None)
        if not host0.node:
            self._api.bind_pod(vslice.namespace, host0.name, placement.hosts[0].machine)
        if not host0.ip:
            return f"waiting for host 0 (pod {host0.name}) to get an IP: the JAX coordinator address"
        problems = []
        for host in placement.hosts[1:]:
            pod = current.get(host.index)
            if pod is None:
                problem = self._create(vslice, reservation, host, host0.ip)
                if problem:
                    problems.append(problem)
            elif not pod.node:
                self._api.bind_pod(vslice.namespace, pod.name, host.machine)
        return "; ".join(problems)

    def _create(
        self,
        vslice: VirtualSliceObject,
        reservation: Reservation,
        host: HostAssignment,
        coordinator_ip: str | None,
    ) -> str:
        manifest = host_pod_manifest(
            vslice, reservation.placement, host.index, reservation.generation, coordinator_ip,
            self._defaults,
        )
        name = manifest["metadata"]["name"]
        try:
            self._api.create_pod(vslice.namespace, manifest)
        except AlreadyExists:
            found = self._api.get_pod(vslice.namespace, name)
            if found is None:
                return f"pod {name} was deleted while creating it; creating it again"
            owner = self._pod_ownership(vslice, found)
            if owner is Ownership.FOREIGN:
                raise _PodInTheWay(name, _foreign_pod(vslice, name, found)) from None
            if owner is Ownership.EARLIER:
                return f"pod {name} of an earlier VirtualSlice {vslice.name} is still terminating"
            return f"pod {name} of an earlier gang of this slice is still terminating"
        except KubeError as err:
            if err.status in _REFUSED_STATUSES:
                raise _PodRefused(err) from None
            raise
        self._api.bind_pod(vslice.namespace, name, host.machine)
        log.info("%s: created pod %s bound to %s", vslice.key, name, host.machine)
        return f"pod {name} created on {host.machine}"

    def _pods_refused(
        self, vslice: VirtualSliceObject, reservation: Reservation, outcome: _Outcome, err: KubeError
    ) -> _Outcome:
        """The API server refused a pod: remove the partial gang; wait and retry (403) or fail (invalid pod)."""
        key = vslice.key
        if self._registered.pop(key, None) is not None:
            self._registry.gang_lost(key, str(err))
        self._ledger.release(key)
        self._drained[key] = reservation.generation
        self._teardown(vslice, [p for p in self._pods_of(vslice) if p.generation == reservation.generation])
        if err.status == 403:
            count = self._refusals.get(key, (0, 0.0, None))[0] + 1
            wait = refused_backoff(count)
            message = (
                f"the API server refused a pod of the gang ({err}); the gang's pods were removed so "
                f"that it holds no devices. A ResourceQuota or admission policy of namespace "
                f"{vslice.namespace} limits it (kubectl describe resourcequota -n {vslice.namespace})"
            )
            self._refusals[key] = (count, self._clock() + wait, Unplaceable(key, Reason.POD_REFUSED, message))
            message += f"; placing the gang again in {wait:.0f} s"
            reason, phase = Reason.POD_REFUSED, _S.PENDING
        else:
            message = (
                f"the API server refused a pod of the gang as invalid ({err}); fix spec.resources or "
                "spec.image and create the VirtualSlice again"
            )
            reason, phase = Reason.INVALID_SPEC, _S.FAILED
        self._move(vslice, outcome, phase)
        self._condition(vslice, outcome, _C.ADMITTED, "False", reason, message)
        self._condition(vslice, outcome, _C.READY, "False", reason, message)
        outcome.events.append(("Warning", str(reason), message))
        outcome.island, outcome.hosts, outcome.ready_hosts = "", (), ""
        outcome.delay = _SOON
        self._summaries[key] = f"VirtualSlice {key} is {outcome.phase}: {message}"
        return outcome

    # ------------------------------------------------------------ failures

    def _loss(self, vslice: VirtualSliceObject, reservation: Reservation, current: dict[int, PodView]) -> str:
        """Why the gang is broken ("pod x-1 failed: ..."), or "" while it is whole or still growing.

        A pod that vanished between two looks (deleted with no grace period) is
        noticed because this process saw it before for the same reservation; after
        an operator restart it is simply created again.
        """
        gone = self._missing_nodes(current.values())
        for index in sorted(current):
            if current[index].node in gone:
                pod = current[index]
                return f"node {pod.node} of pod {pod.name} was deleted"
        for index in sorted(current):
            pod = current[index]
            if pod.deleting:
                return f"pod {pod.name} was deleted"
            if pod.failure:
                return f"pod {pod.name} failed: {pod.failure}"
        seen_for, seen = self._seen.get(vslice.key, (None, frozenset[int]()))
        if seen_for is not reservation:
            seen = frozenset()
        missing = sorted(seen - current.keys())
        if missing:
            return f"pod {pod_name(vslice.name, missing[0])} disappeared"
        self._seen[vslice.key] = (reservation, seen | current.keys())
        return ""

    def _recreate(
        self, vslice: VirtualSliceObject, pods: list[PodView], outcome: _Outcome, loss: str
    ) -> _Outcome:
        """Tear the whole gang down; queue it again, or fail it when restarts are used up.

        The restart count (or the failure) goes into the slice record first, so a
        restart of the operator in between neither forgets nor repeats it.
        """
        self._registry.gang_lost(vslice.key, loss)
        self._registered.pop(vslice.key, None)
        self._ledger.release(vslice.key)
        self._teardown(vslice, pods)
        limit = vslice.spec.max_restarts
        if outcome.restarts >= limit:
            message = (
                f"{loss}; the gang was already recreated {plural(outcome.restarts, 'time')} "
                f"(failurePolicy.maxRestarts={limit})"
            )
            self._save_record(vslice, SliceRecord(outcome.restarts, message))
            self._move(vslice, outcome, _S.FAILED)
            self._condition(vslice, outcome, _C.READY, "False", Reason.RESTARTS_EXHAUSTED, message)
            self._condition(vslice, outcome, _C.DEGRADED, "True", Reason.RESTARTS_EXHAUSTED, message)
            outcome.events.append(("Warning", str(Reason.RESTARTS_EXHAUSTED), message))
            outcome.delay = _IDLE
        else:
            outcome.restarts += 1
            self._save_record(vslice, SliceRecord(outcome.restarts))
            self._queued_since[vslice.key] = self._clock()
            message = (
                f"{loss}; recreating the whole gang (restart {outcome.restarts} of {limit})"
            )
            self._move(vslice, outcome, _S.RECOVERING)
            self._condition(vslice, outcome, _C.DEGRADED, "True", Reason.GANG_RECREATED, message)
            self._condition(vslice, outcome, _C.READY, "False", Reason.GANG_RECREATED, message)
            self._condition(
                vslice, outcome, _C.ADMITTED, "False", Reason.GANG_RECREATED,
                "the old gang is being torn down; the slice is placed again once its pods are gone",
            )
            outcome.events.append(("Warning", str(Reason.GANG_RECREATED), f"Gang recreated: {loss}"))
            outcome.delay = _SOON
        outcome.island, outcome.hosts, outcome.ready_hosts = "", (), ""
        self._summaries[vslice.key] = f"VirtualSlice {vslice.key} is {outcome.phase}: {message}"
        return outcome

    def _missing_nodes(self, pods: Iterable[PodView]) -> set[str]:
        """Nodes the pods are bound to that no longer exist (no kubelet will ever report on them)."""
        bound = {p.node for p in pods if p.node}
        if not bound:
            return set()
        existing = {str(n["metadata"]["name"]) for n in self._api.list_nodes()}
        return bound - existing

    def _teardown(self, vslice: VirtualSliceObject, pods: Sequence[PodView]) -> None:
        """Delete the gang's pods; those on a deleted Node at once (grace 0: no kubelet will confirm)."""
        gone = self._missing_nodes(pods)
        for pod in pods:
            if pod.controller_uid != vslice.uid:
                log.error("%s: not deleting pod %s: it is not this slice's", vslice.key, pod.name)
                continue
            if pod.node in gone:
                self._api.delete_pod(pod.namespace, pod.name, pod.uid, grace_seconds=0)
            elif not pod.deleting:
                self._api.delete_pod(pod.namespace, pod.name, pod.uid)

    def _preempted(
        self, vslice: VirtualSliceObject, pods: list[PodView], outcome: _Outcome, why: str
    ) -> _Outcome:
        """Evict the gang for a higher-priority slice: pods deleted, back to the queue (no restart counted)."""
        if self._registered.pop(vslice.key, None) is not None:
            self._registry.gang_lost(vslice.key, why)
        self._ledger.release(vslice.key)
        self._drained[vslice.key] = outcome.restarts
        self._teardown(vslice, pods)
        self._queued_since[vslice.key] = self._clock()
        self._move(vslice, outcome, _S.PENDING)
        self._condition(vslice, outcome, _C.ADMITTED, "False", Reason.PREEMPTED, why)
        self._condition(vslice, outcome, _C.READY, "False", Reason.PREEMPTED, why)
        outcome.events.append(("Warning", str(Reason.PREEMPTED), why[0].upper() + why[1:]))
        outcome.island, outcome.hosts, outcome.ready_hosts = "", (), ""
        outcome.delay = _SOON
        self._summaries[vslice.key] = f"VirtualSlice {vslice.key} is Pending: {why}"
        return outcome

    def _suspend(self, vslice: VirtualSliceObject, pods: list[PodView], outcome: _Outcome) -> _Outcome:
        if self._registered.pop(vslice.key, None) is not None:
            self._registry.gang_lost(vslice.key, "the VirtualSlice was suspended")
        self._ledger.release(vslice.key)
        self._teardown(vslice, pods)
        message = "spec.suspend is true: the slice holds no pods and no devices"
        if outcome.phase is not _S.SUSPENDED:
            outcome.events.append(("Normal", str(Reason.SUSPENDED), message))
        self._move(vslice, outcome, _S.SUSPENDED)
        self._condition(vslice, outcome, _C.SUSPENDED, "True", Reason.SUSPENDED, message)
        self._condition(vslice, outcome, _C.ADMITTED, "False", Reason.SUSPENDED, message)
        self._condition(vslice, outcome, _C.READY, "False", Reason.SUSPENDED, message)
        outcome.island, outcome.hosts, outcome.ready_hosts = "", (), ""
        outcome.delay = _IDLE
        self._summaries[vslice.key] = f"VirtualSlice {vslice.key} is Suspended"
        return outcome

    # ------------------------------------------------------------ status

    @staticmethod
    def _move(vslice: VirtualSliceObject, outcome: _Outcome, phase: SlicePhase) -> None:
        outcome.phase = check_transition(vslice.key, outcome.phase, phase)

    @staticmethod
    def _condition(
        vslice: VirtualSliceObject,
        outcome: _Outcome,
        type_: SliceConditionType,
        status: ConditionStatus,
        reason: Reason,
        message: str,
    ) -> None:
        outcome.conditions = set_condition(
            outcome.conditions,
            Condition(str(type_), status, str(reason), message, vslice.generation),
            now_rfc3339(),
        )

    def _write_status(self, vslice: VirtualSliceObject, outcome: _Outcome) -> None:
        new = SliceStatus(
            phase=outcome.phase,
            conditions=tuple(outcome.conditions),
            island=outcome.island,
            hosts=outcome.hosts,
            restarts=outcome.restarts,
            ready_hosts=outcome.ready_hosts,
            observed_generation=vslice.generation,
        )
        if new != vslice.status:
            self._api.patch_slice_status(vslice.namespace, vslice.name, new.to_manifest())
        self._metrics.slice_phase(vslice.key, str(outcome.phase))
        for type_, reason, message in outcome.events:
            try:
                self._api.post_event(vslice.reference(), type_, reason, message)
            except KubeError as err:
                log.warning("%s: %s", vslice.key, err)


def _serving(pod: PodView) -> bool:
    return pod.phase == "Running" and pod.ready and bool(pod.ip) and not pod.deleting


def _recorded_reservation(
    vslice: VirtualSliceObject, pods: Sequence[PodView], generation: int
) -> Reservation | None:
    """The placement the slice's pods of ``generation`` record in their annotation, if any.

    ``status`` is not consulted: it is a report anyone with access to the status
    subresource can rewrite, and a gang without pods holds no devices anyway.
    """
    for pod in pods:
        if pod.generation == generation and pod.placement_json:
            placement = placement_from_json(vslice.key, pod.placement_json)
            if placement is not None:
                return Reservation(vslice.namespace, vslice.name, generation, placement)
    return None


def _record(vslice: VirtualSliceObject) -> SliceRecord:
    """The slice record the operator keeps in the slice's annotations."""
    return parse_record(vslice.annotations.get(RESTARTS_ANNOTATION), vslice.annotations.get(FAILURE_ANNOTATION))


def _foreign_pod(vslice: VirtualSliceObject, name: str, pod: Json) -> _InTheWay:
    refs = owner_refs(pod.get("metadata") or {})
    return _InTheWay(
        f"pod {vslice.namespace}/{name} exists and is not this VirtualSlice's ({describe_controller(refs)}); "
        "host pods of the slice take that name and the operator neither uses nor deletes a pod it does "
        "not control: delete or rename that pod, or give the VirtualSlice another name",
        warning=True,
    )
