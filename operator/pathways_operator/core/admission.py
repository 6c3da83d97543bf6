"""Gang admission: which queued slices get devices now, in what order.

Each reconcile of the queue calls :func:`admit` with every VirtualSlice that
wants devices and the current machine inventory. Gangs are considered in queue
order (higher priority first, then older first, then by name) and each one is
placed against a working copy of the inventory in which the devices of every
gang admitted earlier in the same decision are already counted as used, so two
gangs admitted together can never over-commit a machine. A gang that does not
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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pathways.wording import plural
from pathways_operator.core.placement import (
    GangRequest,
    Machine,
    Placement,
    Unplaceable,
    check_machines,
    place_gang,
    reserve,
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


@dataclasses.dataclass(frozen=True)
class AdmissionResult:
    """One admission decision; ``admitted`` and ``waiting`` are in queue order."""

    admitted: list[Placement]
    waiting: list[Unplaceable]
    reserved: dict[str, str] = dataclasses.field(default_factory=dict)
    """Island name -> the waiting slice holding it (so operators can see why an island idles)."""


def queue_order(queue: Sequence[QueuedGang]) -> list[QueuedGang]:
    """Priority descending, then oldest first, then slice name: a total, stable order."""
    return sorted(queue, key=lambda g: (-g.priority, g.queued_at, g.request.slice))


def admit(
    queue: Sequence[QueuedGang],
    machines: Sequence[Machine],
    *,
    now: float,
    reserve_after: float = DEFAULT_RESERVE_AFTER_S,
) -> AdmissionResult:
    """Decide which gangs of ``queue`` are placed now; the rest wait, each with its reason.

    ``machines`` must already count the devices of every running gang as used.
    Raises ValueError if a slice is queued twice or the inventory is impossible.
    """
    check_machines(machines)
    seen: set[str] = set()
    for gang in queue:
        if gang.request.slice in seen:
            raise ValueError(f"slice {gang.request.slice!r} is queued twice for admission")
        seen.add(gang.request.slice)

    inventory = list(machines)
    admitted: list[Placement] = []
    waiting: list[Unplaceable] = []
    reserved: dict[str, str] = {}
    for gang in queue_order(queue):
        outcome = _place_outside(gang.request, inventory, reserved, now, queue)
        if isinstance(outcome, Placement):
            admitted.append(outcome)
            inventory = reserve(inventory, outcome)
            continue
        waiting.append(outcome)
        island = outcome.closest_island
        if (
            outcome.reason is Reason.INSUFFICIENT_DEVICES
            and island is not None
            and island not in reserved
            and now - gang.queued_at >= reserve_after
        ):
            reserved[island] = gang.request.slice
    return AdmissionResult(admitted, waiting, reserved)


def _place_outside(
    request: GangRequest,
    inventory: Sequence[Machine],
    reserved: dict[str, str],
    now: float,
    queue: Sequence[QueuedGang],
) -> Placement | Unplaceable:
    """Place ``request`` avoiding reserved islands, explaining when only a reserved one would do."""
    if not reserved:
        return place_gang(request, inventory)
    outcome = place_gang(request, [m for m in inventory if m.island not in reserved])
    if isinstance(outcome, Placement):
        return outcome
    unrestricted = place_gang(request, inventory)
    if isinstance(unrestricted, Unplaceable):
        return unrestricted
    island = unrestricted.island
    holder = reserved[island]
    waited = next(now - g.queued_at for g in queue if g.request.slice == holder)
    return Unplaceable(
        request.slice,
        Reason.ISLAND_RESERVED,
        f"slice {request.slice!r} ({plural(request.devices, 'device')}) would fit on {island}, but "
        f"{island} is held for slice {holder!r}, which has waited {waited:.0f}s for room; "
        "it is admitted once that slice is placed",
        closest_island=island,
    )
