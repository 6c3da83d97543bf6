"""The worker pods of a gang: what one host's pod looks like, and how to read one back.

Each host of a VirtualSlice is one pod with two containers, the contract with
``pathways_worker``:

``worker``
    ``python -m pathways_worker.worker``: owns the host's JAX devices
    (``PATHWAYS_DEVICES``) and joins the slice's multi-process JAX job as
    process ``PATHWAYS_HOST_INDEX`` of ``PATHWAYS_NUM_HOSTS``, with host 0's
    pod IP as coordinator (the other hosts' workers learn that address from their
    sidecars, since every pod is created at once). It requests (and is limited to) ``devicesPerHost`` of
    the ``pathways.dev/device`` extended resource, so the devices a gang holds
    are visible to everything that counts requests.
``dataflow``
    ``python -m pathways_worker.sidecar``: the host's dataflow sidecar, reached
    by the controller and by peer hosts on port 8470 (its readiness probe).

Both share an in-memory ``emptyDir`` on ``/dev/shm`` for bulk bytes, and both
mount the slice's token Secret (``token_secret_manifest``, owned by the
VirtualSlice) read-only at ``/var/run/pathways/slice-token``: each refuses gRPC
callers that do not present it (``PATHWAYS_SLICE_TOKEN_FILE``). Pods carry
``schedulerName: pathways`` so kube-scheduler leaves them alone and the
operator binds them itself, and ``restartPolicy: Never`` because a host that
dies must take the whole gang down (the JAX job cannot re-admit a process).
Labels say which slice, host and generation a pod belongs to; an annotation
carries the gang's whole placement so a restarted operator can rebuild its
reservations from pods alone. A slice's ``priorityClassName`` goes on every pod,
so the API server's Priority admission resolves it and a ResourceQuota scoped
to that PriorityClass counts (and can refuse) the gang's pods.

What a host needs besides devices (:func:`host_resources`) is read from the
same container resources the pod is built with, both containers summed, so
placement fits exactly what the pod will request; what a live pod holds
(:func:`requested_resources`) is counted the way kube-scheduler counts it.

Building a pod and reading one back are kept in one module of about 450 lines on
purpose: they are the two directions of one contract, and a field added to one side
without the other is the mistake this layout makes visible.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from pathways_operator.core.ownership import controller_of, owner_refs
from pathways_operator.core.placement import HostAssignment, HostResources, Placement
from pathways_operator.k8s.cluster_api import Json
from pathways_wire import host_env
from pathways_wire.slice_token import ENV_TOKEN_FILE
from pathways_wire.kube_names import (
    COORDINATOR_PORT,
    DEVICE_RESOURCE,
    GENERATION_LABEL,
    HOST_INDEX_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLACEMENT_ANNOTATION,
    SCHEDULER_NAME,
    SHM_DIR,
    SIDECAR_CONTAINER,
    SIDECAR_METRICS_PORT,
    SIDECAR_PORT,
    SLICE_LABEL,
    WORKER_CONTAINER,
    WORKER_PORT,
)
from pathways_operator.k8s.virtual_slice import VirtualSliceObject

TERMINATION_GRACE_SECONDS = 10
TOKEN_DIR = "/var/run/pathways/slice-token"
TOKEN_KEY = "token"


@dataclasses.dataclass(frozen=True)
class WorkerDefaults:
    """What the operator is configured with for pods whose VirtualSlice leaves it open."""

    image: str = "ghcr.io/kube-pathways/worker:latest"
    pull_policy: str = ""
    """imagePullPolicy of both containers; "" leaves Kubernetes' default."""
    resources: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """ResourceRequirements for the worker container when spec.resources is empty."""
    devices_per_host: int = 0
    """Host size for slices without spec.devicesPerHost; 0: the island's machine size."""


def pod_name(slice_name: str, index: int) -> str:
    """Host ``index`` of slice ``x`` is pod ``x-<index>`` (the name is reused by later generations)."""
    return f"{slice_name}-{index}"


def host_name(slice_name: str, index: int) -> str:
    """The name hosts and error messages use: ``<slice>/host-<index>``."""
    return f"{slice_name}/host-{index}"


def placement_to_json(placement: Placement) -> str:
    raw: Json = {
        "island": placement.island,
        "hosts": [
            {"index": h.index, "node": h.machine, "devices": h.devices} for h in placement.hosts
        ],
    }
    needs = placement.host_resources
    if needs:
        raw["hostResources"] = {"cpuMillis": needs.cpu_millis, "memoryBytes": needs.memory_bytes}
    return json.dumps(raw, separators=(",", ":"))


