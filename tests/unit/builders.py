"""Small typed builders for the core's inputs, so tests read as inventories, not literals."""

from __future__ import annotations

from pathways_operator.core.admission import QueuedGang
from pathways_operator.core.placement import GangRequest, Machine


def island(name: str, machines: int, devices: int, used: tuple[int, ...] = ()) -> list[Machine]:
    """``machines`` Nodes named ``<island>-m<i>`` with ``devices`` each; ``used[i]`` taken on the i-th."""
    return [
        Machine(
            name=f"{name}-m{i}",
            island=name,
            allocatable_devices=devices,
            used_devices=used[i] if i < len(used) else 0,
        )
        for i in range(machines)
    ]


def gang(
    slice_: str,
    devices: int,
    *,
    per_host: int | None = None,
    on: str | None = None,
    priority: int = 0,
    at: float = 0.0,
) -> QueuedGang:
    return QueuedGang(GangRequest(slice_, devices, per_host, on), priority=priority, queued_at=at)
