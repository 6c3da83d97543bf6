"""The slice table: every gang the controller knows, and the lock its tables share.

A slice is a gang of hosts placed on one island. Its record says where it was
placed, which hosts serve it now (and the control streams to them), which
clients hold it, and where its gang stands (`core.call_tracking.GangState`).
Slices, programs and calls change together — a lost gang fails its calls at
once — so the table's lock and condition are the whole controller's: whoever
changes any table holds `lock` and wakes waiters through `changed`.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb
from pathways_wire.slice_token import client_token
from pathways_wire.wording import plural
from pathways_operator.controller.errors import ControllerError
from pathways_operator.controller.host_link import HostLink
from pathways_operator.core.call_tracking import GangState, check_gang_move
from pathways_operator.core.placement import Machine, Placement


class Host(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def sidecar_address(self) -> str: ...


@dataclass
class SliceRecord:
    key: str
    slice_id: str
    decl: ir.SliceDecl
    placement: Placement
    hosts: list[Host] = field(default_factory=list)
    links: list[HostLink] = field(default_factory=list)
    generation: int = 0
    clients: set[str] = field(default_factory=set)
    loaded: set[str] = field(default_factory=set)
    gang: GangState = "launching"
    failure: str = ""
    """Why the gang could not be launched again (gang ``failed``)."""
    token: str = ""

    @property
    def ready(self) -> bool:
        return self.gang == "ready"

    def move(self, new: GangState, failure: str = "") -> None:
        self.gang = check_gang_move(self.decl.name, self.gang, new)
        self.failure = failure

    def reuse_refusal(self, what: str, asked: ir.SliceDecl) -> str:
        """Why a client's ask for this named slice (`what`, as errors name it) is not this
        slice: its size, or an island or host size it pins that this slice does not have;
        "" when it is."""
        use = "Use another name, or ask for the slice as it is"
        if asked.devices != self.decl.devices:
            return (f"{what} has {plural(self.decl.devices, 'device')}; a program asked for "
                    f"{asked.devices}. {use}")
        if asked.island and asked.island != self.placement.island:
            return (f"{what} is on island '{self.placement.island}'; a program pinned it to island "
                    f"'{asked.island}'. {use} (no island, or '{self.placement.island}')")
        per_host = self.placement.devices_per_host
        if asked.devices_per_host and per_host and asked.devices_per_host != per_host:
            return (f"{what} has {plural(per_host, 'device')} per host; a program asked for "
                    f"{asked.devices_per_host}. {use}")
        return ""

    def info(self) -> pb.SliceInfo:
        """What a client of the slice learns, its client token included (`Describe` strips
        it): never the slice token, which opens the hosts' internal doors."""
        return pb.SliceInfo(
            slice_id=self.slice_id,
            token=client_token(self.token),
            name=self.decl.name,
            island=self.placement.island,
            devices=self.decl.devices,
            generation=self.generation,
            hosts=[
                pb.HostInfo(
                    index=i,
                    address=h.sidecar_address,
                    node=self.placement.hosts[i].machine,
                    devices=self.placement.hosts[i].devices,
                )
                for i, h in enumerate(self.hosts)
            ],
        )


def free_machines(machines: Iterable[Machine], slices: Iterable[SliceRecord]) -> list[Machine]:
    """`machines` with the devices the controller's own slices hold counted as used."""
    used: dict[str, int] = defaultdict(int)
    for rec in slices:
        for a in rec.placement.hosts:
            used[a.machine] += a.devices
    return [
        Machine(m.name, m.island, m.allocatable_devices, m.used_devices + used[m.name], m.schedulable)
        for m in machines
    ]


def cluster_info(machines: Iterable[Machine], slices: Iterable[SliceRecord]) -> pb.ClusterInfo:
    """`Describe`'s answer: devices per island, and the slices without their tokens
    (it answers anyone who reaches the controller)."""
    islands: dict[str, list[Machine]] = defaultdict(list)
    for m in machines:
        islands[m.island].append(m)
    infos = []
    for rec in slices:
        info = rec.info()
        info.token = ""
        infos.append(info)
    return pb.ClusterInfo(
        islands=[
            pb.IslandInfo(
                name=name,
                devices=sum(m.allocatable_devices for m in ms),
                free_devices=sum(m.allocatable_devices - m.used_devices for m in ms),
                devices_per_host=max(m.allocatable_devices for m in ms),
            )
            for name, ms in sorted(islands.items())
        ],
        slices=infos,
    )


class SliceTable:
    """Slices by key (``client/id``, a shared slice's name, or a VirtualSlice's
    ``namespace/name``) under the controller's lock."""

    def __init__(self, machines: Callable[[], list[Machine]]) -> None:
        self._machines = machines
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._slices: dict[str, SliceRecord] = {}
        self._next_slice = 0

    def get(self, key: str) -> SliceRecord | None:
        return self._slices.get(key)

    def by_id(self, slice_id: str) -> SliceRecord | None:
        for rec in self._slices.values():
            if rec.slice_id == slice_id:
                return rec
        return None

    def slice_of_link(self, link: HostLink) -> SliceRecord | None:
        """The slice whose current gang `link` belongs to (None for a replaced gang's link)."""
        rec = self.by_id(link.slice_id)
        return rec if rec is not None and link in rec.links else None

    def add(self, key: str, decl: ir.SliceDecl, placement: Placement) -> SliceRecord:
        """A new record under `key`, with a slice id no other slice of this controller had."""
        self._next_slice += 1
        rec = SliceRecord(key=key, slice_id=f"{decl.name}-{self._next_slice}", decl=decl, placement=placement)
        self._slices[key] = rec
        return rec

    def remove(self, key: str) -> None:
        self._slices.pop(key, None)

    def clear(self) -> list[SliceRecord]:
        records = list(self._slices.values())
        self._slices.clear()
        return records

    def free_machines(self) -> list[Machine]:
        return free_machines(self._machines(), self._slices.values())

    def live_decl(self, slice_id: str) -> ir.SliceDecl | None:
        """The declaration of the live slice `slice_id`, to bind a program's virtual slice to."""
        rec = self.by_id(slice_id)
        return None if rec is None else rec.decl

    def wait_ready(self, rec: SliceRecord, deadline: float) -> None:
        """Wait on `changed` (the caller holds `lock`) until the gang is ready; raise
        if it failed or is still starting at `deadline`."""
        while not rec.ready:
            if rec.gang == "failed":
                raise ControllerError("UNAVAILABLE", rec.failure)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ControllerError(
                    "UNAVAILABLE", f"slice '{rec.decl.name}' is not ready (hosts starting)"
                )
            self.changed.wait(min(remaining, 1.0))

    def describe(self) -> pb.ClusterInfo:
        with self.lock:
            return cluster_info(self.free_machines(), self._slices.values())
