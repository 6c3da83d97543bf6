"""The admission queue admits a program's driver with its slices (``k8s/admission_queue.py``)."""

from __future__ import annotations

from typing import Any

from pathways_operator.core.driver_placement import DriverRequest
from pathways_operator.core.placement import HostResources, Unplaceable
from pathways_operator.core.reasons import Reason
from pathways_operator.k8s.admission_queue import AdmissionQueue
from pathways_operator.k8s.gang_pods import WorkerDefaults, placement_to_json
from pathways_operator.k8s.inventory import Reservation
from pathways_operator.k8s.metrics import OperatorMetrics
from pathways_operator.k8s.virtual_slice import VirtualSliceObject
from pathways_wire.kube_names import (
    ADMISSION_GROUP_LABEL,
    ADMISSION_GROUP_SIZE_ANNOTATION,
    PLACEMENT_ANNOTATION,
    PROGRAM_LABEL,
)
from tests.unit.k8s_builders import node, pathways_program, placement, pod, virtual_slice

Json = dict[str, Any]


class FakeApi:
    """The ClusterApi reads an admission pass makes, on dicts."""

    def __init__(self, nodes: list[Json]) -> None:
        self.nodes = nodes
        self.slices: list[Json] = []
        self.pods: list[Json] = []
        self.programs: dict[str, Json] = {}
        self.pod_listings = 0

    def list_slices(self) -> list[Json]:
        return self.slices

    def list_pods(self, namespace: str | None) -> list[Json]:
        self.pod_listings += 1
        return self.pods

    def list_nodes(self) -> list[Json]:
        return self.nodes

    def get_node(self, name: str) -> Json | None:
        return next((n for n in self.nodes if n["metadata"]["name"] == name), None)

    def get_program(self, namespace: str, name: str) -> Json | None:
        return self.programs.get(name)

    def add_program(self, name: str, driver_cpu: str) -> VirtualSliceObject:
        """Program ``name`` and its one inline slice ``<name>-main`` of 4 devices."""
        self.programs[name] = pathways_program(name, driver={"resources": {"requests": {"cpu": driver_cpu}}})
        vslice = virtual_slice(f"{name}-main", 4)
        vslice["metadata"]["labels"] = {ADMISSION_GROUP_LABEL: f"uid-{name}", PROGRAM_LABEL: name}
        vslice["metadata"]["annotations"] = {ADMISSION_GROUP_SIZE_ANNOTATION: "1"}
        self.slices.append(vslice)
        return VirtualSliceObject.from_manifest(vslice)


def queue(api: FakeApi) -> AdmissionQueue:
    return AdmissionQueue(api, defaults=WorkerDefaults(), wake=lambda key: None, clock=lambda: 1000.0,  # type: ignore[arg-type]
                          metrics=OperatorMetrics(), allow_system_priority_classes=False, driver_pods=True)


NODES = [node("a-0", "island-a", 4, cpu="1"), node("a-1", "island-a", 4, cpu="1"), node("plain", None, 0, cpu="2")]


def test_a_programs_slice_is_admitted_with_its_driver_and_the_driver_goes_where_admission_put_it() -> None:
    api = FakeApi(NODES)
    train = api.add_program("train", driver_cpu="2")
    admission = queue(api)
    assert isinstance(admission.admit(train, 0), Reservation)
    assert admission.driver_node("uid-train", DriverRequest("ns/train", HostResources(2000))) == "plain"


def test_a_driver_no_node_can_hold_keeps_its_slice_waiting_with_the_reason() -> None:
    api = FakeApi(NODES)
    train = api.add_program("train", driver_cpu="64")
    outcome = queue(api).admit(train, 0)
    assert isinstance(outcome, Unplaceable)
    assert outcome.reason is Reason.INSUFFICIENT_DRIVER_RESOURCES
    assert "the driver of PathwaysProgram ns/train requests cpu 64; the most a Node offers is plain" in outcome.message


def test_after_a_restart_a_running_groups_unstarted_driver_keeps_its_node_before_anything_else_is_admitted() -> None:
    api = FakeApi(NODES)
    api.add_program("train", driver_cpu="2")
    host = pod("train-main-0", node="a-0", devices=4, slice_="train-main", host_index=0, generation=0)
    host["metadata"]["ownerReferences"] = [{"kind": "VirtualSlice", "name": "train-main", "uid": "uid-train-main",
                                            "controller": True}]
    host["metadata"]["annotations"] = {
        PLACEMENT_ANNOTATION: placement_to_json(placement("ns/train-main", "island-a", ("a-0", 4)))}
    api.pods.append(host)
    late = api.add_program("late", driver_cpu="2")
    restarted = queue(api)
    outcome = restarted.admit(late, 0)
    assert isinstance(outcome, Unplaceable), "the last 2 cpu stay with train's driver, admitted before the restart"
    assert outcome.reason is Reason.INSUFFICIENT_DRIVER_RESOURCES
    assert restarted.driver_node("uid-train", DriverRequest("ns/train", HostResources(2000))) == "plain"


def test_a_driver_placed_on_its_own_reads_what_the_last_admission_pass_read_until_a_change_is_reported() -> None:
    api = FakeApi(NODES)
    train = api.add_program("train", driver_cpu="1")
    admission = queue(api)
    assert isinstance(admission.admit(train, 0), Reservation)
    assert api.pod_listings == 1
    api.nodes = []  # every Node gone, and no watch has said so yet
    assert admission.driver_node("uid-solo", DriverRequest("ns/solo", HostResources(1000))) is not None
    assert api.pod_listings == 1, "the pass's read of a moment ago is reused"
    admission.inputs.changed()  # the Node watch reported the deletions
    assert admission.driver_node("uid-other", DriverRequest("ns/other", HostResources(1000))) is None
    assert api.pod_listings == 2
