"""One look at a VirtualSlice, as a state machine: what was observed in, status, Events and actions out.

The slice reconciler (``k8s.slice_reconciler``) reads the slice, its pods and
its memory of the slice into a frozen :class:`SliceLook`, and hands it to a
:class:`SliceMachine`. The machine starts from the phase
:func:`~pathways_operator.core.slice_phase.observed_phase` derives from the
facts (never from the ``status`` read back) and decides, in the order the
life cycle in ``core.phases`` runs:

* a slice failed for good, suspended, or evicted for a slice of higher priority
  gives up its gang (:class:`ReleaseGang`, :class:`DeletePods`);
* pods of an earlier gang are deleted; a placed gang that lost a host
  (its Node gone, a pod deleted, failed or vanished) is recreated whole, or
  Failed when ``failurePolicy.maxRestarts`` is used up (:class:`SaveRecord`
  first, so a restarted operator neither forgets nor repeats it);
* an object in the slice's way (a Secret or pod it does not control) keeps it
  out of the admission queue, and says which;
* otherwise the slice asks for admission (:attr:`Next.ADMIT`) or launches its
  placed gang (:attr:`Next.LAUNCH`).

What needs the cluster between two decisions (the admission pass, creating the
pods, the sidecars' health, the controller's answer) the reconciler does, and
feeds the outcome back as the next stimulus: :meth:`~SliceMachine.admitted`,
:meth:`~SliceMachine.queued`, :meth:`~SliceMachine.in_the_way`,
:meth:`~SliceMachine.pods_refused`, :meth:`~SliceMachine.pods_created`,
:meth:`~SliceMachine.not_ready`, :meth:`~SliceMachine.gang_ready`. After each
stimulus the reconciler carries out :meth:`~SliceMachine.take_actions`; at the
end it writes :meth:`~SliceMachine.decision`'s status once. The pod plan of a
launch is :func:`plan_pods`. Nothing here reads a clock or talks to anything.
The module runs a little over 400 lines so that every stimulus of a slice's
life, and so every phase change, reads in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pathways_operator.core.admission_policy import refused_backoff
from pathways_operator.core.phases import SlicePhase
from pathways_operator.core.placement import Placement, Unplaceable
from pathways_operator.core.reasons import Condition, Reason, SliceConditionType, event_type
from pathways_operator.core.slice_look import (
    BackOff,
    BindHostPod,
    Block,
    ClearBackOff,
    CreateHostPod,
    DeletePods,
    GangPod,
    HostReport,
    InTheWay,
    MarkDrained,
    Next,
    PodStep,
    ReleaseGang,
    Requeue,
    SaveRecord,
    SeeHosts,
    SliceAction,
    SliceDecision,
    SliceLook,
    pod_name,
    serving,
)
from pathways_operator.core.slice_phase import SliceObservation, SliceRecord, observed_phase
from pathways_operator.core.status_report import Report
from pathways_wire.wording import fraction, plural

# Seconds until the next look, by what the slice is waiting for. Pod events
# wake a slice earlier; these bound how long a missed event can delay it.
SOON = 0.5
QUEUED = 1.0
STEADY = 2.0
IDLE = 10.0

_S = SlicePhase
_C = SliceConditionType


def plan_pods(placement: Placement, current: Mapping[int, GangPod]) -> list[PodStep]:
    """The pods to create or bind now: every host's at once, in host order.

    Hosts after 0 need host 0's pod IP (the JAX coordinator address), which exists
    only once that pod starts; they are not held back for it, but told it through
    their sidecars as soon as each listens (``k8s.coordinator_handoff``), so the
    whole gang starts together.
    """
    steps: list[PodStep] = []
    for host in placement.hosts:
        pod = current.get(host.index)
        if pod is None:
            steps.append(CreateHostPod(host.index))
        elif not pod.node:
            steps.append(BindHostPod(pod.name, host.machine))
    return steps


def refused_name(
    key: str, generation: int, now: str, phase: SlicePhase | None, conditions: Sequence[Condition],
    restarts: int, problem: str,
) -> SliceDecision:
    """Failed for a name the operator cannot serve (stored before the CRD refused it); nothing is created."""
    report: Report[SlicePhase, SliceAction] = Report(key, generation, now, phase or _S.PENDING, conditions, IDLE)
    if report.phase is not _S.FAILED:
        report.move(_S.FAILED)
        report.condition(_C.ADMITTED, "False", Reason.INVALID_SPEC, problem)
        report.condition(_C.READY, "False", Reason.INVALID_SPEC, problem)
        report.event("Warning", Reason.INVALID_SPEC, problem)
    return SliceDecision(report.phase, tuple(report.conditions), restarts, "", (), "", tuple(report.events),
                         IDLE, None)


class SliceMachine:
    """The decisions of one look at one slice; each method is a stimulus, none does I/O."""

    def __init__(self, look: SliceLook) -> None:
        self.look = look
        phase = observed_phase(SliceObservation(
            failure=look.record.failure,
            suspended=look.suspend,
            placed=look.placement is not None,
            hosts=len(look.placement.hosts) if look.placement is not None else 0,
            pods=len(look.current),
            registered=look.registered,
            draining=bool(look.strays),
            preempted=look.preempted,
        ))
        self.report: Report[SlicePhase, SliceAction] = Report(
            look.key, look.generation, look.now, phase, look.conditions, QUEUED
        )
        self.restarts = look.restarts
        self.island = ""
        self.hosts: tuple[HostReport, ...] = ()
        self.ready_hosts = ""
        self.summary: str | None = None

    @property
    def phase(self) -> SlicePhase:
        return self.report.phase

    def take_actions(self) -> list[SliceAction]:
        return self.report.take_actions()

    def decision(self) -> SliceDecision:
        r = self.report
        return SliceDecision(r.phase, tuple(r.conditions), self.restarts, self.island, self.hosts,
                             self.ready_hosts, tuple(r.events), r.delay, self.summary)

    # ------------------------------------------------------------ the look

    def start(self) -> Next:
        """The decisions that need nothing but the look."""
        look, r = self.look, self.report
        if r.phase is _S.FAILED:
            self._failed_for_good()
            return Next.DONE
        if look.suspend:
            self._suspend()
            return Next.DONE
        if look.evicting is not None and r.phase in (_S.LAUNCHING, _S.READY):
            self._preempted(look.evicting)
            return Next.DONE
        if r.is_true(_C.SUSPENDED):
            r.condition(_C.SUSPENDED, "False", Reason.SUSPENDED,
                        "spec.suspend is false; the slice is queued for devices again")
        if look.strays:
            r.act(self._delete(look.strays))
        if look.placement is not None:
            loss = self._loss()
            if loss:
                self._recreate(loss)
                return Next.DONE
            r.act(SeeHosts(look.seen | frozenset(look.current)))
            return Next.LAUNCH
        if look.strays:
            r.delay = SOON
            self.summary = (
                f"VirtualSlice {look.key} is {r.phase}: waiting for "
                f"{plural(len(look.strays), 'pod')} of its previous gang to terminate"
            )
            return Next.DONE
        if look.in_the_way is not None:
            self._not_owned(look.in_the_way)
            return Next.DONE
        r.act(Block(None))
        return Next.ADMIT

    def _delete(self, pods: Sequence[GangPod]) -> DeletePods:
        gone, unreachable = self.look.missing_nodes, self.look.unreachable_nodes
        return DeletePods(tuple(pods), frozenset(
            p.name for p in pods if p.node in gone or (p.deleting and p.node in unreachable)
        ))

    def _loss(self) -> str:
        """Why the placed gang is broken ("pod x-1 failed: ..."), or "" while it is whole or still growing.

        A pod that vanished between two looks (deleted with no grace period) is
        noticed because the operator saw it before for the same placement; after
        an operator restart it is simply created again.
        """
        look = self.look
        current = look.current
        for index in sorted(current):
            if current[index].node and current[index].node in look.missing_nodes:
                pod = current[index]
                return f"node {pod.node} of pod {pod.name} was deleted"
        for index in sorted(current):
            pod = current[index]
            if pod.deleting:
                return f"pod {pod.name} was deleted"
            if pod.failure:
                return f"pod {pod.name} failed: {pod.failure}"
        missing = sorted(look.seen - current.keys())
        if missing:
            return f"pod {pod_name(look.name, missing[0])} disappeared"
        return ""

    def _unplaced(self) -> None:
        self.island, self.hosts, self.ready_hosts = "", (), ""

    def _failed_for_good(self) -> None:
        """A slice whose record says it failed: no pods, no devices, and a status that says why."""
        look, r = self.look, self.report
        failure = look.record.failure
        r.act(ReleaseGang(failure), self._delete(look.pods))
        r.condition(_C.READY, "False", Reason.RESTARTS_EXHAUSTED, failure)
        r.condition(_C.DEGRADED, "True", Reason.RESTARTS_EXHAUSTED, failure)
        r.delay = IDLE
        self.summary = f"VirtualSlice {look.key} is Failed: {failure}"

    def _suspend(self) -> None:
        look, r = self.look, self.report
        r.act(ReleaseGang("the VirtualSlice was suspended"), self._delete(look.pods))
        message = "spec.suspend is true: the slice holds no pods and no devices"
        if r.phase is not _S.SUSPENDED:
            r.event("Normal", Reason.SUSPENDED, message)
        r.move(_S.SUSPENDED)
        r.condition(_C.SUSPENDED, "True", Reason.SUSPENDED, message)
        r.condition(_C.ADMITTED, "False", Reason.SUSPENDED, message)
        r.condition(_C.READY, "False", Reason.SUSPENDED, message)
        self._unplaced()
        r.delay = IDLE
        self.summary = f"VirtualSlice {look.key} is Suspended"

    def _preempted(self, why: str) -> None:
        """Evict the gang for a higher-priority slice: pods deleted, back to the queue (no restart counted)."""
        look, r = self.look, self.report
        r.act(ReleaseGang(why), MarkDrained(self.restarts), self._delete(look.pods), Requeue())
        r.move(_S.PENDING)
        r.condition(_C.ADMITTED, "False", Reason.PREEMPTED, why)
        r.condition(_C.READY, "False", Reason.PREEMPTED, why)
        r.event("Warning", Reason.PREEMPTED, why[0].upper() + why[1:])
        self._unplaced()
        r.delay = SOON
        self.summary = f"VirtualSlice {look.key} is Pending: {why}"

    def _recreate(self, loss: str) -> None:
        """Tear the whole gang down; queue it again, or fail it when restarts are used up.

        The restart count (or the failure) goes into the slice record before the
        status, so a restart of the operator in between neither forgets nor repeats it.
        """
        look, r = self.look, self.report
        r.act(ReleaseGang(loss, always_tell=True), self._delete(tuple(look.current.values())))
        limit = look.max_restarts
        if self.restarts >= limit:
            message = (
                f"{loss}; the gang was already recreated {plural(self.restarts, 'time')} "
                f"(failurePolicy.maxRestarts={limit})"
            )
            r.act(SaveRecord(SliceRecord(self.restarts, message)))
            r.move(_S.FAILED)
            r.condition(_C.READY, "False", Reason.RESTARTS_EXHAUSTED, message)
            r.condition(_C.DEGRADED, "True", Reason.RESTARTS_EXHAUSTED, message)
            r.event("Warning", Reason.RESTARTS_EXHAUSTED, message)
            r.delay = IDLE
        else:
            self.restarts += 1
            r.act(SaveRecord(SliceRecord(self.restarts)), Requeue())
            message = f"{loss}; recreating the whole gang (restart {self.restarts} of {limit})"
            r.move(_S.RECOVERING)
            r.condition(_C.DEGRADED, "True", Reason.GANG_RECREATED, message)
            r.condition(_C.READY, "False", Reason.GANG_RECREATED, message)
            r.condition(_C.ADMITTED, "False", Reason.GANG_RECREATED,
                        "the old gang is being torn down; the slice is placed again once its pods are gone")
            r.event("Warning", Reason.GANG_RECREATED, f"Gang recreated: {loss}")
            r.delay = SOON
        self._unplaced()
        self.summary = f"VirtualSlice {look.key} is {r.phase}: {message}"

    def _not_owned(self, why: InTheWay) -> None:
        """Wait, out of the admission queue, for an object in the slice's way to go; say which."""
        r = self.report
        r.act(Block(why.message))
        r.move(_S.PENDING)
        previous = r.find(_C.ADMITTED)
        if previous is None or (previous.reason, previous.message) != (str(why.reason), why.message):
            r.event("Warning" if why.warning else "Normal", why.reason, why.message)
        r.condition(_C.ADMITTED, "False", why.reason, why.message)
        r.condition(_C.READY, "False", why.reason, "the gang is not placed; see the Admitted condition")
        self._unplaced()
        r.delay = STEADY
        self.summary = f"VirtualSlice {self.look.key} is {r.phase}: {why.message}"

    # ------------------------------------------------------------ admission

    def queued(self, why: Unplaceable) -> None:
        """The admission pass did not place the slice: wait in the queue, or fail for a spec it can never place."""
        r = self.report
        previous = r.find(_C.ADMITTED)
        changed = previous is None or previous.reason != why.reason
        if why.reason in (Reason.INVALID_SPEC, Reason.PRIORITY_CLASS_NOT_ALLOWED):
            r.move(_S.FAILED)
            if changed:
                r.event("Warning", why.reason, why.message)
            r.condition(_C.ADMITTED, "False", why.reason, why.message)
            r.condition(_C.READY, "False", why.reason, why.message)
            r.delay = IDLE
        else:
            r.move(_S.PENDING)
            if changed:
                r.event(event_type(why.reason), why.reason, why.message)
            r.condition(_C.ADMITTED, "False", why.reason, why.message)
            r.condition(_C.READY, "False", why.reason, "the gang is not placed yet; see the Admitted condition")
            r.delay = QUEUED
        self._unplaced()
        self.summary = f"VirtualSlice {self.look.key} is {r.phase}: {why.message}"

    # ------------------------------------------------------------ launching and ready

    def launch(self, placement: Placement) -> None:
        """The gang is placed: Launching (or still Ready), Admitted says where."""
        r = self.report
        hosts = placement.hosts
        if not r.is_true(_C.ADMITTED):
            nodes = ", ".join(sorted({h.machine for h in hosts}))
            r.event("Normal", Reason.ADMITTED,
                    f"Admitted on {placement.island}: {plural(len(hosts), 'host')} of "
                    f"{plural(placement.devices_per_host, 'device')} on {nodes}")
        if r.phase is not _S.READY:
            r.move(_S.LAUNCHING)
        r.condition(
            _C.ADMITTED, "True", Reason.ADMITTED,
            f"gang of {plural(len(hosts), 'host')} of {plural(placement.devices_per_host, 'device')} placed on "
            f"{placement.island} ({', '.join(h.machine for h in hosts)})",
        )
        self.island = placement.island

    def in_the_way(self, why: InTheWay) -> None:
        """An object in the way of an admitted gang: release its devices and pods, wait out of the queue."""
        self.report.act(ReleaseGang(why.message), self._delete(tuple(self.look.current.values())))
        self._not_owned(why)

    def pods_refused(self, http_status: int, error: str, pods: Sequence[GangPod]) -> None:
        """The API server refused a pod: remove the partial gang; wait and retry (403) or fail (invalid pod)."""
        look, r = self.look, self.report
        r.act(ReleaseGang(error), MarkDrained(self.restarts), self._delete(pods))
        if http_status == 403:
            count = look.refusals + 1
            wait = refused_backoff(count)
            message = (
                f"the API server refused a pod of the gang ({error}); the gang's pods were removed so "
                f"that it holds no devices. A ResourceQuota or admission policy of namespace "
                f"{look.namespace} limits it (kubectl describe resourcequota -n {look.namespace})"
            )
            r.act(BackOff(count, wait, Unplaceable(look.key, Reason.POD_REFUSED, message)))
            message += f"; placing the gang again in {wait:.0f} s"
            reason, phase = Reason.POD_REFUSED, _S.PENDING
        else:
            message = (
                f"the API server refused a pod of the gang as invalid ({error}); fix spec.resources or "
                "spec.image and create the VirtualSlice again"
            )
            reason, phase = Reason.INVALID_SPEC, _S.FAILED
        r.move(phase)
        r.condition(_C.ADMITTED, "False", reason, message)
        r.condition(_C.READY, "False", reason, message)
        r.event("Warning", reason, message)
        self._unplaced()
        r.delay = SOON
        self.summary = f"VirtualSlice {look.key} is {r.phase}: {message}"

    def pods_created(self, placement: Placement, current: Mapping[int, GangPod], problem: str) -> bool:
        """The pods as they stand after the plan was carried out; True when every host serves.

        ``problem`` is what creating them reported ("pod x-0 created on m", "... still
        terminating"); while hosts are missing the slice waits, saying so.
        """
        hosts = placement.hosts
        ready = [current[h.index] for h in hosts if h.index in current and serving(current[h.index])]
        self.hosts = tuple(
            HostReport(
                index=h.index,
                node=h.machine,
                devices=h.devices,
                pod=current[h.index].name if h.index in current else "",
                pod_ip=current[h.index].ip if h.index in current else "",
            )
            for h in hosts
        )
        self.ready_hosts = f"{len(ready)}/{len(hosts)}"
        if len(ready) < len(hosts):
            self.not_ready(problem or f"{fraction(len(ready), len(hosts), 'host')} running")
            return False
        return True

    def not_ready(self, waiting: str) -> None:
        r = self.report
        r.condition(_C.READY, "False", Reason.GANG_LAUNCHING, waiting)
        self.summary = f"VirtualSlice {self.look.key} is {r.phase}: {waiting}"
        r.delay = SOON

    def gang_ready(self, placement: Placement, addresses: Sequence[str]) -> None:
        """Every host serves and the controller has the gang: Ready."""
        r = self.report
        if not r.is_true(_C.READY):
            r.event("Normal", Reason.GANG_READY, f"Gang ready on {placement.island}: {', '.join(addresses)}")
        r.move(_S.READY)
        count = len(placement.hosts)
        message = f"{'all ' if count != 1 else ''}{plural(count, 'host')} ready on {placement.island}"
        r.condition(_C.READY, "True", Reason.GANG_READY, message)
        if r.find(_C.DEGRADED) is not None:
            r.condition(_C.DEGRADED, "False", Reason.GANG_READY, message)
        self.summary = f"VirtualSlice {self.look.key} is Ready"
        r.act(ClearBackOff())
        r.delay = STEADY
