"""Gang placement: where a VirtualSlice's hosts go, all on one island or not at all.

This is the resource manager of the Pathways paper reduced to its decision. A
slice of ``devices`` virtual devices becomes ``devices / devicesPerHost`` hosts
(worker pods); each host needs one machine (Node) with that many free devices,
and every host must be on the same island, because the hosts of a slice run one
JAX multi-process job whose collectives stand in for ICI. Several hosts may
share a machine when it has room: a machine of 8 devices holds two hosts of 4.

The answer is all-or-nothing. :func:`place_gang` returns a :class:`Placement`
only when the whole gang fits; otherwise an :class:`Unplaceable` says why, with
the numbers, and whether waiting can help: ``InsufficientDevices`` (the gang
fits on some island when it drains) is retried, while ``ExceedsIsland``,
``IndivisibleDevices``, ``NoIsland`` and ``InvalidSpec`` will not fit until the
cluster or the spec changes. Because no partial gang ever holds devices, two
gangs can never each hold half of what the other needs.

Choices are deterministic so that every reconcile of the same inputs gives the
same answer: among islands that fit, the best fit (fewest free devices left
afterwards, then island name) wins, which keeps large empty islands for large
gangs; inside the island, hosts go to the fullest machines that still have room
(least free, then name), which keeps whole machines free.

A host needs more than devices: its pod's containers request CPU and memory
(:class:`HostResources`), and a machine takes a host only when its free devices,
free CPU and free memory all cover it, which is kube-scheduler's NodeResourcesFit
applied to every host of the gang. A gang whose hosts are too big for any
machine even when it is empty waits with ``InsufficientResources`` and a message
naming the resource, what one host needs and what the best machine has.

Free devices, CPU and memory are ``allocatable - used`` of schedulable machines;
the caller computes ``used`` from the requests of live pods and from earlier
placements. Nothing here does I/O.

The decision (:func:`place_on_islands`) asks each island a few questions
(:class:`IslandCapacity`: free devices, hosts that fit now, hosts that fit when
empty, which machines to use). :func:`place_gang` answers them by scanning every
machine, which is the reference; ``free_capacity.CapacityIndex`` answers them from
counts it keeps per island, for admission's many decisions against one inventory.

The module runs to about 650 lines because the decision and its explanation are one
concept: ``Unplaceable`` reads the same per-island fits that choose the island, so the
message a waiting gang shows cannot disagree with why it waits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol

from pathways_wire.wording import plural
from pathways_operator.core.reasons import Reason

RETRYABLE_REASONS = frozenset({Reason.INSUFFICIENT_DEVICES, Reason.ISLAND_RESERVED})
"""Reasons for which waiting (devices freeing up) can lead to a placement."""

_LISTED_ISLANDS = 4


@dataclasses.dataclass(frozen=True)
class HostResources:
    """CPU and memory one host's pod requests besides devices (both containers together)."""

    cpu_millis: int = 0
    memory_bytes: int = 0

    def __bool__(self) -> bool:
        return bool(self.cpu_millis or self.memory_bytes)

    def text(self) -> str:
        """The resources requested, as a message says them: ``cpu 2, memory 4Gi``."""
        parts = []
        if self.cpu_millis:
            parts.append(f"cpu {cpu_text(self.cpu_millis)}")
        if self.memory_bytes:
            parts.append(f"memory {memory_text(self.memory_bytes)}")
        return ", ".join(parts) or "no cpu or memory"


def cpu_text(millis: int) -> str:
    """CPU as a Kubernetes quantity: 2, 1500m."""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def memory_text(count: int) -> str:
    """Bytes as a Kubernetes quantity, in the largest unit that divides them: 4Gi, 1500M, 123."""
    for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10),
                         ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if count >= unit and count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


_NO_NEEDS = HostResources()


