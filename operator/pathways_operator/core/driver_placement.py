"""Where a program's driver pod goes: a Node with its CPU and memory free, or why none.

A PathwaysProgram's driver is a pod of its own (``<program>-driver``). Its slices
are of no use without it, so admission (``core.admission``) admits the driver
with the program's admission group: after the group's hosts are placed, the
driver must also fit on one Node, or nothing of the program is admitted. The
driver asks for no devices, so any Node will do, with or without devices, as
long as it is schedulable, carries the labels of the driver's ``nodeSelector``
and every taint that repels pods (``NoSchedule``, ``NoExecute``) is tolerated.

:class:`NodeRoom` keeps the free CPU and memory of every Node through one
admission pass: the hosts of each admitted gang and each admitted driver are
taken from it, so two drivers admitted in one pass never share the last CPU of
a Node (a driver on a machine is also counted in admission's inventory, so no
host takes its CPU either). Among the Nodes that fit, the best fit wins (least CPU left, then least
memory left, then the name), which keeps roomy Nodes for big drivers and makes
every pass over the same inputs choose the same Node. When none fits,
:meth:`NodeRoom.place` says why with the numbers: what the driver requests and
the most a Node offers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from pathways_operator.core.placement import HostResources, Placement, cpu_text, memory_text

REPELLING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Taint effects that keep a pod off a Node unless it tolerates them (PreferNoSchedule only prefers)."""


@dataclasses.dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclasses.dataclass(frozen=True)
class Toleration:
    """A pod toleration as core/v1 defines it; an empty key with ``Exists`` tolerates every taint."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclasses.dataclass(frozen=True)
class Node:
    """Any Node of the cluster, with the CPU and memory its live pods and promised pods use."""

    name: str
    schedulable: bool = True
    allocatable_cpu_millis: int = 0
    allocatable_memory_bytes: int = 0
    used_cpu_millis: int = 0
    used_memory_bytes: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    island: str = ""
    """The island of a Node that is also a machine (offers devices); "" for any other Node."""


@dataclasses.dataclass(frozen=True)
class DriverRequest:
    """What a program's driver pod asks of a Node."""

    program: str
    """``namespace/name`` of the PathwaysProgram."""
    resources: HostResources = HostResources()
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()

    def accepts(self, node: Node) -> bool:
        """Whether the driver may run on ``node`` at all (schedulable, selected, every repelling taint tolerated)."""
        if not node.schedulable:
            return False
        if any(node.labels.get(k) != v for k, v in self.node_selector.items()):
            return False
        return all(
            any(t.tolerates(taint) for t in self.tolerations)
            for taint in node.taints if taint.effect in REPELLING_EFFECTS
        )


@dataclasses.dataclass(frozen=True)
class DriverPlacement:
    """The driver of ``program`` runs on ``node``, taking ``resources`` there."""

    program: str
    node: str
    resources: HostResources = HostResources()


def _fits(free_cpu: int, free_memory: int, needs: HostResources) -> bool:
    """As kube-scheduler's NodeResourcesFit: a resource the pod does not request never limits it."""
    return (not needs.cpu_millis or free_cpu >= needs.cpu_millis) and (
        not needs.memory_bytes or free_memory >= needs.memory_bytes
    )


class NodeRoom:
    """Free CPU and memory per Node through one admission pass; what gangs and drivers take comes off."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self._nodes = {n.name: n for n in nodes}
        self._used = {n.name: (n.used_cpu_millis, n.used_memory_bytes) for n in self._nodes.values()}

    def island_of(self, name: str) -> str:
        return self._nodes[name].island

    def free(self, name: str) -> tuple[int, int]:
        node = self._nodes[name]
        cpu, memory = self._used[name]
        return node.allocatable_cpu_millis - cpu, node.allocatable_memory_bytes - memory

    def take_hosts(self, placements: Iterable[Placement]) -> None:
        """Count the hosts of ``placements`` on their Nodes (a machine is a Node too)."""
        for name, (cpu, memory) in _hosts_usage(placements).items():
            self._take(name, cpu, memory)

    def take(self, driver: DriverPlacement) -> None:
        self._take(driver.node, driver.resources.cpu_millis, driver.resources.memory_bytes)

    def _take(self, name: str, cpu: int, memory: int) -> None:
        if name in self._used:
            used_cpu, used_memory = self._used[name]
            self._used[name] = (used_cpu + cpu, used_memory + memory)

    def place(self, request: DriverRequest, beside: Iterable[Placement] = ()) -> DriverPlacement | str:
        """The Node for ``request`` once the hosts ``beside`` it are placed too; else why none fits."""
        extra = _hosts_usage(beside)
        eligible = []
        for node in sorted(self._nodes.values(), key=lambda n: n.name):
            if request.accepts(node):
                cpu, memory = self.free(node.name)
                more_cpu, more_memory = extra.get(node.name, (0, 0))
                eligible.append((node, cpu - more_cpu, memory - more_memory))
        needs = request.resources
        fitting = [(n, c, m) for n, c, m in eligible if _fits(c, m, needs)]
        if fitting:
            node, _, _ = min(fitting, key=lambda f: (f[1] - needs.cpu_millis, f[2] - needs.memory_bytes, f[0].name))
            return DriverPlacement(request.program, node.name, needs)
        return _refusal(request, eligible)


def _hosts_usage(placements: Iterable[Placement]) -> dict[str, tuple[int, int]]:
    usage: dict[str, tuple[int, int]] = {}
    for placement in placements:
        needs = placement.host_resources
        for name, hosts in placement.hosts_by_machine().items():
            cpu, memory = usage.get(name, (0, 0))
            usage[name] = (cpu + hosts * needs.cpu_millis, memory + hosts * needs.memory_bytes)
    return usage


def _refusal(request: DriverRequest, eligible: list[tuple[Node, int, int]]) -> str:
    """Why the driver fits no Node: what it requests and the most any Node it may use offers."""
    needs = request.resources
    what = f"the driver of PathwaysProgram {request.program} requests {needs.text()}"
    if not eligible:
        selector = ",".join(f"{k}={v}" for k, v in sorted(request.node_selector.items())) or "none"
        return (f"{what}, but no Node it may use is schedulable (nodeSelector: {selector}; every NoSchedule or "
                "NoExecute taint must be tolerated); change spec.driver.nodeSelector or spec.driver.tolerations, "
                "or add such a Node")
    node, cpu, memory = min(eligible, key=lambda e: (-e[1], -e[2], e[0].name))
    offer = f"the most a Node offers is {node.name} with cpu {cpu_text(max(cpu, 0))}, memory {memory_text(max(memory, 0))} free"
    ever = any(_fits(n.allocatable_cpu_millis, n.allocatable_memory_bytes, needs) for n, _, _ in eligible)
    if ever:
        return f"{what}; {offer}; it is admitted once a Node has room"
    return f"{what}; {offer}, and no Node has that much allocatable: lower spec.driver.resources, or add a bigger Node"
