"""The VirtualSlice state machine, driven look by look with no API, process or clock."""

from __future__ import annotations

import dataclasses

import pytest

from pathways_operator.core.phases import InvalidTransition, SlicePhase
from pathways_operator.core.placement import HostAssignment, Placement, Unplaceable
from pathways_operator.core.reasons import Condition, Reason
from pathways_operator.core.slice_look import (
    BackOff, BindHostPod, Block, ClearBackOff, CreateHostPod, DeletePods, InTheWay, MarkDrained, Next,
    ReleaseGang, Requeue, SaveRecord, SeeHosts, SliceDecision, SliceLook,
)
from pathways_operator.core.slice_machine import SliceMachine, plan_pods, refused_name
from pathways_operator.core.slice_phase import SliceRecord

NOW = "2026-01-01T00:00:00Z"
KEY = "ns/train"


@dataclasses.dataclass(frozen=True)
class Pod:
    """A pod of the gang as the machine reads it."""

    name: str
    node: str = ""
    phase: str = "Running"
    ip: str = ""
    ready: bool = False
    deleting: bool = False
    failure: str = ""


def placement(hosts: int = 2, devices: int = 4) -> Placement:
    return Placement(KEY, "island-a", tuple(HostAssignment(i, f"m{i}", devices) for i in range(hosts)))


def serving(index: int) -> Pod:
    return Pod(f"train-{index}", node=f"m{index}", ip=f"10.0.0.{index + 1}", ready=True)