@dataclasses.dataclass(frozen=True)
class Machine:
    """A Node that offers devices: ``pathways.dev/device`` allocatable, and its island label."""

    name: str
    island: str
    allocatable_devices: int
    used_devices: int = 0
    schedulable: bool = True
    """False for cordoned or not-ready Nodes: they count for "could ever fit" but take no hosts."""
    allocatable_cpu_millis: int = 0
    """The Node's allocatable cpu; 0 when it advertises none (then no host requesting cpu fits)."""
    allocatable_memory_bytes: int = 0
    used_cpu_millis: int = 0
    """Requests of the live pods bound there, and of promised hosts (as for devices)."""
    used_memory_bytes: int = 0

    @property
    def free_devices(self) -> int:
        """Devices a new host may take now (never negative, even if over-committed)."""
        if not self.schedulable:
            return 0
        return max(0, self.allocatable_devices - self.used_devices)

    def room(self, host_size: int, needs: HostResources, *, empty: bool = False) -> int:
        """How many hosts of ``host_size`` devices and ``needs`` fit now (or when ``empty``)."""
        if empty:
            return hosts_fitting(self.allocatable_devices, self.allocatable_cpu_millis,
                                 self.allocatable_memory_bytes, host_size, needs)
        if not self.schedulable:
            return 0
        return hosts_fitting(*self.free_resources(), host_size, needs)

    def free_resources(self) -> tuple[int, int, int]:
        """Free devices, CPU and memory of a schedulable machine (any may be negative if over-committed)."""
        return (self.allocatable_devices - self.used_devices,
                self.allocatable_cpu_millis - self.used_cpu_millis,
                self.allocatable_memory_bytes - self.used_memory_bytes)


