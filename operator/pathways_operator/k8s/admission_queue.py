"""The admission queue: every queued VirtualSlice, the machines, one pass of ``core.admission`` at a time.

A slice asks for admission when it has no placement for its current generation
(:meth:`AdmissionQueue.admit`). One pass takes every queued slice, the
machines from ``inventory`` and calls ``core.admission.admit``, so a gang is
placed on one island as a whole, or not at all, before any of its pods exists.
Slices labelled with one ``pathways.dev/admission-group`` (a program's inline
slices) are admitted together or not at all. Admitted placements go into the
reservation ledger, which keeps their devices counted as used until the pods
exist and hold them; the ledger is a cache, rebuilt from the pods' placement
annotations on first use (:meth:`AdmissionQueue.reservation`).

A slice left waiting for devices asks ``core.preemption.choose_victims``
whether evicting running gangs of strictly lower priority (its
``priorityClassName``'s value, read from the scheduling API) makes room on one
island; the victims are told at their next look (:meth:`AdmissionQueue.evicting`).

With drivers in pods, a program's driver is admitted with its admission group:
the pass reads the program's ``spec.driver`` for each group none of whose
slices holds devices yet and whose driver pod is not running, and the group is
admitted only with its driver on a Node (``core.admission``). The driver's
CPU and memory stay promised on that Node (the driver ledger, by group) until
its pod exists and holds them itself; :meth:`AdmissionQueue.driver_node` tells
the driver pod where to go. The driver ledger is recomputed, not stored: after
an operator restart, a group whose slices hold devices and whose driver pod
does not exist yet is promised a Node again by the first pass, before anything
else is admitted (or by :meth:`AdmissionQueue.driver_node` when the driver
starts first), as is the driver of a program without a group when it starts.
Pods still terminating count as freed for this decision only, so one preemptor
never evicts more than it needs while its victims drain.

This module keeps the queue's memory (who is blocked, evicted, drained, backing
off after refused pods, waiting since when); the decisions about one slice are
``core.slice_machine``'s.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence

from pathways_operator.core.admission import QueuedGang, admit
from pathways_operator.core.admission_policy import priority_class_refusal
from pathways_operator.core.driver_placement import DriverPlacement, DriverRequest, NodeRoom
from pathways_operator.core.phases import ProgramPhase, is_terminal
from pathways_operator.core.placement import GangRequest, HostResources, Machine, Unplaceable
from pathways_operator.core.preemption import RunningGang, choose_victims
from pathways_operator.core.reasons import Reason
from pathways_operator.core.slice_phase import SliceRecord, current_generation, parse_record
from pathways_operator.k8s import inventory
from pathways_operator.k8s.admission_inputs import AdmissionInputs
from pathways_operator.k8s.cluster_api import ClusterApi, Json
from pathways_operator.k8s.driver_pods import spec_request
from pathways_operator.k8s.gang_pods import PodView, WorkerDefaults, host_resources, placement_from_json
from pathways_operator.k8s.inventory import Reservation, ReservationLedger
from pathways_operator.k8s.metrics import OperatorMetrics
from pathways_operator.k8s.pathways_program import ProgramObject
from pathways_wire.driver_protocol import driver_pod_name
from pathways_wire.kube_names import FAILURE_ANNOTATION, PROGRAM_LABEL, RESTARTS_ANNOTATION
from pathways_operator.k8s.virtual_slice import VirtualSliceObject

log = logging.getLogger(__name__)


def slice_record(vslice: VirtualSliceObject) -> SliceRecord:
    """The slice record the operator keeps in the slice's annotations."""
    return parse_record(vslice.annotations.get(RESTARTS_ANNOTATION), vslice.annotations.get(FAILURE_ANNOTATION))


