"""Where a slice's gang of hosts comes from, and where it goes: one strategy per runtime.

The controller asks its `Gangs` strategy for a slice, tells it when a host died
or a client let a slice go, and closes it at the end. Both strategies keep
their gangs in the controller's slice table and open and close the gangs'
control streams the same way (`GangLinks`); they differ in who places and
starts the hosts:

* `EmbeddedGangs` (the embedded runtime): the controller places the whole gang
  on one island itself (`core.placement`) before any host exists, then starts
  every host through its `HostLauncher`; a slice that does not fit waits,
  holding nothing, until room appears or its timeout passes. A gang that loses
  a host is stopped and launched again, as JobSet recreates a job's pods.
* `KubernetesGangs`: the operator's reconcilers place and start the pods; a
  slice is a VirtualSlice the operator registers (`register_gang`) once every
  host serves, reports lost (`gang_lost`) and unregisters when it is deleted.
  Clients only attach to it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb
from pathways_wire.slice_token import new_token
from pathways_wire.wording import plural
from pathways_operator.controller.calls import Calls
from pathways_operator.controller.errors import ControllerError
from pathways_operator.controller.host_link import HostLink, control_frames_wanted
from pathways_operator.controller.slices import Host, SliceRecord, SliceTable
from pathways_operator.core.placement import GangRequest, Placement, place_gang

log = logging.getLogger(__name__)

HostFailed = Callable[[str, str, str], None]
"""A strategy's answer to a dead host: (slice id, host name, reason)."""


@dataclass(frozen=True)
class SliceAsk:
    """A client's request for a slice: which, for whom, and how long it may wait."""

    decl: ir.SliceDecl
    client: str
    namespace: str
    timeout_s: float
    deadline: float
    """`time.monotonic()` at which the wait is over."""


class Gangs(Protocol):
    """What the controller asks of the runtime that provides its gangs."""

    def create_slice(self, ask: SliceAsk) -> pb.SliceInfo: ...

    def release_slice(self, slice_id: str, client: str) -> None: ...

    def host_failed(self, slice_id: str, host_name: str, reason: str) -> None: ...

    def close(self) -> None: ...


class GangLinks:
    """A gang's control streams: opened when its hosts serve, closed when it is lost."""

    def __init__(self, slices: SliceTable, calls: Calls) -> None:
        self._slices = slices
        self._changed = slices.changed
        self._calls = calls
        self._control_frames = control_frames_wanted(os.environ)

    def attach(self, rec: SliceRecord, hosts: list[Host], host_failed: HostFailed) -> bool:
        """Stream to the gang's new hosts and mark it ready; False if it was released meanwhile."""

        def broken(link: HostLink, reason: str) -> None:
            with self._changed:
                current = self._slices.slice_of_link(link)
            if current is not None:
                host_failed(current.slice_id, link.name, reason)

        links = [
            HostLink(h.sidecar_address, h.name, rec.slice_id, self._calls.on_host_event, broken, rec.token,
                     frames_wanted=self._control_frames)
            for h in hosts
        ]
        with self._changed:
            if rec.gang == "released":
                return False
            rec.hosts = hosts
            rec.links = links
            rec.generation += 1
            rec.loaded = set()
            rec.move("ready")
            for link in links:
                link.start()
            self._changed.notify_all()
        log.info(
            "slice %s ready on %s: %s", rec.decl.name, rec.placement.island,
            ", ".join(h.sidecar_address for h in hosts),
        )
        return True

    def drop(self, rec: SliceRecord, host_name: str, reason: str) -> list[Host]:
        """Fail every call on the gang, close its links; returns its hosts."""
        with self._changed:
            if not rec.ready:
                return []
            rec.move("lost")
            self._calls.gang_lost(rec, host_name, reason)
            hosts, links = rec.hosts, rec.links
            rec.hosts, rec.links = [], []
            self._changed.notify_all()
        log.warning("slice %s: %s failed (%s); dropping the gang", rec.decl.name, host_name, reason)
        for link in links:
            link.close()
        return hosts

    def ready(self, slice_id: str) -> SliceRecord | None:
        """The slice `slice_id` if its gang is ready (the one a host failure concerns)."""
        with self._changed:
            rec = self._slices.by_id(slice_id)
        return rec if rec is not None and rec.ready else None

    def close_all(self) -> list[SliceRecord]:
        """Forget every slice and close its links; returns the records."""
        with self._changed:
            records = self._slices.clear()
            self._changed.notify_all()
        for rec in records:
            for link in rec.links:
                link.close()
        return records