def placement_from_json(slice_key: str, text: str) -> Placement | None:
    """The placement an annotation records, or None if it is missing or unreadable."""
    try:
        raw = json.loads(text)
        hosts = tuple(
            HostAssignment(int(h["index"]), str(h["node"]), int(h["devices"]))
            for h in raw["hosts"]
        )
        needs = raw.get("hostResources") or {}
        resources = HostResources(int(needs.get("cpuMillis", 0)), int(needs.get("memoryBytes", 0)))
        return Placement(slice_key, str(raw["island"]), hosts, resources)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def slice_labels(slice_name: str) -> dict[str, str]:
    """The labels every object of VirtualSlice ``slice_name`` bears (its pods, its Secret, its
    host NetworkPolicy), and what selects its pods."""
    return {SLICE_LABEL: slice_name, MANAGED_BY_LABEL: MANAGED_BY}


def slice_object_metadata(vslice: VirtualSliceObject, name: str) -> Json:
    """Metadata of an object ``name`` the slice keeps beside its pods: labelled with the slice
    and controlled by it, so it goes when the slice goes."""
    return {
        "name": name,
        "namespace": vslice.namespace,
        "labels": slice_labels(vslice.name),
        "ownerReferences": [vslice.owner_reference()],
    }


def token_secret_name(slice_name: str) -> str:
    """The Secret holding the slice token of VirtualSlice ``slice_name``."""
    return f"{slice_name}-pathways-token"


def token_secret_manifest(vslice: VirtualSliceObject, token: str) -> Json:
    """The slice's token Secret, owned by the VirtualSlice so it goes when the slice goes."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": slice_object_metadata(vslice, token_secret_name(vslice.name)),
        "stringData": {TOKEN_KEY: token},
    }


def _env(name: str, value: str) -> Json:
    return {"name": name, "value": value}


def _resources(extra: Mapping[str, Any], devices: int) -> Json:
    requests = dict(extra.get("requests") or {})
    limits = dict(extra.get("limits") or {})
    requests[DEVICE_RESOURCE] = str(devices)
    limits[DEVICE_RESOURCE] = str(devices)
    return {"requests": requests, "limits": limits}


def container_resources(vslice: VirtualSliceObject, defaults: WorkerDefaults, devices: int) -> tuple[Json, Json]:
    """ResourceRequirements of the worker and the dataflow sidecar of one host of ``devices`` devices."""
    worker = _resources(worker_resources_source(vslice, defaults)[0], devices)
    return worker, {}


def worker_resources_source(vslice: VirtualSliceObject, defaults: WorkerDefaults) -> tuple[Mapping[str, Any], str]:
    """The ResourceRequirements the worker container gets, and where they come from (for messages)."""
    if vslice.spec.resources:
        return vslice.spec.resources, "spec.resources"
    return defaults.resources, "--worker-resources (PATHWAYS_WORKER_RESOURCES)"


_CPU = "cpu"
_MEMORY = "memory"
_QUANTITY_HINT = "is not a Kubernetes quantity (examples: 500m, 2, 4Gi)"


def quantity(value: object, field: str) -> Decimal:
    """A Kubernetes quantity (``500m``, ``2``, ``4Gi``, ``1e3``) as a number; ValueError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{field}: {value!r} {_QUANTITY_HINT}")
    try:
        number = Decimal(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, ArithmeticError):
        raise ValueError(f"{field}: {value!r} {_QUANTITY_HINT}") from None
    if not number.is_finite():
        raise ValueError(f"{field}: {value!r} {_QUANTITY_HINT}")
    if number < 0:
        raise ValueError(f"{field}: {value!r} is negative; requests and limits must be 0 or more")
    return number


def check_resources(resources: Mapping[str, Any], where: str) -> None:
    """Raise ValueError naming the field if ``resources`` is not ResourceRequirements of valid quantities."""
    parsed: dict[str, dict[str, Decimal]] = {}
    for part in ("requests", "limits"):
        amounts = resources.get(part) or {}
        if not isinstance(amounts, Mapping):
            raise ValueError(f"{where}.{part} must be a map of resource name to quantity, not {amounts!r}")
        parsed[part] = {name: quantity(value, f"{where}.{part}.{name}") for name, value in amounts.items()}
    for name, request in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if limit is not None and request > limit:
            raise ValueError(
                f"{where}.requests.{name} ({resources['requests'][name]}) is more than "
                f"{where}.limits.{name} ({resources['limits'][name]}); a request must be at most its limit"
            )


