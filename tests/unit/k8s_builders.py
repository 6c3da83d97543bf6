"""Typed builders of the API objects the operator's ``k8s/`` modules parse: Nodes, pods,
VirtualSlices and PathwaysPrograms as the API server serves them (JSON dicts), so the
unit tests of those modules state only the fields they are about."""

from __future__ import annotations

from typing import Any

from pathways_operator.core.placement import HostAssignment, Placement
from pathways_wire.kube_names import (
    DEVICE_RESOURCE,
    GENERATION_LABEL,
    HOST_INDEX_LABEL,
    ISLAND_LABEL,
    SLICE_LABEL,
)

Json = dict[str, Any]


def node(
    name: str,
    island: str | None,
    devices: int | str,
    *,
    ready: bool = True,
    cordoned: bool = False,
    cpu: str | None = None,
    memory: str | None = None,
) -> Json:
    labels = {ISLAND_LABEL: island} if island else {}
    allocatable = {DEVICE_RESOURCE: str(devices)}
    if cpu is not None:
        allocatable["cpu"] = cpu
    if memory is not None:
        allocatable["memory"] = memory
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    name: str,
    *,
    node: str = "",
    devices: int = 0,
    phase: str = "Running",
    namespace: str = "ns",
    slice_: str | None = None,
    host_index: int | None = None,
    generation: int | None = None,
    ready: bool = False,
    deleting: bool = False,
    terminated: tuple[str, int, str] | None = None,
    requests: dict[str, str] | None = None,
) -> Json:
    """A pod; ``terminated`` is (container, exit code, reason) of a container that ended.

    ``requests`` are the worker container's other requests (cpu, memory).
    """
    labels: dict[str, str] = {}
    if slice_ is not None:
        labels[SLICE_LABEL] = slice_
    if host_index is not None:
        labels[HOST_INDEX_LABEL] = str(host_index)
    if generation is not None:
        labels[GENERATION_LABEL] = str(generation)
    meta: Json = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    wanted = {**(requests or {}), **({DEVICE_RESOURCE: str(devices)} if devices else {})}
    resources = {"requests": wanted} if wanted else {}
    status: Json = {"phase": phase, "podIP": "10.0.0.1" if node else ""}
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    if terminated is not None:
        container, code, reason = terminated
        status["containerStatuses"] = [
            {"name": container, "state": {"terminated": {"exitCode": code, "reason": reason}}}
        ]
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "worker", "resources": resources}]},
        "status": status,
    }


def placement(slice_: str, island: str, *hosts: tuple[str, int]) -> Placement:
    """Hosts as (machine, devices), indexed in order."""
    return Placement(slice_, island, tuple(HostAssignment(i, m, d) for i, (m, d) in enumerate(hosts)))


def virtual_slice(name: str, devices: int, *, namespace: str = "ns", status: Json | None = None, **spec: Any) -> Json:
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "VirtualSlice",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1,
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"devices": devices, **spec},
        "status": status or {},
    }  # fmt: skip


def pathways_program(name: str, *slices: Json, namespace: str = "ns", status: Json | None = None, **spec: Any) -> Json:
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 2},
        "spec": {"slices": list(slices), **spec},
        "status": status or {},
    }


class Clock:
    """A clock the test moves by hand (``clock.now += 1.0``), for the k8s caches' ages."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