def look(**changes: object) -> SliceLook:
    base = SliceLook(
        key=KEY, name="train", namespace="ns", generation=1, now=NOW, conditions=(), suspend=False,
        max_restarts=3, record=SliceRecord(), restarts=0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def condition(decision: SliceDecision, type_: str) -> Condition:
    found = next((c for c in decision.conditions if c.type == type_), None)
    assert found is not None, f"no {type_} condition in {decision.conditions}"
    return found


def ready_look(**changes: object) -> SliceLook:
    """A placed, whole, registered gang that was Ready at the last look."""
    first = SliceMachine(look(placement=placement(), current={0: serving(0), 1: serving(1)}, registered=True))
    assert first.start() is Next.LAUNCH
    first.launch(placement())
    first.pods_created(placement(), {0: serving(0), 1: serving(1)}, "")
    first.gang_ready(placement(), ["10.0.0.1:1", "10.0.0.2:1"])
    base = look(
        conditions=first.decision().conditions, placement=placement(),
        current={0: serving(0), 1: serving(1)}, registered=True, seen=frozenset({0, 1}),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


# ------------------------------------------------------------------ admission


def test_unplaced_slice_asks_for_admission_and_rejoins_the_queue() -> None:
    machine = SliceMachine(look())
    assert machine.start() is Next.ADMIT
    assert machine.take_actions() == [Block(None)]


def test_queued_slice_is_pending_and_says_why_once() -> None:
    why = Unplaceable(KEY, Reason.INSUFFICIENT_DEVICES, "needs 8 devices on one island; best is island-a with 4 free")
    machine = SliceMachine(look())
    machine.start()
    machine.queued(why)
    decision = machine.decision()
    assert decision.phase is SlicePhase.PENDING
    assert condition(decision, "Admitted").reason == "InsufficientDevices"
    assert [e.reason for e in decision.events] == ["InsufficientDevices"]

    again = SliceMachine(look(conditions=decision.conditions))
    again.start()
    again.queued(why)
    assert again.decision().events == ()


def test_slice_whose_spec_can_never_be_placed_fails() -> None:
    machine = SliceMachine(look())
    machine.start()
    machine.queued(Unplaceable(KEY, Reason.INVALID_SPEC, "spec.devices 6 is not a multiple of 4"))
    decision = machine.decision()
    assert decision.phase is SlicePhase.FAILED
    assert decision.events[0].type == "Warning"


# ------------------------------------------------------------------ launch


def test_admitted_gang_launches_every_host_at_once() -> None:
    machine = SliceMachine(look())
    machine.start()
    machine.launch(placement())
    assert plan_pods(placement(), {}) == [CreateHostPod(0), CreateHostPod(1)]
    assert not machine.pods_created(placement(), {}, "pod train-0 created on m0")
    decision = machine.decision()
    assert decision.phase is SlicePhase.LAUNCHING
    assert condition(decision, "Admitted").status == "True"
    assert condition(decision, "Ready").message == "pod train-0 created on m0"
    assert decision.island == "island-a" and decision.ready_hosts == "0/2"
    assert [e.reason for e in decision.events] == ["Admitted"]


def test_other_hosts_are_created_before_host_zero_has_an_ip() -> None:
    unbound = {0: Pod("train-0")}
    assert plan_pods(placement(), unbound) == [BindHostPod("train-0", "m0"), CreateHostPod(1)]
    assert plan_pods(placement(), {0: serving(0), 1: Pod("train-1")}) == [BindHostPod("train-1", "m1")]
    assert plan_pods(placement(), {0: serving(0), 1: serving(1)}) == []


def test_whole_serving_gang_becomes_ready_once() -> None:
    current = {0: serving(0), 1: serving(1)}
    machine = SliceMachine(look(placement=placement(), current=current))
    assert machine.start() is Next.LAUNCH
    assert machine.take_actions() == [SeeHosts(frozenset({0, 1}))]
    machine.launch(placement())
    assert machine.pods_created(placement(), current, "")
    machine.gang_ready(placement(), ["10.0.0.1:1", "10.0.0.2:1"])
    decision = machine.decision()
    assert decision.phase is SlicePhase.READY
    assert condition(decision, "Ready").message == "all 2 hosts ready on island-a"
    assert "GangReady" in [e.reason for e in decision.events]
    assert machine.take_actions() == [ClearBackOff()]
    assert decision.summary == f"VirtualSlice {KEY} is Ready"

    steady = SliceMachine(ready_look())
    assert steady.phase is SlicePhase.READY
    steady.start()
    steady.launch(placement())
    steady.pods_created(placement(), current, "")
    steady.gang_ready(placement(), ["10.0.0.1:1", "10.0.0.2:1"])
    assert steady.decision().events == ()


def test_running_pods_are_asked_before_their_readiness_probe_passes_but_pending_ones_are_not() -> None:
    """Whether a host serves is its sidecar's Health answer, asked as soon as the pod runs
    with an address: the probe's once-a-second tick would hold a formed gang back."""
    probe_pending = {i: dataclasses.replace(serving(i), ready=False) for i in (0, 1)}
    machine = SliceMachine(look(placement=placement(), current=probe_pending))
    machine.start()
    machine.launch(placement())
    assert machine.pods_created(placement(), probe_pending, "")
    assert machine.decision().ready_hosts == "2/2"

    for pod in (Pod("train-1", node="m1", phase="Pending", ip="10.0.0.2"), Pod("train-1", node="m1"),
                dataclasses.replace(serving(1), deleting=True)):
        current = {0: serving(0), 1: pod}
        machine = SliceMachine(look(placement=placement(), current=current))
        machine.start()
        machine.launch(placement())
        assert not machine.pods_created(placement(), current, ""), pod
        assert condition(machine.decision(), "Ready").message == "1/2 hosts running"


def test_sidecars_not_answering_keep_the_gang_launching() -> None:
    current = {0: serving(0), 1: serving(1)}
    machine = SliceMachine(look(placement=placement(), current=current))
    machine.start()
    machine.launch(placement())
    assert machine.pods_created(placement(), current, "")
    machine.not_ready("host train/host-1: worker not ready")
    decision = machine.decision()
    assert decision.phase is SlicePhase.LAUNCHING
    assert condition(decision, "Ready").reason == "GangLaunching"


# ------------------------------------------------------------------ degraded: gang recreation


def test_failed_pod_recreates_the_whole_gang() -> None:
    broken = {0: serving(0), 1: dataclasses.replace(serving(1), failure="container worker exited with code 1")}
    machine = SliceMachine(ready_look(current=broken))
    assert machine.start() is Next.DONE
    actions = machine.take_actions()
    loss = "pod train-1 failed: container worker exited with code 1"
    assert actions[0] == ReleaseGang(loss, always_tell=True)
    assert isinstance(actions[1], DeletePods) and len(actions[1].pods) == 2
    assert actions[2:] == [SaveRecord(SliceRecord(1)), Requeue()]
    decision = machine.decision()
    assert decision.phase is SlicePhase.RECOVERING
    assert decision.restarts == 1
    assert condition(decision, "Degraded").status == "True"
    assert condition(decision, "Ready").message == f"{loss}; recreating the whole gang (restart 1 of 3)"
    assert decision.events[0].message == f"Gang recreated: {loss}"


def test_pod_that_vanished_between_looks_is_a_lost_host() -> None:
    machine = SliceMachine(ready_look(current={0: serving(0)}))
    machine.start()
    assert "pod train-1 disappeared" in machine.decision().events[0].message


def test_pods_on_a_deleted_node_are_deleted_at_once() -> None:
    machine = SliceMachine(ready_look(missing_nodes=frozenset({"m1"})))
    machine.start()
    delete = next(a for a in machine.take_actions() if isinstance(a, DeletePods))
    assert delete.at_once == frozenset({"train-1"})
    assert machine.decision().events[0].message.startswith("Gang recreated: node m1 of pod train-1 was deleted")


def test_evicted_pod_on_an_unreachable_node_is_deleted_at_once_and_the_gang_recreated() -> None:
    evicted = {0: serving(0), 1: dataclasses.replace(serving(1), deleting=True)}
    machine = SliceMachine(ready_look(current=evicted, unreachable_nodes=frozenset({"m1"})))
    machine.start()
    delete = next(a for a in machine.take_actions() if isinstance(a, DeletePods))
    assert delete.at_once == frozenset({"train-1"})
    assert machine.decision().events[0].message.startswith("Gang recreated: pod train-1 was deleted")


def test_pod_on_an_unreachable_node_is_left_to_eviction_while_not_deleted() -> None:
    machine = SliceMachine(look(strays=(serving(1),), unreachable_nodes=frozenset({"m1"})))
    machine.start()
    delete = next(a for a in machine.take_actions() if isinstance(a, DeletePods))
    assert delete.pods == (serving(1),) and delete.at_once == frozenset()


def test_lost_host_after_max_restarts_fails_the_slice_for_good() -> None:
    broken = {0: serving(0), 1: dataclasses.replace(serving(1), deleting=True)}
    machine = SliceMachine(ready_look(current=broken, restarts=3, max_restarts=3))
    machine.start()
    record = next(a for a in machine.take_actions() if isinstance(a, SaveRecord)).record
    assert record.restarts == 3 and "failurePolicy.maxRestarts=3" in record.failure
    decision = machine.decision()
    assert decision.phase is SlicePhase.FAILED
    assert condition(decision, "Degraded").reason == "RestartsExhausted"


def test_recorded_failure_keeps_the_slice_failed_and_empty() -> None:
    stale = Pod("train-0", node="m0")
    machine = SliceMachine(look(record=SliceRecord(3, "restarts used up"), strays=(stale,)))
    assert machine.start() is Next.DONE
    assert machine.take_actions() == [ReleaseGang("restarts used up"), DeletePods((stale,))]
    assert machine.decision().phase is SlicePhase.FAILED


def test_old_gang_draining_keeps_the_slice_recovering() -> None:
    machine = SliceMachine(look(strays=(Pod("train-0", deleting=True),), restarts=1))
    assert machine.start() is Next.DONE
    decision = machine.decision()
    assert decision.phase is SlicePhase.RECOVERING
    assert decision.summary == f"VirtualSlice {KEY} is Recovering: waiting for 1 pod of its previous gang to terminate"


# ------------------------------------------------------------------ preemption, suspend, release


def test_preempted_gang_goes_back_to_the_queue_without_a_restart() -> None:
    why = "preempted by VirtualSlice ns/urgent (priority 100 > 0), which needs its devices on island-a"
    machine = SliceMachine(ready_look(evicting=why))
    assert machine.start() is Next.DONE
    actions = machine.take_actions()
    assert actions[:2] == [ReleaseGang(why), MarkDrained(0)]
    assert actions[-1] == Requeue()
    decision = machine.decision()
    assert decision.phase is SlicePhase.PENDING and decision.restarts == 0
    assert condition(decision, "Admitted").reason == "Preempted"
    assert decision.events[0].message.startswith("Preempted by VirtualSlice ns/urgent")


def test_suspended_slice_holds_nothing_and_resumes_into_the_queue() -> None:
    machine = SliceMachine(ready_look(suspend=True))
    assert machine.start() is Next.DONE
    assert machine.take_actions()[0] == ReleaseGang("the VirtualSlice was suspended")
    decision = machine.decision()
    assert decision.phase is SlicePhase.SUSPENDED
    assert condition(decision, "Suspended").status == "True"
    assert [e.reason for e in decision.events] == ["Suspended"]

    resumed = SliceMachine(look(conditions=decision.conditions))
    assert resumed.start() is Next.ADMIT
    assert condition(resumed.decision(), "Suspended").status == "False"


def test_object_in_the_way_releases_the_gang_and_blocks_the_queue() -> None:
    why = InTheWay("Secret ns/train-token exists and is not this VirtualSlice's", warning=True)
    machine = SliceMachine(look(placement=placement(), current={0: serving(0)}))
    machine.start()
    machine.take_actions()
    machine.launch(placement())
    machine.in_the_way(why)
    actions = machine.take_actions()
    assert actions[0] == ReleaseGang(why.message) and actions[-1] == Block(why.message)
    decision = machine.decision()
    assert decision.phase is SlicePhase.PENDING
    assert condition(decision, "Admitted").reason == "ObjectNotOwned"
    assert decision.events[-1].type == "Warning"


def test_a_host_policy_the_operator_may_not_make_holds_the_slice_under_its_own_reason() -> None:
    why = InTheWay("the operator may not read or create NetworkPolicy ns/train-pathways-hosts", warning=True,
                   reason=Reason.HOST_POLICY_FORBIDDEN)
    machine = SliceMachine(look(in_the_way=why))
    assert machine.start() is Next.DONE
    assert machine.take_actions()[-1] == Block(why.message)
    decision = machine.decision()
    assert decision.phase is SlicePhase.PENDING and decision.hosts == ()
    assert condition(decision, "Admitted").reason == condition(decision, "Ready").reason == "HostPolicyForbidden"
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "HostPolicyForbidden")]


