"""Machines and the devices in use: the resource manager's view of the cluster.

A *machine* is a Node labelled ``pathways.dev/island`` whose allocatable
``pathways.dev/device`` is positive; it is schedulable while it is Ready and not
cordoned. Devices, CPU and memory in use on a machine are counted the way
kube-scheduler's NodeResourcesFit counts requests, plus what the operator has
promised:

* the requests of every live pod bound there, gang pods or not (a pod still
  terminating holds its devices until it is gone; a Failed or Succeeded pod
  holds none), and
* for every admitted gang (a :class:`Reservation`), the hosts whose pod does
  not exist yet, each with the gang's devices per host, CPU and memory. Host 0 of a gang is created first and the others only once its
  IP is known, so without this a second gang could be admitted onto devices
  the first one is about to take;
* for every admitted program driver (a ``DriverPlacement``) whose pod does not
  exist yet, its CPU and memory on the Node admission chose for it.

:func:`nodes` lists every Node, with devices or not, with the CPU and memory in
use counted the same way: a driver pod may go to any of them.

Everything here is a pure function of what was listed from the API and the
reservation ledger; :class:`ReservationLedger` is the one piece of state, and
it is rebuilt from pod annotations and slice status after a restart.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pathways_operator.core.driver_placement import DriverPlacement, Node, Taint
from pathways_operator.core.placement import Machine, Placement
from pathways_operator.k8s.gang_pods import PodView, quantity
from pathways_wire.driver_protocol import driver_pod_name
from pathways_wire.kube_names import DEVICE_RESOURCE, ISLAND_LABEL


@dataclasses.dataclass(frozen=True)
class Reservation:
    """Devices promised to one generation of one slice's gang."""

    namespace: str
    slice: str
    generation: int
    placement: Placement

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.slice}"


class ReservationLedger:
    """Admitted placements by slice key; thread-safe, since reconciles run in parallel."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, Reservation] = {}

    def get(self, key: str) -> Reservation | None:
        with self._lock:
            return self._by_key.get(key)

    def reserve(self, reservation: Reservation) -> None:
        with self._lock:
            self._by_key[reservation.key] = reservation

    def adopt(self, reservation: Reservation) -> Reservation:
        """Record ``reservation`` unless the slice already has one; returns the one kept."""
        with self._lock:
            return self._by_key.setdefault(reservation.key, reservation)

    def release(self, key: str) -> Reservation | None:
        with self._lock:
            return self._by_key.pop(key, None)

    def all(self) -> list[Reservation]:
        with self._lock:
            return list(self._by_key.values())


def _allocatable_devices(node: Mapping[str, Any]) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(DEVICE_RESOURCE, "0")
    try:
        return int(str(value))
    except ValueError:
        return 0


def _allocatable(node: Mapping[str, Any], resource: str, scale: int) -> int:
    """Allocatable ``resource`` in its smallest unit (millicores: scale 1000); 0 when absent or unreadable."""
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource, 0)
    try:
        return math.floor(quantity(value, resource) * scale)
    except ValueError:
        return 0


UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
"""The node lifecycle controller's taint for a Node whose kubelet stopped reporting."""


def unreachable(node: Mapping[str, Any]) -> bool:
    """Whether the Node's kubelet stopped reporting: its pods' deletions will not be confirmed."""
    taints = (node.get("spec") or {}).get("taints") or []
    return any(t.get("key") == UNREACHABLE_TAINT and t.get("effect") == "NoExecute" for t in taints)


def _machine_island(node: Mapping[str, Any]) -> str:
    """The island of a Node that is a machine (labelled, with devices); "" for any other Node."""
    island = ((node.get("metadata") or {}).get("labels") or {}).get(ISLAND_LABEL)
    return str(island) if island and _allocatable_devices(node) > 0 else ""


