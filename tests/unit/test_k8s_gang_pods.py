"""The worker pods a gang is made of (``k8s/gang_pods.py``) and how a pod is read back."""

from __future__ import annotations

from typing import Any

from pathways_operator.k8s.gang_pods import (
    PodView,
    WorkerDefaults,
    host_pod_manifest,
    placement_from_json,
    placement_to_json,
    requested_devices,
)
from pathways_operator.k8s.resources import DEVICE_RESOURCE, PLACEMENT_ANNOTATION, SCHEDULER_NAME
from pathways_operator.k8s.virtual_slice import VirtualSliceObject
from tests.unit.k8s_builders import placement, pod, virtual_slice

GANG = placement("ns/train", "island-a", ("a-0", 4), ("a-1", 4))
SLICE = VirtualSliceObject.from_manifest(virtual_slice("train", 8))


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<from field>") for e in container["env"]}


def containers(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in manifest["spec"]["containers"]}


def test_host_pod_is_a_worker_and_a_dataflow_sidecar_bound_by_the_operator() -> None:
    manifest = host_pod_manifest(SLICE, GANG, 1, generation=3, coordinator_ip="10.0.0.5", defaults=WorkerDefaults())
    meta, spec = manifest["metadata"], manifest["spec"]
    assert meta["name"] == "train-1" and meta["namespace"] == "ns"
    assert meta["labels"]["pathways.dev/slice"] == "train"
    assert meta["labels"]["pathways.dev/host-index"] == "1"
    assert meta["labels"]["pathways.dev/generation"] == "3"
    assert meta["ownerReferences"][0]["uid"] == "uid-train"
    assert placement_from_json("ns/train", meta["annotations"][PLACEMENT_ANNOTATION]) == GANG
    assert spec["schedulerName"] == SCHEDULER_NAME and spec["restartPolicy"] == "Never"
    by_name = containers(manifest)
    assert sorted(by_name) == ["dataflow", "worker"]
    worker = env(by_name["worker"])
    assert worker["PATHWAYS_HOST_INDEX"] == "1" and worker["PATHWAYS_NUM_HOSTS"] == "2"
    assert worker["PATHWAYS_COORDINATOR"] == "10.0.0.5:8476"
    assert worker["PATHWAYS_DEVICES"] == "4"
    assert by_name["worker"]["resources"]["requests"][DEVICE_RESOURCE] == "4"
    assert requested_devices(manifest) == 4


def test_host_zero_coordinates_on_its_own_ip() -> None:
    manifest = host_pod_manifest(SLICE, GANG, 0, generation=1, coordinator_ip=None, defaults=WorkerDefaults())
    assert env(containers(manifest)["worker"])["PATHWAYS_COORDINATOR"] == "$(POD_IP):8476"


def test_sidecar_exposes_its_metrics_port() -> None:
    sidecar = containers(host_pod_manifest(SLICE, GANG, 0, 1, None, WorkerDefaults()))["dataflow"]
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports["metrics"] == int(env(sidecar)["PATHWAYS_SIDECAR_METRICS_PORT"])
    assert ports["dataflow"] == sidecar["readinessProbe"]["tcpSocket"]["port"]


def test_slice_image_and_resources_override_the_operator_defaults() -> None:
    custom = VirtualSliceObject.from_manifest(
        virtual_slice("train", 8, image="me/worker:1", resources={"requests": {"cpu": "2"}})
    )
    defaults = WorkerDefaults(image="default:1", pull_policy="IfNotPresent", resources={"requests": {"cpu": "1"}})
    by_name = containers(host_pod_manifest(custom, GANG, 0, 1, None, defaults))
    assert {c["image"] for c in by_name.values()} == {"me/worker:1"}
    assert {c["imagePullPolicy"] for c in by_name.values()} == {"IfNotPresent"}
    assert by_name["worker"]["resources"]["requests"] == {"cpu": "2", DEVICE_RESOURCE: "4"}
    plain = containers(host_pod_manifest(SLICE, GANG, 0, 1, None, defaults))
    assert plain["worker"]["image"] == "default:1"
    assert plain["worker"]["resources"]["requests"]["cpu"] == "1"


def test_placement_json_round_trips_and_garbage_is_none() -> None:
    assert placement_from_json("ns/train", placement_to_json(GANG)) == GANG
    assert placement_from_json("ns/train", "not json") is None
    assert placement_from_json("ns/train", "") is None


def test_pod_view_reads_labels_devices_and_readiness() -> None:
    view = PodView.from_manifest(
        pod("train-1", node="a-1", devices=4, slice_="train", host_index=1, generation=2, ready=True)
    )
    assert (view.slice, view.host_index, view.generation) == ("train", 1, 2)
    assert view.devices == 4 and view.node == "a-1" and view.ready and view.live
    assert view.failure == ""


def test_pod_view_says_why_a_host_is_gone() -> None:
    failed = PodView.from_manifest(pod("x-1", phase="Failed", terminated=("worker", 1, "Error")))
    assert failed.failure == "container worker exited with code 1 (Error)" and not failed.live
    evicted = PodView.from_manifest({**pod("x-2", phase="Failed"), "status": {"phase": "Failed", "reason": "Evicted"}})
    assert evicted.failure == "Evicted"
    assert PodView.from_manifest(pod("x-3", deleting=True)).deleting


def test_requested_devices_ignores_unparsable_values() -> None:
    manifest = pod("p", devices=2)
    manifest["spec"]["containers"].append({"name": "odd", "resources": {"limits": {DEVICE_RESOURCE: "many"}}})
    assert requested_devices(manifest) == 2