def test_refused_pods_back_off_on_403_and_fail_when_invalid() -> None:
    machine = SliceMachine(look())
    machine.start()
    machine.launch(placement())
    machine.pods_refused(403, "pods is forbidden: exceeded quota", [])
    backoff = next(a for a in machine.take_actions() if isinstance(a, BackOff))
    assert backoff.count == 1 and backoff.why.reason is Reason.POD_REFUSED
    decision = machine.decision()
    assert decision.phase is SlicePhase.PENDING
    assert "placing the gang again in" in condition(decision, "Admitted").message

    invalid = SliceMachine(look())
    invalid.start()
    invalid.launch(placement())
    invalid.pods_refused(422, "Pod is invalid", [])
    assert invalid.decision().phase is SlicePhase.FAILED


# ------------------------------------------------------------------ transitions and bad names


def test_illegal_transition_names_the_slice_and_both_phases() -> None:
    machine = SliceMachine(look(record=SliceRecord(1, "gone for good")))
    machine.start()
    with pytest.raises(InvalidTransition) as raised:
        machine.gang_ready(placement(), ["10.0.0.1:1"])
    assert (raised.value.name, raised.value.old, raised.value.new) == (KEY, "Failed", "Ready")


def test_name_the_operator_cannot_serve_fails_once() -> None:
    decision = refused_name(KEY, 1, NOW, None, (), 0, "metadata.name is too long")
    assert decision.phase is SlicePhase.FAILED
    assert [e.reason for e in decision.events] == ["InvalidSpec"]
    again = refused_name(KEY, 1, NOW, SlicePhase.FAILED, decision.conditions, 0, "metadata.name is too long")
    assert again.events == ()
