"""Free capacity per island, indexed so that placing a gang does not scan every machine.

Admission places hundreds of gangs against one inventory in one pass. Scanning
every machine for each decision (:func:`~pathways_operator.core.placement.place_gang`)
makes a pass cost gangs × machines. This index keeps, for each island, its
machines grouped by free devices (each group's names kept sorted) and counted by
their free devices, CPU and memory together, plus the fixed counts of what they
offer when empty. A question about an island then costs the number of distinct
free amounts there, which is small for real Nodes (a few machine sizes), and
placing a gang visits only the machines its hosts land on and those skipped on the
way for lack of CPU or memory. Reserving a placement moves just its machines
between groups, and an admission group that does not fit restores them. Each
island also remembers how each gang shape fits it until one of its machines
changes: a queue of many gangs of a few shapes judges an unchanged island once
per shape, not once per gang.

The index answers :class:`~pathways_operator.core.placement.IslandCapacity` with
the numbers a scan gives, so :func:`~pathways_operator.core.placement.place_on_islands`
makes the same decision and writes the same message either way; a property test
holds the two to that on many random clusters.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Collection, Sequence

from pathways_operator.core.placement import (
    FitKey,
    GangRequest,
    HostResources,
    IslandFit,
    Machine,
    Placement,
    Unplaceable,
    check_machines,
    hosts_fitting,
    place_on_islands,
    roomiest_when_empty,
    with_placement,
)


class CapacityIndex:
    """An :class:`~pathways_operator.core.placement.Inventory` that keeps free capacity indexed per island."""

    def __init__(self, machines: Sequence[Machine]) -> None:
        check_machines(machines)
        by_island: dict[str, list[Machine]] = {}
        for m in machines:
            by_island.setdefault(m.island, []).append(m)
        self._islands = {island: _IslandIndex(ms) for island, ms in by_island.items()}
        self._island_of = {m.name: m.island for m in machines}
        self._order = [m.name for m in machines]

    def machines(self) -> list[Machine]:
        """Every machine as it is now, in the order given."""
        return [self._islands[self._island_of[name]].machine(name) for name in self._order]

    def place(self, request: GangRequest, excluding: Collection[str] = ()) -> Placement | Unplaceable:
        """The decision :func:`~pathways_operator.core.placement.place_gang` makes, without its scan."""
        if not excluding:
            return place_on_islands(request, self._islands)
        return place_on_islands(request, {k: v for k, v in self._islands.items() if k not in excluding})

    def reserve(self, placement: Placement) -> list[Machine]:
        """Count ``placement``'s devices, CPU and memory as used; returns its machines as they were."""
        hosts = placement.hosts_by_machine()
        previous = []
        for name, devices in placement.devices_by_machine().items():
            island = self._islands[self._island(name, placement)]
            before = island.machine(name)
            previous.append(before)
            island.update(with_placement(before, devices, hosts[name], placement.host_resources))
        return previous

    def restore(self, previous: Sequence[Machine]) -> None:
        """Put machines back as :meth:`reserve` returned them, undoing reserves newest first."""
        for m in reversed(previous):
            self._islands[self._island(m.name, m)].update(m)

    def _island(self, name: str, source: Placement | Machine) -> str:
        island = self._island_of.get(name)
        if island is None:
            raise ValueError(f"{source!r} names machine {name!r}, which this inventory does not have; "
                             "build the index from the machines the placement was made on")
        return island