def _schedulable(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def admission_view(node: Mapping[str, Any]) -> tuple[list[Machine], list[Node]]:
    """What admission reads of a Node, with nothing in use: the machine it is (`machines_using`)
    and the Node a driver may go to (`nodes`). A change of it may let a waiting gang or
    driver in, and a Node whose status changed in nothing else (a heartbeat, its images)
    cannot."""
    return machines_using([node], {}), nodes([node], {})


def in_use(
    pods: Iterable[PodView], reservations: Iterable[Reservation], drivers: Iterable[DriverPlacement]
) -> dict[str, list[int]]:
    """Node -> [devices, cpu millicores, memory bytes] held by live pods and promised to pods not there yet."""
    live = [p for p in pods if p.live and p.node]  # unbound pods hold nothing yet
    used: dict[str, list[int]] = {}
    for pod in live:
        held = used.setdefault(pod.node, [0, 0, 0])
        held[0] += pod.devices
        held[1] += pod.cpu_millis
        held[2] += pod.memory_bytes
    existing = {(p.namespace, p.slice, p.generation, p.host_index) for p in live if p.slice}
    for r in reservations:
        needs = r.placement.host_resources
        for host in r.placement.hosts:
            if (r.namespace, r.slice, r.generation, host.index) not in existing:
                held = used.setdefault(host.machine, [0, 0, 0])
                held[0] += host.devices
                held[1] += needs.cpu_millis
                held[2] += needs.memory_bytes
    driver_pods = {(p.namespace, p.name) for p in live}  # bound: it holds its own requests
    for d in drivers:
        if driver_pod_key(d) not in driver_pods:
            held = used.setdefault(d.node, [0, 0, 0])
            held[1] += d.resources.cpu_millis
            held[2] += d.resources.memory_bytes
    return used


def driver_pod_key(driver: DriverPlacement) -> tuple[str, str]:
    """(namespace, pod name) of the driver pod ``driver`` is promised to."""
    namespace, _, program = driver.program.partition("/")
    return namespace, driver_pod_name(program)


def machines(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[PodView],
    reservations: Iterable[Reservation],
    drivers: Iterable[DriverPlacement] = (),
) -> list[Machine]:
    """Every machine with its devices in use; see the module docstring for what counts."""
    return machines_using(nodes, in_use(pods, reservations, drivers))


def machines_using(nodes: Iterable[Mapping[str, Any]], used: Mapping[str, Sequence[int]]) -> list[Machine]:
    """Every machine, with what :func:`in_use` counted there (one count serves :func:`nodes` too)."""
    result: list[Machine] = []
    for node in nodes:
        island = _machine_island(node)
        if not island:
            continue
        meta = node.get("metadata") or {}
        allocatable = _allocatable_devices(node)
        name = str(meta.get("name"))
        devices, cpu, memory = used.get(name, (0, 0, 0))
        result.append(Machine(
            name, str(island), allocatable, devices, _schedulable(node),
            allocatable_cpu_millis=_allocatable(node, "cpu", 1000),
            allocatable_memory_bytes=_allocatable(node, "memory", 1),
            used_cpu_millis=cpu,
            used_memory_bytes=memory,
        ))
    return sorted(result, key=lambda m: m.name)


def nodes(listed: Iterable[Mapping[str, Any]], used: Mapping[str, Sequence[int]]) -> list[Node]:
    """Every Node, with or without devices, with the CPU and memory :func:`in_use` counts there."""
    result = []
    for node in listed:
        meta = node.get("metadata") or {}
        name = str(meta.get("name"))
        _, cpu, memory = used.get(name, (0, 0, 0))
        taints = tuple(
            Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
            for t in (node.get("spec") or {}).get("taints") or []
        )
        result.append(Node(
            name, _schedulable(node),
            allocatable_cpu_millis=_allocatable(node, "cpu", 1000),
            allocatable_memory_bytes=_allocatable(node, "memory", 1),
            used_cpu_millis=cpu,
            used_memory_bytes=memory,
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            taints=taints,
            island=_machine_island(node),
        ))
    return sorted(result, key=lambda n: n.name)