@dataclass(frozen=True)
class HostRequest:
    """One host of a gang for a launcher to start."""

    slice_name: str
    slice_id: str
    index: int
    num_hosts: int
    devices: int
    machine: str
    token: str = ""
    """The slice token the host must demand of its callers."""


class HostLauncher(Protocol):
    def launch(self, requests: Sequence[HostRequest]) -> Sequence[Host]: ...

    def stop(self, hosts: Sequence[Host]) -> None: ...


def gang_requests(record: SliceRecord) -> list[HostRequest]:
    """The hosts to start for the slice's placement, one per assigned machine."""
    return [
        HostRequest(
            slice_name=record.decl.name,
            slice_id=record.slice_id,
            index=a.index,
            num_hosts=len(record.placement.hosts),
            devices=a.devices,
            machine=a.machine,
            token=record.token,
        )
        for a in record.placement.hosts
    ]


def slice_key(decl: ir.SliceDecl, client: str) -> str:
    """A slice named like its id is shared by every client; any other is the client's own."""
    return decl.name if decl.id == decl.name else f"{client}/{decl.id}"


class EmbeddedGangs:
    """Gangs the controller places itself and starts as local hosts."""

    def __init__(self, slices: SliceTable, links: GangLinks, launcher: HostLauncher) -> None:
        self._slices = slices
        self._changed = slices.changed
        self._links = links
        self._launcher = launcher

    def create_slice(self, ask: SliceAsk) -> pb.SliceInfo:
        decl, client = ask.decl, ask.client
        key = slice_key(decl, client)
        with self._changed:
            while True:
                rec = self._slices.get(key)
                if rec is not None:
                    refusal = rec.reuse_refusal(f"slice '{decl.name}'", decl)
                    if refusal:
                        raise ControllerError("INVALID_ARGUMENT", refusal)
                    rec.clients.add(client)
                    self._slices.wait_ready(rec, ask.deadline)
                    return rec.info()
                request = GangRequest(
                    slice=decl.name,
                    devices=decl.devices,
                    devices_per_host=decl.devices_per_host or None,
                    island=decl.island or None,
                )
                outcome = place_gang(request, self._slices.free_machines())
                if isinstance(outcome, Placement):
                    break
                if not outcome.retryable:
                    raise ControllerError("FAILED_PRECONDITION", outcome.message)
                remaining = ask.deadline - time.monotonic()
                if remaining <= 0:
                    raise ControllerError(
                        "RESOURCE_EXHAUSTED",
                        f"{outcome.message} (waited {ask.timeout_s:.0f} s for room)",
                    )
                self._changed.wait(min(remaining, 1.0))
            rec = self._slices.add(key, decl, outcome)
            rec.clients.add(client)
            rec.token = new_token()
        try:
            self._launch(rec)
        except Exception as err:
            with self._changed:
                self._slices.remove(key)
                self._changed.notify_all()
            raise ControllerError(
                "UNAVAILABLE", f"slice '{decl.name}' could not start its hosts: {err}"
            ) from err
        return rec.info()

    def _launch(self, rec: SliceRecord) -> None:
        """Start every host of the gang (outside the lock), then open links."""
        hosts = list(self._launcher.launch(gang_requests(rec)))
        if not self._links.attach(rec, hosts, self.host_failed):
            self._launcher.stop(hosts)  # its last client let it go while its hosts started

    def release_slice(self, slice_id: str, client: str) -> None:
        with self._changed:
            rec = self._slices.by_id(slice_id)
            if rec is None:
                return
            rec.clients.discard(client)
            if rec.clients:
                return
            self._slices.remove(rec.key)
            hosts, links = rec.hosts, rec.links
            rec.move("released")
            self._changed.notify_all()
        for link in links:
            link.close()
        self._launcher.stop(hosts)

    def host_failed(self, slice_id: str, host_name: str, reason: str) -> None:
        """A host of `slice_id` is gone: fail its calls, stop the gang and launch it again."""
        rec = self._links.ready(slice_id)
        if rec is None:
            return
        hosts = self._links.drop(rec, host_name, reason)
        self._launcher.stop(hosts)
        threading.Thread(target=self._relaunch, args=(rec,), daemon=True).start()

    def _relaunch(self, rec: SliceRecord) -> None:
        try:
            self._launch(rec)
        except Exception as err:
            with self._changed:
                if rec.gang == "lost":
                    rec.move("failed", f"slice '{rec.decl.name}' could not be relaunched: {err}")
                self._changed.notify_all()
            log.error("slice '%s' could not be relaunched: %s", rec.decl.name, err)

    def close(self) -> None:
        for rec in self._links.close_all():
            self._launcher.stop(rec.hosts)


