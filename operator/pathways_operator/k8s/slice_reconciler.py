"""The resource manager: each VirtualSlice becomes a gang of worker pods on one island.

:meth:`SliceReconciler.reconcile` is level-based: it reads the slice and its
pods from the API, hands what it read to the slice state machine
(``core.slice_machine``), carries out the actions the machine decides, and
writes ``status`` once (``status_writer``). It runs again and again (a kopf
daemon per slice, woken early by pod events), so it must be idempotent: after
an operator restart the same reads lead to the same decisions, no pod is
created twice and none is orphaned.

The phases and the life cycle are ``core.phases``' and ``core.slice_machine``'s;
where each fact comes from is ``core.slice_phase``'s story. Here is only how
they are read and carried out:

* admission (placing the whole gang on one island, preemption of lower
  priorities) is ``admission_queue``;
* creating and binding pods, the token Secret, the host NetworkPolicy
  (``host_policy``), deleting pods, the slice record in annotations are
  ``gang_actions``;
* handing a serving gang to the island scheduler (after every sidecar
  answers ``Dataflow.Health`` with ``worker_ready``) is ``gang_registration``.

Ownership: the operator acts only on objects whose controller ownerReference
is the slice's uid (``core.ownership``): a Secret or pod that merely bears the
slice's name or label is never used, adopted or deleted; the slice waits out
of the admission queue, ``Admitted=False, reason=ObjectNotOwned``, naming the
object.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from pathways_operator.core.driver_placement import DriverRequest
from pathways_operator.core.object_names import slice_name_problem
from pathways_operator.core.ownership import Ownership
from pathways_operator.core.placement import Machine, Unplaceable
from pathways_operator.core.slice_look import (
    BackOff, Block, ClearBackOff, DeletePods, GangPod, InTheWay, MarkDrained, Next, ReleaseGang, Requeue,
    SaveRecord, SeeHosts, SliceAction, SliceDecision, SliceLook,
)
from pathways_operator.core.slice_machine import IDLE, SliceMachine, plan_pods, refused_name
from pathways_operator.core.slice_phase import current_generation
from pathways_operator.k8s import gang_actions
from pathways_operator.k8s.admission_queue import AdmissionQueue, slice_record
from pathways_operator.k8s.cluster_api import ClusterApi, now_rfc3339
from pathways_operator.k8s.gang_actions import PodInTheWay, PodRefused, SliceSecret
from pathways_operator.k8s.gang_pods import PodView, WorkerDefaults
from pathways_operator.k8s.gang_registration import GangRegistrations, GangRegistry
from pathways_operator.k8s.host_policy import OperatorPods
from pathways_operator.k8s.inventory import Reservation, unreachable
from pathways_operator.k8s.metrics import OperatorMetrics
from pathways_operator.k8s.node_cache import NodeCache
from pathways_wire import host_port
from pathways_wire.kube_names import COORDINATOR_PORT, SIDECAR_PORT, SLICE_KIND, SLICE_LABEL
from pathways_operator.k8s.status_writer import StatusWriter
from pathways_operator.k8s.virtual_slice import HostRecord, SliceStatus, VirtualSliceObject

log = logging.getLogger(__name__)


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
        driver_pods: bool = False,
        host_policy: OperatorPods | None = None,
    ) -> None:
        self._api = api
        self._defaults = defaults
        self._host_policy = host_policy
        """Where the operator's pods are, for each slice's host NetworkPolicy; None: no policies made."""
        metrics = metrics or OperatorMetrics()
        self._queue = AdmissionQueue(
            api, defaults=defaults, wake=wake, clock=clock, metrics=metrics,
            allow_system_priority_classes=allow_system_priority_classes, driver_pods=driver_pods,
        )
        self._gangs = GangRegistrations(registry, wake)
        self._status = StatusWriter(api, api.patch_slice_status, metrics.slice_phase,
                                    functools.partial(metrics.looked, SLICE_KIND))
        self._slice_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._secrets: dict[str, SliceSecret] = {}
        """Slice key -> its token Secret, as last read or written (read again for each new gang)."""
        self._policies: set[str] = set()
        """Keys of the slices whose host NetworkPolicy was found to be their own, unchanged
        since (``host_policy_changed`` takes a slice out)."""
        self._pod_conflicts: dict[str, str] = {}
        """Slice key -> the name of a pod, not the slice's own, that took one of its pod names."""
        self._seen: dict[str, tuple[Reservation, frozenset[int]]] = {}
        """Slice key -> host indices whose pods this process has seen for its current reservation."""
        self._summaries: dict[str, str] = {}
        self.nodes = NodeCache(api)
        """The Nodes the gangs are bound to (the operator's watch of Nodes feeds it)."""

    def cluster_changed(self) -> None:
        """A watch saw a VirtualSlice, a gang's or a driver's pod or a Node change: the next
        admission pass lists the cluster again (``admission_inputs``)."""
        self._queue.inputs.changed()

    # ------------------------------------------------------------ queries

    def machines(self) -> list[Machine]:
        """The inventory of the last admission pass (for the controller's Describe)."""
        return self._queue.machines()

    def driver_node(self, group: str, request: DriverRequest) -> str | None:
        """Where the driver of the program whose uid is ``group`` goes (``AdmissionQueue.driver_node``)."""
        return self._queue.driver_node(group, request)

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
                return IDLE
            vslice = VirtualSliceObject.from_manifest(raw)
            if vslice.deleting:
                return IDLE  # the deletion handler tears the gang down
            problem = slice_name_problem(vslice.name)
            if problem is not None:  # stored before the CRD refused it: no label can select its pods
                status = vslice.status
                decision = refused_name(key, vslice.generation, now_rfc3339(), status.phase,
                                        status.conditions, status.restarts, problem)
            else:
                decision = self._decide(vslice, self._pods_of(vslice))
            self._write_status(vslice, decision)
            return decision.delay

    def deleted(self, namespace: str, name: str, uid: str) -> None:
        """The slice ``uid`` is being deleted: tell the controller, free its devices, remove its objects.

        Only objects this slice controls are deleted (its Secret, its pods); a Secret
        or pod that merely has the slice's name or label is someone else's and stays.
        """
        key = f"{namespace}/{name}"
        with self._lock_for(key):
            self._gangs.unregister(key)
            self._queue.forget(key)
            for state in (self._summaries, self._secrets, self._pod_conflicts, self._seen):
                state.pop(key, None)
            self._policies.discard(key)
            self._status.forget(key)
            gang_actions.delete_slice_objects(self._api, namespace, name, uid)
        with self._locks_guard:
            self._slice_locks.pop(key, None)

    @property
    def keeps_host_policies(self) -> bool:
        """Whether each slice's hosts stand behind a NetworkPolicy this operator makes and keeps."""
        return self._host_policy is not None

    def host_policy_changed(self, namespace: str, slice_name: str) -> None:
        """The host NetworkPolicy of slice ``namespace/slice_name`` was changed or deleted: its
        next look reads it again (and makes or restores it). Waits for a look in progress, so
        that look cannot mark the policy as found after this."""
        key = f"{namespace}/{slice_name}"
        with self._locks_guard:
            lock = self._slice_locks.get(key)
        if lock is None:
            self._policies.discard(key)
            return
        with lock:
            self._policies.discard(key)

    def _pods_of(self, vslice: VirtualSliceObject) -> list[PodView]:
        """The slice's pods: labelled with its name and controlled by this incarnation of it."""
        raw = self._api.list_pods(vslice.namespace, f"{SLICE_LABEL}={vslice.name}")
        return [p for p in map(PodView.from_manifest, raw) if p.controller_uid == vslice.uid]

    def _look(self, vslice: VirtualSliceObject, pods: list[PodView]) -> tuple[SliceLook, Reservation | None]:
        """Everything one look needs, read from the API and this process's memory of the slice."""
        key = vslice.key
        secret = self._secret(vslice)
        record = slice_record(vslice)
        generation = current_generation(record.restarts, ((p.generation or 0, p.deleting) for p in pods))
        reservation = None if record.failure else self._queue.reservation(vslice, pods, generation)
        current = {
            p.host_index: p
            for p in pods
            if p.generation == generation and p.host_index is not None and reservation is not None
        }
        strays = tuple(p for p in pods if p.host_index not in current or current[p.host_index] is not p)
        seen_for, seen = self._seen.get(key, (None, frozenset[int]()))
        missing_nodes, unreachable_nodes = self._lost_nodes(pods)
        look = SliceLook(
            key=key,
            name=vslice.name,
            namespace=vslice.namespace,
            generation=vslice.generation,
            now=now_rfc3339(),
            conditions=vslice.status.conditions,
            suspend=vslice.spec.suspend,
            max_restarts=vslice.spec.max_restarts,
            record=record,
            restarts=generation,
            placement=None if reservation is None else reservation.placement,
            current=current,
            strays=strays,
            registered=self._gangs.generation(key) == generation,
            preempted=self._queue.drained(key) == generation,
            evicting=self._queue.evicting(key),
            missing_nodes=missing_nodes,
            unreachable_nodes=unreachable_nodes,
            seen=seen if seen_for is reservation else frozenset(),
            in_the_way=secret if isinstance(secret, InTheWay) else self._pod_in_the_way(vslice),
            refusals=self._queue.refusals(key),
        )
        return look, reservation

    def _decide(self, vslice: VirtualSliceObject, pods: list[PodView]) -> SliceDecision:
        look, reservation = self._look(vslice, pods)
        machine = SliceMachine(look)
        step = machine.start()
        self._carry_out(vslice, reservation, machine.take_actions())
        if step is Next.ADMIT:
            placed = self._queue.admit(vslice, look.restarts)
            if isinstance(placed, Unplaceable):
                machine.queued(placed)
                self._carry_out(vslice, placed, machine.take_actions())
                return self._remember(vslice, machine.decision())
            reservation = placed
        if step is not Next.DONE:
            assert reservation is not None
            self._launch(vslice, machine, reservation, look.current if step is Next.LAUNCH else {})
        return self._remember(vslice, machine.decision())

    def _launch(
        self, vslice: VirtualSliceObject, machine: SliceMachine, reservation: Reservation,
        current: Mapping[int, GangPod],
    ) -> None:
        """Create the gang's pods, and register it with the controller once every host serves."""
        placement = reservation.placement
        machine.launch(placement)
        if not current:  # a new gang mounts the Secret as it is now: read it again (made anew if deleted)
            self._secrets.pop(vslice.key, None)
        secret = self._secret(vslice)
        if isinstance(secret, InTheWay):
            machine.in_the_way(secret)
            self._carry_out(vslice, reservation, machine.take_actions())
            return
        steps = plan_pods(placement, current)
        try:
            reports = gang_actions.carry_out_pod_plan(self._api, vslice, reservation, steps, self._defaults)
        except PodRefused as refused:
            pods = [p for p in self._pods_of(vslice) if p.generation == reservation.generation]
            machine.pods_refused(refused.error.status, str(refused.error), pods)
            self._carry_out(vslice, reservation, machine.take_actions())
            return
        except PodInTheWay as err:
            self._pod_conflicts[vslice.key] = err.pod
            machine.in_the_way(err.why)
            self._carry_out(vslice, reservation, machine.take_actions())
            return
        host0 = current.get(0)
        coordinator = host_port.join(host0.ip, COORDINATOR_PORT) if host0 is not None and host0.ip else ""
        if host0 is not None and coordinator and not host0.deleting:
            self._gangs.tell_coordinator(
                vslice.key, reservation.generation, coordinator, secret.token,
                [host_port.join(pod.ip, SIDECAR_PORT) for i, pod in sorted(current.items()) if i > 0 and pod.ip
                 and not pod.deleting],
            )
        if not machine.pods_created(placement, current, "; ".join(reports)):
            return
        addresses = tuple(host_port.join(current[h.index].ip, SIDECAR_PORT) for h in placement.hosts)
        problem = self._gangs.ensure(
            vslice.key, vslice.name, vslice.spec.devices, reservation.generation, placement, addresses,
            secret.token, coordinator,
        )
        if problem:
            machine.not_ready(problem)
        else:
            machine.gang_ready(placement, addresses)
        self._carry_out(vslice, reservation, machine.take_actions())

    def _carry_out(
        self, vslice: VirtualSliceObject, reservation: Reservation | Unplaceable | None,
        actions: Sequence[SliceAction],
    ) -> None:
        """Carry out the machine's actions, in the order it decided them."""
        key = vslice.key
        for action in actions:
            if isinstance(action, ReleaseGang):
                self._gangs.release(key, action.why, always_tell=action.always_tell)
                self._queue.ledger.release(key)
            elif isinstance(action, DeletePods):
                gang_actions.delete_pods(self._api, vslice, action)
            elif isinstance(action, SaveRecord):
                gang_actions.save_record(self._api, vslice, action.record)
            elif isinstance(action, Requeue):
                self._queue.requeue(key)
            elif isinstance(action, MarkDrained):
                self._queue.mark_drained(key, action.generation)
            elif isinstance(action, Block):
                self._queue.block(key, action.why)
            elif isinstance(action, SeeHosts):
                assert isinstance(reservation, Reservation)
                self._seen[key] = (reservation, action.indices)
            elif isinstance(action, BackOff):
                self._queue.back_off(key, action.count, action.wait_s, action.why)
            elif isinstance(action, ClearBackOff):
                self._queue.clear_back_off(key)

    def _remember(self, vslice: VirtualSliceObject, decision: SliceDecision) -> SliceDecision:
        if decision.summary is not None:
            self._summaries[vslice.key] = decision.summary
        return decision

    # ------------------------------------------------------------ reads

    def _secret(self, vslice: VirtualSliceObject) -> SliceSecret | InTheWay:
        """The slice's token Secret (made first if missing, cached once usable), or what is in its
        way, or in the way of its host NetworkPolicy where the operator makes them: no pod is
        created until both are the slice's own."""
        secret = self._secrets.get(vslice.key)
        if secret is None:
            found = gang_actions.slice_secret(self._api, vslice)
            if isinstance(found, InTheWay):
                return found
            secret = self._secrets[vslice.key] = found
        if self._host_policy is not None and vslice.key not in self._policies:
            problem = gang_actions.slice_host_policy(self._api, vslice, self._host_policy)
            if problem is not None:
                return problem
            self._policies.add(vslice.key)
        return secret

    def _pod_in_the_way(self, vslice: VirtualSliceObject) -> InTheWay | None:
        """The pod, not this slice's, that took one of its pod names, while it is still there."""
        name = self._pod_conflicts.get(vslice.key)
        if name is None:
            return None
        found = self._api.get_pod(vslice.namespace, name)
        if found is None or gang_actions.pod_ownership(vslice, found) is not Ownership.FOREIGN:
            self._pod_conflicts.pop(vslice.key, None)
            return None
        return gang_actions.foreign_pod(vslice, name, found)

    def _lost_nodes(self, pods: Sequence[PodView]) -> tuple[frozenset[str], frozenset[str]]:
        """Nodes the pods are bound to that no longer exist, and those whose kubelet stopped reporting."""
        bound = {p.node for p in pods if p.node}
        if not bound:
            return frozenset(), frozenset()
        nodes = {name: self.nodes.get(name) for name in bound}
        return (frozenset(name for name, node in nodes.items() if node is None),
                frozenset(name for name, node in nodes.items() if node is not None and unreachable(node)))

    def _write_status(self, vslice: VirtualSliceObject, decision: SliceDecision) -> None:
        new = SliceStatus(
            phase=decision.phase,
            conditions=decision.conditions,
            island=decision.island,
            hosts=tuple(HostRecord(h.index, h.node, h.devices, h.pod, h.pod_ip) for h in decision.hosts),
            restarts=decision.restarts,
            ready_hosts=decision.ready_hosts,
            observed_generation=vslice.generation,
        )
        self._status.write(vslice.key, vslice.reference(), None if new == vslice.status else new.to_manifest(),
                           str(decision.phase), decision.events)
