"""Gang admission: which queued slices get devices now, in what order.

Each reconcile of the queue calls :func:`admit` with every VirtualSlice that
wants devices and the current machine inventory. Gangs are considered in queue
order (higher priority first, then older first, then by name) and each one is
placed against an index of the inventory's free capacity
(``free_capacity.CapacityIndex``) in which the devices of every gang admitted
earlier in the same decision are already counted as used, so two gangs admitted
together can never over-commit a machine. The index makes the decisions a scan
of every machine would (:func:`admit_on` a ``MachineScan``, the reference), at a cost that
does not grow with the number of machines. A gang that does not
fit takes nothing: there are no partial holds, which is what rules out two
half-placed gangs deadlocking each other.

Backfill and starvation
-----------------------
A gang that does not fit does not stop the queue: smaller gangs behind it may
still be admitted where they fit (backfill). That keeps devices busy, but on its
own it can starve a large gang forever, since a steady stream of small gangs
keeps taking the devices it waits for. So once a gang has waited
``reserve_after`` seconds (``now - queued_at``, both passed in), it *reserves*
the island that came closest to fitting it: gangs after it in queue order are
no longer admitted onto that island, which therefore drains until the large
gang fits. Their ``Admitted`` message then names the gang holding the island.

The trade-off, kept deliberately simple: while an island drains for a reserved
gang its free devices sit idle; each waiting gang reserves at most one island,
and gangs that can never fit (``ExceedsIsland`` and friends) reserve nothing.
Gangs of higher priority come earlier in queue order and are not blocked by a
reservation, so a continuous stream of higher-priority work can still starve a
low-priority gang; that is priority working as intended. Reservations are
recomputed from scratch on every call, so they need no stored state and
survive an operator restart (``queued_at`` comes from the object, e.g. its
creation time).

Admission groups
----------------
Gangs that are only useful together (the slices of one program: stage 0 on
one, stage 1 on another) share a ``group`` and say how many gangs the group has
in all (``group_size``). A group is admitted whole or not at all, as Kueue
admits a workload: its queued gangs are placed one after the other against a
trial copy of the inventory, and only if every one of them fits is the trial
kept; otherwise none is admitted and the inventory is as if the group had not
been considered, so a group never holds devices while part of it waits. A group
whose gangs are not all known yet (queued now, or already holding devices:
``holding``) waits for the missing ones. A group takes its place in the queue
from its first gang in queue order. When a group does not fit, the gang that
did not fit keeps its own reason (and may reserve its island like any gang);
the others wait with ``AdmissionGroupWaiting``, naming it.

Drivers
-------
A program's driver pod is part of its gang: a group may carry the driver's
request (``drivers``, by group), and is then admitted only if, once its gangs
are placed on the trial inventory, the driver also fits on some Node's free
CPU and memory (``core.driver_placement``; any Node, with or without devices,
the group's own hosts counted as used). Otherwise nothing of the group is
admitted and every gang of it waits with ``InsufficientDriverResources``, whose
message names the driver, what it requests and the most a Node offers. The
gangs are placed first, as they would be without a driver, and the driver
takes what they leave: admission does not move hosts to make room for the
driver, so a group whose driver would fit only if its hosts went to other
machines waits until room frees up. Gangs without a group carry no driver:
the slices a program names (``spec.slices[].ref``) may be shared and are
admitted on their own; a program made only of those has no group, and its
driver is placed when it starts (``NodeRoom.place`` on the Nodes of that
moment), like a pod of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from pathways_wire.wording import plural
from pathways_operator.core.driver_placement import DriverPlacement, DriverRequest, Node, NodeRoom
from pathways_operator.core.free_capacity import CapacityIndex
from pathways_operator.core.placement import (
    GangRequest,
    HostAssignment,
    Inventory,
    Machine,
    Placement,
    Unplaceable,
)
from pathways_operator.core.reasons import Reason

DEFAULT_RESERVE_AFTER_S = 300.0
"""How long a gang may be passed over by backfill before it reserves an island."""


@dataclasses.dataclass(frozen=True)
class QueuedGang:
    """A gang request with its place in the queue."""

    request: GangRequest
    priority: int = 0
    """Higher is admitted first (the value of the slice's PriorityClass)."""
    queued_at: float = 0.0
    """Seconds on any fixed clock (creationTimestamp is fine); earlier is admitted first."""
    group: str = ""
    """Admission group: gangs of one group are admitted together or not at all ("": none)."""
    group_size: int = 1
    """How many gangs the group has in all, queued or already holding devices."""


@dataclasses.dataclass(frozen=True)
class AdmissionResult:
    """One admission decision; ``admitted`` in the order decided, ``waiting`` in queue order."""

    admitted: list[Placement]
    waiting: list[Unplaceable]
    reserved: dict[str, str] = dataclasses.field(default_factory=dict)
    """Island name -> the waiting slice holding it (so operators can see why an island idles)."""
    drivers: dict[str, DriverPlacement] = dataclasses.field(default_factory=dict)
    """Admission group -> where its driver goes, for each group admitted with a driver."""


def queue_order(queue: Sequence[QueuedGang]) -> list[QueuedGang]:
    """Priority descending, then oldest first, then slice name: a total, stable order."""
    return sorted(queue, key=lambda g: (-g.priority, g.queued_at, g.request.slice))


def admission_units(queue: Sequence[QueuedGang]) -> list[list[QueuedGang]]:
    """The queue as units admitted whole: one per group, one per ungrouped gang, in queue order."""
    units: list[list[QueuedGang]] = []
    by_group: dict[str, list[QueuedGang]] = {}
    for gang in queue_order(queue):
        if not gang.group:
            units.append([gang])
        elif gang.group in by_group:
            by_group[gang.group].append(gang)
        else:
            by_group[gang.group] = [gang]
            units.append(by_group[gang.group])
    return units


def admit(
    queue: Sequence[QueuedGang],
    machines: Sequence[Machine],
    *,
    now: float,
    reserve_after: float = DEFAULT_RESERVE_AFTER_S,
    holding: Mapping[str, int] | None = None,
    drivers: Mapping[str, DriverRequest] | None = None,
    nodes: Sequence[Node] = (),
) -> AdmissionResult:
    """Decide which gangs of ``queue`` are placed now; the rest wait, each with its reason.

    ``machines`` must already count the devices of every running gang as used.
    ``holding`` maps an admission group to how many of its gangs already hold
    devices (admitted earlier; they count towards the group being complete).
    ``drivers`` maps an admission group to its driver's request, for groups
    whose driver is not placed yet; such a group is admitted only with its
    driver on one of ``nodes`` (every Node, machines included, with the CPU and
    memory in use counted as ``machines`` count them).
    Raises ValueError if a slice is queued twice, a group size is below 1, or
    the inventory is impossible.
    """
    return admit_on(CapacityIndex(machines), queue, now=now, reserve_after=reserve_after, holding=holding,
                    drivers=drivers, nodes=nodes)


def admit_on(
    inventory: Inventory,
    queue: Sequence[QueuedGang],
    *,
    now: float,
    reserve_after: float = DEFAULT_RESERVE_AFTER_S,
    holding: Mapping[str, int] | None = None,
    drivers: Mapping[str, DriverRequest] | None = None,
    nodes: Sequence[Node] = (),
) -> AdmissionResult:
    """:func:`admit` against ``inventory``, which it leaves holding the admitted gangs.

    With ``placement.MachineScan(machines)`` every decision scans every machine:
    the reference that :func:`admit`'s index must agree with.
    """
    queued_at: dict[str, float] = {}
    for gang in queue:
        if gang.request.slice in queued_at:
            raise ValueError(f"slice {gang.request.slice!r} is queued twice for admission")
        if gang.group_size < 1:
            raise ValueError(
                f"slice {gang.request.slice!r}: admission group size {gang.group_size} is below 1"
            )
        queued_at[gang.request.slice] = gang.queued_at

    held = holding or {}
    admitted: list[Placement] = []
    waiting: list[Unplaceable] = []
    reserved: dict[str, str] = {}
    wanted = drivers or {}
    room = NodeRoom(nodes)
    placed_drivers: dict[str, DriverPlacement] = {}
    for unit in admission_units(queue):
        missing = _missing_members(unit, held)
        if missing:
            waiting.extend(missing)
            continue
        placed: list[Placement] = []
        previous: list[Machine] = []
        refused: tuple[QueuedGang, Unplaceable] | None = None
        for gang in unit:
            outcome = _place_outside(gang.request, inventory, reserved, now, queued_at)
            if isinstance(outcome, Unplaceable):
                refused = (gang, outcome)
                break
            placed.append(outcome)
            previous.extend(inventory.reserve(outcome))
        driver = wanted.get(unit[0].group) if unit[0].group else None
        if refused is None and driver is not None:
            where = room.place(driver, beside=placed)
            if isinstance(where, str):
                inventory.restore(previous)
                waiting.extend(_driver_refused(unit, where))
                continue
            room.take(where)
            placed_drivers[unit[0].group] = where
            on_island = room.island_of(where.node)
            if on_island:  # a machine: no later host in this pass may take the driver's cpu there
                hold = HostAssignment(0, where.node, 0)
                inventory.reserve(Placement(f"driver of {driver.program}", on_island, (hold,), where.resources))
        if refused is None:
            room.take_hosts(placed)
            admitted.extend(placed)
            continue
        inventory.restore(previous)
        gang, outcome = refused
        waiting.extend(_group_refused(unit, gang, outcome))
        island = outcome.closest_island
        if (
            outcome.reason is Reason.INSUFFICIENT_DEVICES
            and island is not None
            and island not in reserved
            and now - gang.queued_at >= reserve_after
        ):
            reserved[island] = gang.request.slice
    position = {g.request.slice: i for i, g in enumerate(queue_order(queue))}
    waiting.sort(key=lambda w: position[w.slice])
    return AdmissionResult(admitted, waiting, reserved, placed_drivers)


def _group_size(unit: Sequence[QueuedGang]) -> int:
    return max(g.group_size for g in unit)


def _missing_members(unit: Sequence[QueuedGang], holding: Mapping[str, int]) -> list[Unplaceable]:
    """Every gang of ``unit`` waiting, if some gangs of its group are not known yet; else []."""
    group = unit[0].group
    if not group:
        return []
    size = _group_size(unit)
    present = len(unit) + holding.get(group, 0)
    if present >= size:
        return []
    return [
        Unplaceable(
            g.request.slice,
            Reason.ADMISSION_GROUP_INCOMPLETE,
            f"slice {g.request.slice!r} is admitted together with the other slices of admission "
            f"group {group!r} ({size} in all); {present} exist so far, waiting for "
            f"{size - present} more",
        )
        for g in unit
    ]


def _group_refused(
    unit: Sequence[QueuedGang], refused: QueuedGang, why: Unplaceable
) -> list[Unplaceable]:
    """The waiting outcomes of a unit one of whose gangs, ``refused``, did not fit."""
    if len(unit) == 1 and not unit[0].group:
        return [why]
    group, size = unit[0].group, _group_size(unit)
    whole = f"admission group {group!r} ({size} slices) is admitted whole or not at all"
    result = []
    for gang in unit:
        if gang is refused:
            result.append(dataclasses.replace(why, message=f"{why.message}; its {whole}"))
        else:
            result.append(
                Unplaceable(
                    gang.request.slice,
                    Reason.ADMISSION_GROUP_WAITING,
                    f"slice {gang.request.slice!r} holds no devices until its whole admission group "
                    f"{group!r} ({size} slices) fits: {why.message}",
                )
            )
    return result


def _driver_refused(unit: Sequence[QueuedGang], why: str) -> list[Unplaceable]:
    """Every gang of ``unit`` waiting, because its program's driver fits no Node."""
    group, size = unit[0].group, _group_size(unit)
    return [
        Unplaceable(
            g.request.slice,
            Reason.INSUFFICIENT_DRIVER_RESOURCES,
            f"slice {g.request.slice!r} holds no devices until its program's driver fits too: {why}; "
            f"admission group {group!r} ({size} slices) is admitted with its driver, whole or not at all",
        )
        for g in unit
    ]


def _place_outside(
    request: GangRequest,
    inventory: Inventory,
    reserved: dict[str, str],
    now: float,
    queued_at: Mapping[str, float],
) -> Placement | Unplaceable:
    """Place ``request`` avoiding reserved islands, explaining when only a reserved one would do."""
    if not reserved:
        return inventory.place(request)
    outcome = inventory.place(request, excluding=reserved)
    if isinstance(outcome, Placement):
        return outcome
    unrestricted = inventory.place(request)
    if isinstance(unrestricted, Unplaceable):
        return unrestricted
    island = unrestricted.island
    holder = reserved[island]
    waited = now - queued_at[holder]
    return Unplaceable(
        request.slice,
        Reason.ISLAND_RESERVED,
        f"slice {request.slice!r} ({plural(request.devices, 'device')}) would fit on {island}, but "
        f"{island} is held for slice {holder!r}, which has waited {waited:.0f}s for room; "
        "it is admitted once that slice is placed",
        closest_island=island,
    )
