"""Preemption: which running gangs to evict so that a gang of higher priority fits.

When admission leaves a gang waiting for devices (``InsufficientDevices``), the
resource manager asks :func:`choose_victims` whether evicting running gangs of
*strictly lower* priority would make room on one island. Equal priorities never
preempt each other: among equals the queue (oldest first) is the only order.

The choice, per island the gang may use: take that island's running gangs of lower
priority, lowest priority first and, among equals, the most recently admitted first
(it has lost the least work); evict them one by one until the gang fits; then give
back any victim the gang fits without, trying the most valuable first. Across
islands the plan whose highest victim priority is lowest wins, then the one evicting
the fewest devices, then the island name, so the decision is deterministic.
Evicted gangs are queued again like any other and resume when room returns; their
programs continue from their last checkpoint.

Pure: no clock, no API; the adapter (``k8s.admission_queue``) turns the plan into pod
deletions, a Preempted condition and an Event on each victim naming the preemptor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pathways_operator.core.placement import GangRequest, Machine, Placement, place_gang, with_placement


@dataclasses.dataclass(frozen=True)
class RunningGang:
    """A gang holding devices now, and what it is worth."""

    placement: Placement
    priority: int
    admitted_at: float = 0.0
    """Seconds on any fixed clock; a later gang is evicted first among equal priorities."""

    @property
    def slice(self) -> str:
        return self.placement.slice


@dataclasses.dataclass(frozen=True)
class PreemptionPlan:
    """Evict ``victims`` (slice keys) and ``request`` fits on ``island`` as ``placement``."""

    preemptor: str
    island: str
    victims: tuple[str, ...]
    placement: Placement


def choose_victims(
    request: GangRequest,
    priority: int,
    running: Sequence[RunningGang],
    machines: Sequence[Machine],
) -> PreemptionPlan | None:
    """The cheapest set of lower-priority gangs whose eviction lets ``request`` fit, or None.

    ``machines`` count every running gang's devices as used.
    """
    islands = sorted({m.island for m in machines})
    if request.island is not None:
        islands = [i for i in islands if i == request.island]
    plans: list[tuple[tuple[int, int, str], PreemptionPlan]] = []
    for island in islands:
        plan = _plan_on(request, priority, running, [m for m in machines if m.island == island], island)
        if plan is not None:
            by_slice = {g.slice: g for g in running}
            cost = (
                max(by_slice[v].priority for v in plan.victims),
                sum(by_slice[v].placement.devices for v in plan.victims),
                island,
            )
            plans.append((cost, plan))
    if not plans:
        return None
    return min(plans, key=lambda p: p[0])[1]


def _plan_on(
    request: GangRequest,
    priority: int,
    running: Sequence[RunningGang],
    machines: list[Machine],
    island: str,
) -> PreemptionPlan | None:
    candidates = sorted(
        (g for g in running if g.placement.island == island and g.priority < priority),
        key=lambda g: (g.priority, -g.admitted_at, g.slice),
    )
    if not candidates:
        return None
    chosen: list[RunningGang] = []
    for gang in candidates:
        chosen.append(gang)
        if isinstance(place_gang(request, _without(machines, chosen)), Placement):
            break
    else:
        return None
    for gang in sorted(chosen, key=lambda g: (-g.priority, g.admitted_at, g.slice)):
        rest = [g for g in chosen if g is not gang]
        if isinstance(place_gang(request, _without(machines, rest)), Placement):
            chosen = rest
    placed = place_gang(request, _without(machines, chosen))
    assert isinstance(placed, Placement)
    return PreemptionPlan(request.slice, island, tuple(g.slice for g in chosen), placed)


def _without(machines: Sequence[Machine], evicted: Sequence[RunningGang]) -> list[Machine]:
    """``machines`` with the devices, CPU and memory of ``evicted`` gangs freed."""
    by_name = {m.name: m for m in machines}
    for gang in evicted:
        placement = gang.placement
        hosts = placement.hosts_by_machine()
        for name, devices in placement.devices_by_machine().items():
            if name in by_name:
                by_name[name] = with_placement(by_name[name], devices, hosts[name], placement.host_resources, -1)
    return [by_name[m.name] for m in machines]