def recorded_reservation(
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


class AdmissionQueue:
    """Places queued gangs on islands, remembers reservations, evictions and refusals."""

    def __init__(
        self,
        api: ClusterApi,
        *,
        defaults: WorkerDefaults,
        wake: Callable[[str], None],
        clock: Callable[[], float],
        metrics: OperatorMetrics,
        allow_system_priority_classes: bool,
        driver_pods: bool = False,
    ) -> None:
        self._api = api
        self._driver_pods = driver_pods
        self._defaults = defaults
        self._wake = wake
        self._clock = clock
        self._metrics = metrics
        self._allow_system_priority = allow_system_priority_classes
        self.ledger = ReservationLedger()
        self.inputs = AdmissionInputs(api, counted=metrics.admission_pass)
        """What the passes read of the cluster; the operator's watches report changes to it."""
        self._lock = threading.Lock()
        self._machines: list[Machine] = []
        self._priorities: dict[str, int] = {}
        self._queued_since: dict[str, float] = {}
        self._evicting: dict[str, str] = {}
        """Victim slice key -> why it is preempted (naming the preemptor), until its next look."""
        self._drained: dict[str, int] = {}
        """Preempted slice key -> generation whose terminating pods must not be adopted again."""
        self._blocked: dict[str, str] = {}
        """Slice key -> the object in its way (kept out of the admission queue until it is gone)."""
        self._refusals: dict[str, tuple[int, float, Unplaceable]] = {}
        """Slice key -> (pod refusals in a row, when it may be placed again, why) after the API refused a pod."""
        self._drivers: dict[str, DriverPlacement] = {}
        """Admission group (its program's uid) -> where its driver goes, until the driver pod exists."""

    # ------------------------------------------------------------ memory, per slice

    def machines(self) -> list[Machine]:
        """The inventory of the last admission pass (for the controller's Describe)."""
        return list(self._machines)

    def forget(self, key: str) -> None:
        """The slice is deleted: nothing of it stays queued or reserved."""
        self.ledger.release(key)
        self.inputs.changed()
        for state in (self._queued_since, self._drained, self._refusals, self._blocked):
            state.pop(key, None)

    def evicting(self, key: str) -> str | None:
        """Why the slice is being preempted, once (the look that evicts it takes it)."""
        return self._evicting.pop(key, None)

    def drained(self, key: str) -> int | None:
        return self._drained.get(key)

    def mark_drained(self, key: str, generation: int) -> None:
        self._drained[key] = generation

    def requeue(self, key: str) -> None:
        self._queued_since[key] = self._clock()

    def block(self, key: str, why: str | None) -> None:
        if why is None:
            self._blocked.pop(key, None)
        else:
            self._blocked[key] = why

    def refusals(self, key: str) -> int:
        return self._refusals.get(key, (0, 0.0, None))[0]

    def back_off(self, key: str, count: int, wait_s: float, why: Unplaceable) -> None:
        self._refusals[key] = (count, self._clock() + wait_s, why)

    def clear_back_off(self, key: str) -> None:
        self._refusals.pop(key, None)

    def reservation(
        self, vslice: VirtualSliceObject, pods: Sequence[PodView], generation: int
    ) -> Reservation | None:
        """The slice's admitted placement for this generation: the ledger's, else its pods' annotation."""
        held = self.ledger.get(vslice.key)
        if held is not None and held.generation == generation:
            return held
        if held is not None:
            self.ledger.release(vslice.key)
        if self._drained.get(vslice.key) == generation:
            return None  # preempted: its old pods are going, it waits for a new placement
        recovered = recorded_reservation(vslice, pods, generation)
        return None if recovered is None else self.ledger.adopt(recovered)

    # ------------------------------------------------------------ priorities

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

    # ------------------------------------------------------------ the pass

    def admit(self, vslice: VirtualSliceObject, generation: int) -> Reservation | Unplaceable:
        """One admission pass over every queued slice; returns this slice's outcome.

        Slices of one admission group are admitted together or not at all
        (``core.admission``); ``holding`` tells the core which of a group's slices
        already hold devices.
        """
        with self._lock:
            held = self.ledger.get(vslice.key)
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
            cluster = self.inputs.read()
            slices, all_pods, nodes = cluster.slices, cluster.pods, cluster.nodes
            owned: dict[str, list[PodView]] = {}
            uids = {s.uid: s.key for s in slices}
            for pod in all_pods:
                if pod.controller_uid in uids:
                    owned.setdefault(uids[pod.controller_uid], []).append(pod)
            alive = {s.key for s in slices if not s.deleting}
            for stale in self.ledger.all():
                if stale.key not in alive:
                    self.ledger.release(stale.key)  # deleted: its pods, if any, still count
            queue: list[QueuedGang] = []
            generations: dict[str, int] = {}
            for other in slices:
                if other.deleting:
                    continue
                mine = owned.get(other.key, [])
                other_generation = (
                    generation if other.key == vslice.key
                    else current_generation(slice_record(other).restarts, ((p.generation or 0, p.deleting) for p in mine))
                )
                if self.ledger.get(other.key) is None and self._drained.get(other.key) != other_generation:
                    recorded = recorded_reservation(other, mine, other_generation)
                    if recorded is not None:
                        self.ledger.adopt(recorded)
                        continue
                if other.key != vslice.key and not self._wants_devices(other, mine):
                    continue
                if self.ledger.get(other.key) is not None:
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
                if group and not other.deleting and (self.ledger.get(other.key) or owned.get(other.key)):
                    holding[group] = holding.get(group, 0) + 1
            self._release_drivers(slices, all_pods)
            drivers, at_once = self._unplaced_drivers(queue, slices, all_pods, holding)
            if at_once:
                used = inventory.in_use(all_pods, self.ledger.all(), self._drivers.values())
                self._promise_drivers(at_once, NodeRoom(inventory.nodes(nodes, used)))
            used = inventory.in_use(all_pods, self.ledger.all(), self._drivers.values())
            machines = inventory.machines_using(nodes, used)
            self._machines = machines
            every_node = inventory.nodes(nodes, used) if drivers else []
            result = admit(queue, machines, now=self._clock(), holding=holding, drivers=drivers, nodes=every_node)
            self._drivers.update(result.drivers)
            mine_result: Reservation | Unplaceable | None = None
            now = self._clock()
            created = {s.key: s.created for s in slices}
            for placement in result.admitted:
                namespace, _, name = placement.slice.partition("/")
                reservation = Reservation(namespace, name, generations[placement.slice], placement)
                self.ledger.reserve(reservation)
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

    # ------------------------------------------------------------ drivers

    def driver_node(self, group: str, request: DriverRequest) -> str | None:
        """The Node the driver of the program whose uid is ``group`` goes to; None if none has room now.

        A driver admitted with its group goes where admission put it, while that Node
        still takes it; any other (a program without a group, one admitted before the
        operator restarted, or one whose promised Node went NotReady or was tainted
        meanwhile, as a dead machine's is) is placed now on the Nodes as admission's last
        read of the cluster has them (`admission_inputs`: a Node's change is one the
        operator's watch reports, and ends that read), and promised there until its pod exists.
        """
        with self._lock:
            held = self._drivers.get(group)
            if held is not None:
                promised = self._api.get_node(held.node)
                if promised is not None and all(request.accepts(n) for n in inventory.nodes([promised], {})):
                    return held.node
                log.info("%s: Node %s, promised to its driver, takes it no more; placing it again",
                         request.program, held.node)
                del self._drivers[group]
            cluster = self.inputs.read()
            used = inventory.in_use(cluster.pods, self.ledger.all(), self._drivers.values())
            room = NodeRoom(inventory.nodes(cluster.nodes, used))
            where = room.place(request)
            if isinstance(where, str):
                log.info("%s: %s; its pod is left to the Kubernetes scheduler", request.program, where)
                return None
            self._drivers[group] = where
            return where.node

    def _unplaced_drivers(
        self,
        queue: Sequence[QueuedGang],
        slices: Sequence[VirtualSliceObject],
        pods: Sequence[PodView],
        holding: dict[str, int],
    ) -> tuple[dict[str, DriverRequest], dict[str, DriverRequest]]:
        """Programs' drivers not placed yet, by group: those admitted with their queued slices, and those to
        promise a Node at once because their slices hold devices and their pod does not exist (the driver
        ledger is not kept across an operator restart)."""
        if not self._driver_pods:
            return {}, {}
        pod_live = {(p.namespace, p.name, p.controller_uid): p.live for p in pods if not p.deleting}
        with_slices: dict[str, DriverRequest] = {}
        at_once: dict[str, DriverRequest] = {}
        for group in sorted(set(holding) | {g.group for g in queue if g.group}):
            member = next((s for s in slices if s.admission_group == group), None)
            name = member.labels.get(PROGRAM_LABEL, "") if member is not None else ""
            if group in self._drivers or member is None or not name:
                continue
            pod = (member.namespace, driver_pod_name(name), group)
            if holding.get(group) and pod in pod_live:
                continue  # its pod holds its own requests, or held them and is done
            if not holding.get(group) and pod_live.get(pod):
                continue
            request = self._program_driver(member.namespace, name, group)
            if request is not None:
                (at_once if holding.get(group) else with_slices)[group] = request
        return with_slices, at_once

    def _program_driver(self, namespace: str, name: str, group: str) -> DriverRequest | None:
        """What the driver of program ``namespace/name`` requests, if that program is the group's and may run."""
        raw = self._api.get_program(namespace, name)
        program = ProgramObject.from_manifest(raw) if raw is not None else None
        if program is None or program.uid != group:
            return None  # not a program's group: no driver comes with it
        if program.spec.suspend or is_terminal(program.status.phase or ProgramPhase.PENDING):
            return None
        try:
            return spec_request(program.key, program.spec.driver)
        except ValueError as err:
            log.info("%s: spec.driver is not read for admission: %s", program.key, err)
            return None

    def _promise_drivers(self, requests: dict[str, DriverRequest], room: NodeRoom) -> None:
        """Promise each driver a Node with room now, if one has."""
        for group, request in requests.items():
            where = room.place(request)
            if isinstance(where, DriverPlacement):
                room.take(where)
                self._drivers[group] = where

    def _release_drivers(self, slices: Sequence[VirtualSliceObject], pods: Sequence[PodView]) -> None:
        """Forget promised drivers whose pod holds its own requests now, or whose group is gone."""
        groups = {s.admission_group for s in slices if s.admission_group and not s.deleting}
        bound = {(p.namespace, p.name) for p in pods if p.live and p.node}
        for group, placed in list(self._drivers.items()):
            if group not in groups or inventory.driver_pod_key(placed) in bound:
                del self._drivers[group]

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
            or slice_record(other).failure
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
            for r in self.ledger.all()
            if r.key != vslice.key and r.key in by_key
        ]
        if not any(g.priority < priority for g in running):
            return waiting
        draining = [p for p in all_pods if not p.deleting]
        machines = inventory.machines(nodes, draining, self.ledger.all(), self._drivers.values())
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