class KubernetesGangs:
    """Gangs of VirtualSlices that the operator placed, started and registers here."""

    def __init__(
        self, slices: SliceTable, links: GangLinks, explain_missing: Callable[[str], str] | None = None
    ) -> None:
        """`explain_missing`: why the VirtualSlice ``namespace/name`` has no ready gang."""
        self._slices = slices
        self._changed = slices.changed
        self._links = links
        self._explain_missing = explain_missing

    def create_slice(self, ask: SliceAsk) -> pb.SliceInfo:
        """A named slice is a VirtualSlice: wait until its gang is registered and ready."""
        decl = ask.decl
        key = f"{ask.namespace or 'default'}/{decl.name}"
        with self._changed:
            while True:
                rec = self._slices.get(key)
                if rec is not None and rec.ready:
                    refusal = rec.reuse_refusal(f"VirtualSlice {key}", decl)
                    if refusal:
                        raise ControllerError("INVALID_ARGUMENT", refusal)
                    rec.clients.add(ask.client)
                    return rec.info()
                remaining = ask.deadline - time.monotonic()
                if remaining <= 0:
                    why = self._explain_missing(key) if self._explain_missing else "not registered"
                    raise ControllerError(
                        "UNAVAILABLE", f"VirtualSlice {key} is not Ready: {why}"
                    )
                self._changed.wait(min(remaining, 1.0))

    def register_gang(
        self, key: str, decl: ir.SliceDecl, placement: Placement, hosts: Sequence[Host],
        token: str = "",
    ) -> None:
        """The operator launched (or relaunched) the gang of VirtualSlice `key`,
        whose hosts demand `token` (from the VirtualSlice's Secret)."""
        with self._changed:
            rec = self._slices.get(key)
            if rec is not None and [h.sidecar_address for h in rec.hosts] == [
                h.sidecar_address for h in hosts
            ] and rec.ready and rec.token == token:
                return
        if rec is not None:
            self.gang_lost(key, "the gang was replaced")
        with self._changed:
            rec = self._slices.get(key)
            if rec is None:
                rec = self._slices.add(key, decl, placement)
            rec.placement = placement
            rec.decl = decl
            rec.token = token
        self._links.attach(rec, list(hosts), self.host_failed)

    def gang_lost(self, key: str, reason: str) -> None:
        """The operator saw the gang of `key` fail; it will register a new one."""
        with self._changed:
            rec = self._slices.get(key)
        if rec is not None and rec.hosts:
            self._links.drop(rec, rec.hosts[0].name, reason)

    def unregister_gang(self, key: str) -> None:
        with self._changed:
            rec = self._slices.get(key)
        if rec is None:
            return
        if rec.hosts:
            self._links.drop(rec, rec.hosts[0].name, "the VirtualSlice was deleted")
        with self._changed:
            self._slices.remove(key)
            self._changed.notify_all()

    def describe(self) -> pb.ClusterInfo:
        """The gangs the controller streams to (the operator checks its registrations against it)."""
        return self._slices.describe()

    def release_slice(self, slice_id: str, client: str) -> None:
        """A client let the slice go; the VirtualSlice, not its clients, decides when the gang goes."""
        with self._changed:
            rec = self._slices.by_id(slice_id)
            if rec is not None:
                rec.clients.discard(client)

    def host_failed(self, slice_id: str, host_name: str, reason: str) -> None:
        """A host's control stream broke: fail the gang's calls; the operator recreates the gang
        and registers it again."""
        rec = self._links.ready(slice_id)
        if rec is not None:
            self._links.drop(rec, host_name, reason)

    def close(self) -> None:
        self._links.close_all()
