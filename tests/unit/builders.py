"""Small typed builders for the core's inputs, so tests read as inventories, not literals."""

from __future__ import annotations

from pathways_operator.core.admission import QueuedGang
from pathways_operator.core.placement import GangRequest, Machine


def island(
    name: str,
    machines: int,
    devices: int,
    used: tuple[int, ...] = (),
    *,
    cpu: int = 0,
    memory: int = 0,
    used_cpu: tuple[int, ...] = (),
) -> list[Machine]:
    """``machines`` Nodes named ``<island>-m<i>`` with ``devices`` each; ``used[i]`` taken on the i-th.

    ``cpu`` (millicores) and ``memory`` (bytes) are each machine's allocatable; ``used_cpu[i]``
    the millicores taken on the i-th.
    """
    return [
        Machine(
            name=f"{name}-m{i}",
            island=name,
            allocatable_devices=devices,
            used_devices=used[i] if i < len(used) else 0,
            allocatable_cpu_millis=cpu,
            allocatable_memory_bytes=memory,
            used_cpu_millis=used_cpu[i] if i < len(used_cpu) else 0,
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
    group: str = "",
    size: int = 1,
) -> QueuedGang:
    return QueuedGang(
        GangRequest(slice_, devices, per_host, on), priority=priority, queued_at=at, group=group, group_size=size
    )