def hosts_fitting(devices: int, cpu_millis: int, memory_bytes: int, host_size: int, needs: HostResources) -> int:
    """How many hosts of ``host_size`` devices and ``needs`` fit in the free amounts given.

    A resource a host does not request never limits it, as in kube-scheduler.
    """
    slots = devices // host_size
    if slots <= 0:
        return 0
    if needs.cpu_millis:
        slots = min(slots, cpu_millis // needs.cpu_millis) if cpu_millis > 0 else 0
    if needs.memory_bytes and slots:
        slots = min(slots, memory_bytes // needs.memory_bytes) if memory_bytes > 0 else 0
    return slots


@dataclasses.dataclass(frozen=True)
class GangRequest:
    """What a VirtualSlice asks of the resource manager."""

    slice: str
    devices: int
    devices_per_host: int | None = None
    """None: the island's machine size (the largest allocatable there), or ``devices`` if smaller."""
    island: str | None = None
    """None: any island; otherwise the only island considered."""
    host_resources: HostResources = HostResources()
    """CPU and memory each host's pod requests; a machine must have them free too."""


@dataclasses.dataclass(frozen=True)
class HostAssignment:
    """Host ``index`` of the gang runs on ``machine`` with ``devices`` devices."""

    index: int
    machine: str
    devices: int


@dataclasses.dataclass(frozen=True)
class Placement:
    """A whole gang placed on one island; host indices are 0..n-1 (host 0 coordinates)."""

    slice: str
    island: str
    hosts: tuple[HostAssignment, ...]
    host_resources: HostResources = HostResources()
    """CPU and memory each host takes on its machine besides its devices."""

    @property
    def devices(self) -> int:
        return sum(h.devices for h in self.hosts)

    @property
    def devices_per_host(self) -> int:
        return self.hosts[0].devices if self.hosts else 0

    def devices_by_machine(self) -> dict[str, int]:
        """Devices this placement takes on each machine, to reserve them."""
        taken: dict[str, int] = {}
        for host in self.hosts:
            taken[host.machine] = taken.get(host.machine, 0) + host.devices
        return taken

    def hosts_by_machine(self) -> dict[str, int]:
        """Hosts this placement puts on each machine (each takes ``host_resources`` there)."""
        count: dict[str, int] = {}
        for host in self.hosts:
            count[host.machine] = count.get(host.machine, 0) + 1
        return count


def with_placement(machine: Machine, devices: int, hosts: int, needs: HostResources, sign: int = 1) -> Machine:
    """``machine`` with ``hosts`` hosts of ``needs`` and ``devices`` devices taken (sign 1) or freed (-1)."""
    return Machine(  # built directly: dataclasses.replace is several times slower, once per machine reserved
        machine.name,
        machine.island,
        machine.allocatable_devices,
        max(0, machine.used_devices + sign * devices),
        machine.schedulable,
        machine.allocatable_cpu_millis,
        machine.allocatable_memory_bytes,
        max(0, machine.used_cpu_millis + sign * hosts * needs.cpu_millis),
        max(0, machine.used_memory_bytes + sign * hosts * needs.memory_bytes),
    )


@dataclasses.dataclass(frozen=True)
class Unplaceable:
    """Why a gang has no placement; ``message`` is written to the Admitted condition as is."""

    slice: str
    reason: Reason
    message: str
    closest_island: str | None = None
    """The island that came nearest to fitting, if any could ever fit (used to reserve it)."""

    @property
    def retryable(self) -> bool:
        """True when freed devices can make the gang fit; False when the cluster or spec must change."""
        return self.reason in RETRYABLE_REASONS


@dataclasses.dataclass(frozen=True, slots=True)
class IslandFit:
    """How one gang relates to one island: fits now, fits when drained, or never.

    It depends on the gang's shape (:data:`FitKey`) and the island alone, never
    on the slice's name, so gangs of one shape share it (frozen) until the island changes.
    """

    island: str
    host_size: int
    hosts_needed: int
    total_devices: int
    free_devices: int
    free_slots: int
    """Hosts that fit now; exact when fewer than ``hosts_needed``."""
    device_slots: int
    """Hosts that free devices alone would allow: more than ``free_slots`` when CPU or memory binds."""
    never: Reason | None = None
    why_never: str = ""

    @property
    def fits_now(self) -> bool:
        return self.never is None and self.free_slots >= self.hosts_needed


FitKey = tuple[int, int, int, int]
"""A gang's shape as an island judges it: devices, devices per host (0: the island's choice),
and the CPU and memory each host needs."""


class IslandCapacity(Protocol):
    """What judging a gang against one island needs to know of that island's machines.

    Two views answer it with the same numbers: :class:`MachineScan` sums over
    every machine for each question (the reference), and
    ``free_capacity.CapacityIndex`` keeps machines counted by their free amounts,
    so that a question costs the number of distinct amounts, not of machines.
    """

    def total_devices(self) -> int:
        """Allocatable devices of every machine, schedulable or not."""

    def largest_devices(self) -> int:
        """The largest allocatable devices of one machine."""

    def largest_machine(self) -> str:
        """The first by name of the machines with the largest allocatable devices."""

    def free_devices(self) -> int:
        """Free devices summed over the machines."""

    def device_slots(self, host_size: int) -> int:
        """Hosts of ``host_size`` that free devices alone allow."""

    def free_slots(self, host_size: int, needs: HostResources, enough: int) -> int:
        """Hosts of ``host_size`` and ``needs`` that fit now: exact below ``enough``, at least ``enough`` otherwise."""

    def empty_slots(self, host_size: int, needs: HostResources) -> int:
        """Hosts of ``host_size`` and ``needs`` that fit when every machine is empty."""

    def roomiest_when_empty(self, host_size: int, needs: HostResources) -> Machine:
        """The machine that holds the most such hosts when empty (see :func:`roomiest_when_empty`)."""

    def assign(self, host_size: int, needs: HostResources, hosts: int) -> tuple[str, ...]:
        """The machine of each of ``hosts`` hosts: the fullest machines with room first, then by name."""

    def judged(self) -> dict[FitKey, IslandFit]:
        """Fits already worked out against the island as it is now; emptied whenever a machine changes."""


class Inventory(Protocol):
    """Machines that gangs are placed on one after the other, as admission does."""

    def place(self, request: GangRequest, excluding: Collection[str] = ()) -> Placement | Unplaceable:
        """:func:`place_gang` on the machines of every island not in ``excluding``."""

    def reserve(self, placement: Placement) -> list[Machine]:
        """Count ``placement`` as used; returns the machines as they were, for :meth:`restore`."""

    def restore(self, previous: Sequence[Machine]) -> None:
        """Put machines back as :meth:`reserve` returned them (in reverse order of the reserves)."""


def check_machines(machines: Iterable[Machine]) -> None:
    """Raise ValueError for inventories no Node list can produce (an adapter bug, not a user error)."""
    seen: set[str] = set()
    for m in machines:
        if m.name in seen:
            raise ValueError(f"machine {m.name!r} is listed twice")
        seen.add(m.name)
        if m.allocatable_devices < 0 or m.used_devices < 0:
            raise ValueError(
                f"machine {m.name!r} on island {m.island!r} has allocatable "
                f"{m.allocatable_devices} and used {m.used_devices} devices; neither may be negative"
            )
        if (m.allocatable_cpu_millis < 0 or m.allocatable_memory_bytes < 0
                or m.used_cpu_millis < 0 or m.used_memory_bytes < 0):
            raise ValueError(
                f"machine {m.name!r} on island {m.island!r} has negative cpu or memory "
                f"(allocatable {m.allocatable_cpu_millis}m/{m.allocatable_memory_bytes}, "
                f"used {m.used_cpu_millis}m/{m.used_memory_bytes})"
            )


def place_gang(request: GangRequest, machines: Sequence[Machine]) -> Placement | Unplaceable:
    """Place every host of ``request`` on one island, or say why not.

    This is the reference: it scans every machine for the decision. Deciding many
    gangs against one inventory is cheaper with ``free_capacity.CapacityIndex``,
    which gives the same answers.

    Raises ValueError only for an impossible machine inventory; anything wrong
    with the request itself comes back as an :class:`Unplaceable`.
    """
    check_machines(machines)
    by_island: dict[str, list[Machine]] = {}
    for m in machines:
        by_island.setdefault(m.island, []).append(m)
    return place_on_islands(request, {island: _ScannedIsland(ms) for island, ms in by_island.items()})


def place_on_islands(request: GangRequest, islands: Mapping[str, IslandCapacity]) -> Placement | Unplaceable:
    """The decision of :func:`place_gang`, given a capacity view of each island that has machines."""
    invalid = _check_request(request)
    if invalid is not None:
        return invalid
    if request.island is not None:
        if request.island not in islands:
            known = ", ".join(sorted(islands)) or "none"
            return Unplaceable(
                request.slice,
                Reason.NO_ISLAND,
                f"slice {request.slice!r} is pinned to island {request.island!r} but no machine "
                f"is labelled pathways.dev/island={request.island}; islands: {known}",
            )
        islands = {request.island: islands[request.island]}
    if not islands:
        return Unplaceable(
            request.slice,
            Reason.NO_ISLAND,
            f"slice {request.slice!r} needs {plural(request.devices, 'device')} but no machine offers "
            "devices on any island (label Nodes pathways.dev/island and give them "
            "pathways.dev/device capacity)",
        )

    needs = request.host_resources
    shape = (request.devices, request.devices_per_host or 0, needs.cpu_millis, needs.memory_bytes)
    fits = [_judge(request, shape, island, capacity) for island, capacity in sorted(islands.items())]
    fitting = [f for f in fits if f.fits_now]
    if fitting:
        best = min(fitting, key=lambda f: (f.free_devices - request.devices, f.island))
        machines = islands[best.island].assign(best.host_size, request.host_resources, best.hosts_needed)
        hosts = tuple(HostAssignment(i, name, best.host_size) for i, name in enumerate(machines))
        return Placement(request.slice, best.island, hosts, request.host_resources)
    return _explain(request, fits)


def reserve(machines: Sequence[Machine], placement: Placement) -> list[Machine]:
    """``machines`` with the placement's devices, CPU and memory counted as used: the next decision's inventory."""
    taken = placement.devices_by_machine()
    hosts = placement.hosts_by_machine()
    needs = placement.host_resources
    return [
        with_placement(m, taken[m.name], hosts[m.name], needs) if m.name in taken else m
        for m in machines
    ]


class MachineScan:
    """The reference :class:`Inventory`: every decision is :func:`place_gang` over a list of machines."""

    def __init__(self, machines: Sequence[Machine]) -> None:
        check_machines(machines)
        self._machines = list(machines)

    def machines(self) -> list[Machine]:
        return list(self._machines)

    def place(self, request: GangRequest, excluding: Collection[str] = ()) -> Placement | Unplaceable:
        if not excluding:
            return place_gang(request, self._machines)
        return place_gang(request, [m for m in self._machines if m.island not in excluding])

    def reserve(self, placement: Placement) -> list[Machine]:
        taken = placement.devices_by_machine()
        previous = [m for m in self._machines if m.name in taken]
        self._machines = reserve(self._machines, placement)
        return previous

    def restore(self, previous: Sequence[Machine]) -> None:
        back = {m.name: m for m in previous}
        self._machines = [back.get(m.name, m) for m in self._machines]


class _ScannedIsland:
    """One island's :class:`IslandCapacity`, answered by summing over its machines."""

    def __init__(self, machines: Sequence[Machine]) -> None:
        self._machines = machines
        self._judged: dict[FitKey, IslandFit] = {}

    def judged(self) -> dict[FitKey, IslandFit]:
        return self._judged

    def total_devices(self) -> int:
        return sum(m.allocatable_devices for m in self._machines)

    def largest_devices(self) -> int:
        return max(m.allocatable_devices for m in self._machines)

    def largest_machine(self) -> str:
        largest = self.largest_devices()
        return min(m.name for m in self._machines if m.allocatable_devices == largest)

    def free_devices(self) -> int:
        return sum(m.free_devices for m in self._machines)

    def device_slots(self, host_size: int) -> int:
        return sum(m.free_devices // host_size for m in self._machines)

    def free_slots(self, host_size: int, needs: HostResources, enough: int) -> int:
        return sum(m.room(host_size, needs) for m in self._machines)

    def empty_slots(self, host_size: int, needs: HostResources) -> int:
        return sum(m.room(host_size, needs, empty=True) for m in self._machines)

    def roomiest_when_empty(self, host_size: int, needs: HostResources) -> Machine:
        return roomiest_when_empty(self._machines, host_size, needs)

    def assign(self, host_size: int, needs: HostResources, hosts: int) -> tuple[str, ...]:
        chosen: list[str] = []
        for m in sorted(self._machines, key=lambda m: (m.free_devices, m.name)):
            room = m.room(host_size, needs)
            chosen.extend([m.name] * min(room, hosts - len(chosen)))
            if len(chosen) == hosts:
                break
        return tuple(chosen)


def roomiest_when_empty(machines: Iterable[Machine], host_size: int, needs: HostResources) -> Machine:
    """Of the machines with ``host_size`` devices, the one holding most hosts of ``needs`` when empty.

    Ties go to more CPU, then more memory, then the name: the machine a message
    about missing CPU or memory names.
    """
    return min(
        (m for m in machines if m.allocatable_devices >= host_size),
        key=lambda m: (-m.room(host_size, needs, empty=True),
                       -m.allocatable_cpu_millis, -m.allocatable_memory_bytes, m.name),
    )


def _check_request(request: GangRequest) -> Unplaceable | None:
    if request.devices < 1:
        return Unplaceable(
            request.slice,
            Reason.INVALID_SPEC,
            f"slice {request.slice!r} asks for {request.devices} devices; devices must be at least 1",
        )
    dph = request.devices_per_host
    if dph is None:
        return None
    if dph < 1:
        return Unplaceable(
            request.slice,
            Reason.INVALID_SPEC,
            f"slice {request.slice!r} asks for hosts of {dph} devices; devicesPerHost must be at least 1",
        )
    if request.devices % dph:
        return Unplaceable(
            request.slice,
            Reason.INVALID_SPEC,
            f"slice {request.slice!r} asks for {plural(request.devices, 'device')} in hosts of {dph}; "
            f"devices must be a multiple of devicesPerHost (divisors of {request.devices}: "
            f"{_divisors_text(request.devices)})",
        )
    return None


def _judge(request: GangRequest, shape: FitKey, island: str, capacity: IslandCapacity) -> IslandFit:
    """:func:`_fit_island`, remembered by the island for the gang's shape until the island changes."""
    judged = capacity.judged()
    fit = judged.get(shape)
    if fit is None:
        fit = judged[shape] = _fit_island(request, island, capacity)
    return fit


def _fit_island(request: GangRequest, island: str, capacity: IslandCapacity) -> IslandFit:
    largest = capacity.largest_devices()
    total = capacity.total_devices()
    if request.devices_per_host is not None:
        host_size = request.devices_per_host
    else:
        host_size = min(request.devices, largest) if largest > 0 else request.devices
    hosts_needed = request.devices // host_size
    needs = request.host_resources
    device_slots = capacity.device_slots(host_size)
    fit = IslandFit(
        island=island,
        host_size=host_size,
        hosts_needed=hosts_needed,
        total_devices=total,
        free_devices=capacity.free_devices(),
        free_slots=capacity.free_slots(host_size, needs, hosts_needed) if needs else device_slots,
        device_slots=device_slots,
    )

    if total < request.devices:
        return dataclasses.replace(
            fit,
            never=Reason.EXCEEDS_ISLAND,
            why_never=f"{island} has {plural(total, 'device')} in all",
        )
    if host_size > largest:
        return dataclasses.replace(
            fit,
            never=Reason.EXCEEDS_ISLAND,
            why_never=f"the largest machine on {island} ({capacity.largest_machine()}) has "
            f"{plural(largest, 'device')}, less than a host of {host_size}",
        )
    if request.devices % host_size:
        return dataclasses.replace(
            fit,
            never=Reason.INDIVISIBLE_DEVICES,
            why_never=f"{island} has {plural(host_size, 'device')} per machine and {request.devices} "
            f"is not a multiple of {host_size}",
        )
    slots_when_empty = capacity.empty_slots(host_size, _NO_NEEDS)
    if slots_when_empty < hosts_needed:
        return dataclasses.replace(
            fit,
            never=Reason.EXCEEDS_ISLAND,
            why_never=f"{island} holds at most {plural(slots_when_empty, 'host')} of {host_size} "
            f"even when empty, and the slice needs {hosts_needed}",
        )
    if needs and fit.free_slots < hosts_needed:  # what fits now fits an empty island
        roomy = capacity.empty_slots(host_size, needs)
        if roomy < hosts_needed:
            return dataclasses.replace(
                fit, never=Reason.INSUFFICIENT_RESOURCES,
                why_never=_resources_short(island, capacity, host_size, needs, roomy, hosts_needed),
            )
    return fit


def _resources_short(
    island: str, capacity: IslandCapacity, host_size: int, needs: HostResources, roomy: int, hosts_needed: int
) -> str:
    """Why CPU or memory keeps an empty island from holding the gang: what its best machine has."""
    best = capacity.roomiest_when_empty(host_size, needs)
    short = []
    if needs.cpu_millis > best.allocatable_cpu_millis:
        short.append(f"cpu {cpu_text(best.allocatable_cpu_millis)}")
    if needs.memory_bytes > best.allocatable_memory_bytes:
        short.append(f"memory {memory_text(best.allocatable_memory_bytes)}")
    if short:
        return f"the best machine on {island} ({best.name}) has {' and '.join(short)} allocatable"
    return (
        f"{island} holds at most {roomy} such hosts of {host_size} devices even when empty, "
        f"and the slice needs {hosts_needed}"
    )


def _explain(request: GangRequest, fits: Sequence[IslandFit]) -> Unplaceable:
    """Turn per-island failures into one Unplaceable whose message carries the numbers."""
    name = request.slice
    waiting = [f for f in fits if f.never is None]
    if waiting:
        ranked = sorted(waiting, key=lambda f: (-f.free_slots, -f.free_devices, f.island))
        best = ranked[0]
        if request.island is not None:
            message = (
                f"slice {name!r} needs {plural(request.devices, 'device')} on island {best.island} "
                f"(pinned){_shape(waiting, request.host_resources)}; it has {_free_text(best)}"
            )
        else:
            others = ", ".join(f"{f.island} has {_free_text(f)}" for f in ranked[1:_LISTED_ISLANDS])
            more = len(ranked) - _LISTED_ISLANDS
            message = (
                f"slice {name!r} needs {plural(request.devices, 'device')} on one island"
                f"{_shape(waiting, request.host_resources)}; "
                f"best is {best.island} with {_free_text(best)}"
                + (f", {others}" if others else "")
                + (f" (and {plural(more, 'more island')})" if more > 0 else "")
            )
        return Unplaceable(name, Reason.INSUFFICIENT_DEVICES, message, closest_island=best.island)

    if all(f.never is Reason.INDIVISIBLE_DEVICES for f in fits):
        reason = Reason.INDIVISIBLE_DEVICES
        fix = (
            f"; set devicesPerHost to a divisor of {request.devices} "
            f"({_divisors_text(request.devices)}) that fits a machine"
        )
    elif any(f.never is Reason.INSUFFICIENT_RESOURCES for f in fits):
        reason = Reason.INSUFFICIENT_RESOURCES
        fix = "; lower the cpu/memory requests in spec.resources, or add bigger Nodes"
    else:
        reason = Reason.EXCEEDS_ISLAND
        fix = ""
    size_only = all(f.total_devices < request.devices for f in fits)
    if size_only and request.island is None:
        largest = max(fits, key=lambda f: (f.total_devices, f.island))
        message = (
            f"slice {name!r} asks for {plural(request.devices, 'device')} but the largest island "
            f"({largest.island}) has {largest.total_devices}"
        )
    elif size_only:
        message = (
            f"slice {name!r} asks for {plural(request.devices, 'device')} but its pinned island "
            f"{fits[0].island} has {fits[0].total_devices}"
        )
    else:
        needs = f"each host needs {request.host_resources.text()}; " if reason is Reason.INSUFFICIENT_RESOURCES else ""
        message = (
            f"slice {name!r} ({plural(request.devices, 'device')}) cannot fit on any island even when "
            f"it is empty: {needs}" + "; ".join(f.why_never for f in fits) + fix
        )
    return Unplaceable(name, reason, message)


def _shape(fits: Sequence[IslandFit], needs: HostResources) -> str:
    sizes = {f.host_size for f in fits}
    if len(sizes) != 1:
        return ""
    size = sizes.pop()
    hosts = fits[0].hosts_needed
    each = f", each with {needs.text()}" if needs else ""
    return f" ({plural(hosts, 'host')} of {size}{each})"


def _free_text(fit: IslandFit) -> str:
    text = f"{fit.free_devices} free"
    if fit.free_slots < min(fit.device_slots, fit.hosts_needed):
        # Devices for the hosts are free, but the machines with them lack CPU or memory.
        text += f" but free cpu/memory for only {fit.free_slots} of {plural(fit.hosts_needed, 'host')}"
    elif fit.free_devices >= fit.hosts_needed * fit.host_size:
        # Enough devices in total, but spread so that not enough whole hosts fit.
        text += f" but room for only {fit.free_slots} of {plural(fit.hosts_needed, 'host')} of {fit.host_size}"
    return text


def _divisors_text(n: int) -> str:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    if len(divisors) > 8:
        divisors = divisors[:7] + [n]
        return ", ".join(str(d) for d in divisors[:-1]) + f", ..., {n}"
    return ", ".join(str(d) for d in divisors)