class _IslandIndex:
    """One island's machines, counted by free and allocatable amounts (an ``IslandCapacity``)."""

    def __init__(self, machines: Sequence[Machine]) -> None:
        self._machines: dict[str, Machine] = {}
        self._by_free: dict[int, list[str]] = {}
        """Free devices -> names of the machines with that many free, sorted."""
        self._by_free_resources: dict[int, Counter[tuple[int, int]]] = {}
        """Free devices of schedulable machines -> how many have each (free cpu, free memory)."""
        self._free = 0
        self._total = sum(m.allocatable_devices for m in machines)
        self._largest = max(m.allocatable_devices for m in machines)
        self._largest_machine = min(m.name for m in machines if m.allocatable_devices == self._largest)
        self._empty = Counter(
            (m.allocatable_devices, m.allocatable_cpu_millis, m.allocatable_memory_bytes) for m in machines
        )
        self._roomiest: dict[tuple[int, HostResources], Machine] = {}
        self._empty_slots: dict[tuple[int, HostResources], int] = {}
        self._judged: dict[FitKey, IslandFit] = {}
        for m in machines:
            self._add(m)

    def machine(self, name: str) -> Machine:
        return self._machines[name]

    def update(self, machine: Machine) -> None:
        """Replace a machine by itself with other used amounts or schedulability."""
        before = self._machines[machine.name]
        if (machine.island, machine.allocatable_devices, machine.allocatable_cpu_millis,
                machine.allocatable_memory_bytes) != (before.island, before.allocatable_devices,
                                                      before.allocatable_cpu_millis,
                                                      before.allocatable_memory_bytes):
            raise ValueError(f"machine {machine.name!r} changed its island or allocatable amounts; "
                             "build a new index from the new inventory")
        self._remove(before)
        self._add(machine)
        self._judged.clear()

    def judged(self) -> dict[FitKey, IslandFit]:
        return self._judged

    def _add(self, m: Machine) -> None:
        self._machines[m.name] = m
        free = m.free_devices
        self._free += free
        bisect.insort(self._by_free.setdefault(free, []), m.name)
        if m.schedulable:
            devices, cpu, memory = m.free_resources()
            self._by_free_resources.setdefault(devices, Counter())[(cpu, memory)] += 1

    def _remove(self, m: Machine) -> None:
        free = m.free_devices
        self._free -= free
        names = self._by_free[free]
        del names[bisect.bisect_left(names, m.name)]
        if not names:
            del self._by_free[free]
        if m.schedulable:
            devices, cpu, memory = m.free_resources()
            counts = self._by_free_resources[devices]
            counts[(cpu, memory)] -= 1
            if not counts[(cpu, memory)]:
                del counts[(cpu, memory)]
            if not counts:
                del self._by_free_resources[devices]

    def total_devices(self) -> int:
        return self._total

    def largest_devices(self) -> int:
        return self._largest

    def largest_machine(self) -> str:
        return self._largest_machine

    def free_devices(self) -> int:
        return self._free

    def device_slots(self, host_size: int) -> int:
        return sum(len(names) * (free // host_size) for free, names in self._by_free.items())

    def free_slots(self, host_size: int, needs: HostResources, enough: int) -> int:
        slots = 0
        for devices, counts in self._by_free_resources.items():
            if devices < host_size:
                continue
            for (cpu, memory), count in counts.items():
                slots += count * hosts_fitting(devices, cpu, memory, host_size, needs)
                if slots >= enough:
                    return slots
        return slots

    def empty_slots(self, host_size: int, needs: HostResources) -> int:
        key = (host_size, needs)
        if key not in self._empty_slots:
            self._empty_slots[key] = sum(count * hosts_fitting(devices, cpu, memory, host_size, needs)
                                         for (devices, cpu, memory), count in self._empty.items())
        return self._empty_slots[key]

    def roomiest_when_empty(self, host_size: int, needs: HostResources) -> Machine:
        key = (host_size, needs)
        if key not in self._roomiest:
            self._roomiest[key] = roomiest_when_empty(self._machines.values(), host_size, needs)
        return self._roomiest[key]

    def assign(self, host_size: int, needs: HostResources, hosts: int) -> tuple[str, ...]:
        chosen: list[str] = []
        for free in sorted(f for f in self._by_free if f >= host_size):
            for name in self._by_free[free]:
                room = self._machines[name].room(host_size, needs)
                chosen.extend([name] * min(room, hosts - len(chosen)))
                if len(chosen) == hosts:
                    return tuple(chosen)
        return tuple(chosen)