def host_resources(vslice: VirtualSliceObject, defaults: WorkerDefaults) -> HostResources:
    """CPU and memory one host's pod requests, both containers together; ValueError naming a malformed field."""
    source, where = worker_resources_source(vslice, defaults)
    check_resources(source, where)
    worker, sidecar = container_resources(vslice, defaults, 0)
    return requested_resources({"spec": {"containers": [{"resources": worker}, {"resources": sidecar}]}})


def _requests(container: Mapping[str, Any]) -> tuple[int, int]:
    """(cpu millicores, memory bytes) a container requests; a limit alone sets the request, as the API server does."""
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    counted = []
    for name, scale in ((_CPU, 1000), (_MEMORY, 1)):
        try:
            counted.append(math.ceil(quantity(requests.get(name, limits.get(name, 0)), name) * scale))
        except ValueError:
            counted.append(0)  # the API server validated it; nothing sensible to count otherwise
    return counted[0], counted[1]


def _sum(pairs: Iterable[tuple[int, int]]) -> tuple[int, int]:
    cpu = memory = 0
    for c, m in pairs:
        cpu, memory = cpu + c, memory + m
    return cpu, memory


def requested_resources(pod: Mapping[str, Any]) -> HostResources:
    """CPU and memory a pod holds on its Node, as kube-scheduler's NodeResourcesFit counts them.

    The sum over containers and restartable (sidecar) init containers, or the peak of an
    init container running beside the sidecars started before it if that is larger, plus
    the pod's overhead.
    """
    spec = pod.get("spec") or {}
    cpu, memory = _sum(_requests(c) for c in spec.get("containers") or [])
    side_cpu = side_memory = peak_cpu = peak_memory = 0
    for init in spec.get("initContainers") or []:
        c, m = _requests(init)
        if init.get("restartPolicy") == "Always":
            side_cpu, side_memory = side_cpu + c, side_memory + m
            peak_cpu, peak_memory = max(peak_cpu, side_cpu), max(peak_memory, side_memory)
        else:
            peak_cpu, peak_memory = max(peak_cpu, side_cpu + c), max(peak_memory, side_memory + m)
    cpu, memory = max(cpu + side_cpu, peak_cpu), max(memory + side_memory, peak_memory)
    over_cpu, over_memory = _requests({"resources": {"requests": spec.get("overhead") or {}}})
    return HostResources(cpu + over_cpu, memory + over_memory)


def host_pod_manifest(
    vslice: VirtualSliceObject,
    placement: Placement,
    index: int,
    generation: int,
    defaults: WorkerDefaults,
) -> Json:
    """The pod for host ``index`` of the gang. Host 0's worker serves the JAX coordinator on
    its own pod IP; the others get no address here (it does not exist yet) and wait for
    the one their sidecar is told (``pathways_worker.coordinator_file``)."""
    host = placement.hosts[index]
    image = vslice.spec.image or defaults.image
    hostname = host_name(vslice.name, index)
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    shm_mount = [
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "slice-token", "mountPath": TOKEN_DIR, "readOnly": True},
    ]
    common = [
        _env(ENV_TOKEN_FILE, f"{TOKEN_DIR}/{TOKEN_KEY}"),
        _env(host_env.SHM_DIR, SHM_DIR),
        _env(host_env.HOST_NAME, hostname),
        _env(host_env.SLICE, vslice.name),
        _env(host_env.NAMESPACE, vslice.namespace),
    ]
    worker_resources, sidecar_resources = container_resources(vslice, defaults, host.devices)
    worker = {
        "name": WORKER_CONTAINER,
        "image": image,
        "command": ["python", "-m", "pathways_worker.worker"],
        "env": [
            pod_ip,
            _env(host_env.WORKER_LISTEN, f"$(POD_IP):{WORKER_PORT}"),
            _env(host_env.HOST_INDEX, str(index)),
            _env(host_env.NUM_HOSTS, str(len(placement.hosts))),
            *([_env(host_env.COORDINATOR, f"$(POD_IP):{COORDINATOR_PORT}")] if index == 0 else []),
            _env(host_env.DEVICES, str(host.devices)),
            *common,
        ],
        "ports": [
            {"name": "worker", "containerPort": WORKER_PORT},
            {"name": "coordinator", "containerPort": COORDINATOR_PORT},
        ],
        "resources": worker_resources,
        "volumeMounts": shm_mount,
    }
    sidecar = {
        "name": SIDECAR_CONTAINER,
        "image": image,
        "command": ["python", "-m", "pathways_worker.sidecar"],
        "env": [
            pod_ip,
            _env(host_env.SIDECAR_LISTEN, f"$(POD_IP):{SIDECAR_PORT}"),
            _env(host_env.WORKER_ADDRESS, f"$(POD_IP):{WORKER_PORT}"),
            _env(host_env.SIDECAR_METRICS_PORT, str(SIDECAR_METRICS_PORT)),
            *common,
        ],
        "ports": [
            {"name": "dataflow", "containerPort": SIDECAR_PORT},
            {"name": "metrics", "containerPort": SIDECAR_METRICS_PORT},
        ],
        "readinessProbe": {
            "tcpSocket": {"port": SIDECAR_PORT},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "resources": sidecar_resources,
        "volumeMounts": shm_mount,
    }
    if defaults.pull_policy:
        worker["imagePullPolicy"] = sidecar["imagePullPolicy"] = defaults.pull_policy
    spec: Json = {
        "schedulerName": SCHEDULER_NAME,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "enableServiceLinks": False,
        # A host talks to its sidecar, its peers and the controller, never to the API server.
        "automountServiceAccountToken": False,
        "containers": [worker, sidecar],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
            {
                "name": "slice-token",
                "secret": {"secretName": token_secret_name(vslice.name), "defaultMode": 0o400},
            },
        ],
    }
    if vslice.spec.priority_class:
        spec["priorityClassName"] = vslice.spec.priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(vslice.name, index),
            "namespace": vslice.namespace,
            "labels": {
                **slice_labels(vslice.name),
                HOST_INDEX_LABEL: str(index),
                GENERATION_LABEL: str(generation),
            },
            "annotations": {PLACEMENT_ANNOTATION: placement_to_json(placement)},
            "ownerReferences": [vslice.owner_reference()],
        },
        "spec": spec,
    }


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    value = labels.get(key, "")
    return int(value) if value.isdigit() else None


def requested_devices(pod: Mapping[str, Any]) -> int:
    """``pathways.dev/device`` requested by a pod's containers (what it holds once bound)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        requests = (c.get("resources") or {}).get("requests") or {}
        limits = (c.get("resources") or {}).get("limits") or {}
        value = requests.get(DEVICE_RESOURCE, limits.get(DEVICE_RESOURCE, 0))
        try:
            total += int(str(value))
        except ValueError:
            continue
    return total


def _failure(phase: str, status: Mapping[str, Any]) -> str:
    for cs in status.get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated:
            return (
                f"container {cs.get('name')} exited with code "
                f"{terminated.get('exitCode')} ({terminated.get('reason') or 'Terminated'})"
            )
    if phase == "Failed":
        return str(status.get("message") or status.get("reason") or "phase Failed, no reason given")
    return ""


@dataclasses.dataclass(frozen=True)
class PodView:
    """What the operator needs to know about one pod."""

    namespace: str
    name: str
    uid: str
    node: str
    phase: str
    ip: str
    ready: bool
    deleting: bool
    devices: int
    slice: str | None
    host_index: int | None
    generation: int | None
    controller_uid: str
    """The uid of the pod's controller (ownerReference with ``controller: true``), or ""."""
    failure: str
    """Why the host is gone ("container worker exited with code 1 (Error)"), or ""."""
    placement_json: str
    cpu_millis: int = 0
    """CPU and memory the pod requests (what it holds on its Node while live)."""
    memory_bytes: int = 0

    @property
    def live(self) -> bool:
        """Holds its devices: not finished (a terminating pod still holds them)."""
        return self.phase not in ("Succeeded", "Failed")

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> PodView:
        meta = raw.get("metadata") or {}
        status = raw.get("status") or {}
        labels = meta.get("labels") or {}
        name = str(meta.get("name") or "")
        phase = str(status.get("phase") or "Pending")
        conditions = status.get("conditions") or []
        holds = requested_resources(raw)
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=name,
            uid=str(meta.get("uid") or ""),
            node=str((raw.get("spec") or {}).get("nodeName") or ""),
            phase=phase,
            ip=str(status.get("podIP") or ""),
            ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
            deleting=bool(meta.get("deletionTimestamp")),
            devices=requested_devices(raw),
            slice=labels.get(SLICE_LABEL),
            host_index=_label_int(labels, HOST_INDEX_LABEL),
            generation=_label_int(labels, GENERATION_LABEL),
            controller_uid=controller.uid if (controller := controller_of(owner_refs(meta))) else "",
            failure=_failure(phase, status),
            placement_json=str((meta.get("annotations") or {}).get(PLACEMENT_ANNOTATION) or ""),
            cpu_millis=holds.cpu_millis,
            memory_bytes=holds.memory_bytes,
        )
