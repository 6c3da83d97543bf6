"""Handing a ready gang to the island scheduler, and taking it back.

A gang is registered with the controller (``pathways_operator.controller``) only
once every pod runs and every sidecar answers ``Dataflow.Health`` with
``worker_ready`` (not waiting for the pods' readiness probe, which says less); programs can use it from then on. A gang that is torn
down (lost host, preemption, suspension, refused pods) is reported lost, so the
calls running on it fail over instead of waiting. :class:`GangRegistrations`
remembers which generation, on which addresses, this process registered, and
while a gang's workers are still forming their JAX job it has them watched
(``sidecar_health.FormingWatch``), so the slice is looked at again the moment
they are ready rather than at its next periodic look.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb
from pathways_operator.core.placement import Placement
from pathways_operator.k8s.gang_pods import host_name
from pathways_operator.k8s.coordinator_handoff import CoordinatorTeller
from pathways_operator.k8s.sidecar_health import FormingWatch, unready_hosts

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GangHost:
    """A host as the controller sees it: a name for messages, an address to stream to."""

    name: str
    sidecar_address: str


class GangRegistry(Protocol):
    """What the resource manager tells the island scheduler (``pathways_operator.controller``)."""

    def register_gang(
        self, key: str, decl: ir.SliceDecl, placement: Placement, hosts: Sequence[GangHost],
        token: str = "",
    ) -> None: ...

    def gang_lost(self, key: str, reason: str) -> None: ...

    def unregister_gang(self, key: str) -> None: ...

    def describe(self) -> pb.ClusterInfo: ...


class GangRegistrations:
    """The gangs this process registered with the controller: generation and sidecar addresses."""

    def __init__(self, registry: GangRegistry, wake: Callable[[str], None] = lambda key: None) -> None:
        self._registry = registry
        self._forming = FormingWatch(wake)
        self._lock = threading.Lock()
        self._registered: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._teller = CoordinatorTeller()

    def generation(self, key: str) -> int | None:
        with self._lock:
            found = self._registered.get(key)
        return None if found is None else found[0]

    def release(self, key: str, why: str, *, always_tell: bool = False) -> None:
        """Forget the gang; tell the controller it is lost if it had it (or ``always_tell``)."""
        self._forming.forget(key)
        with self._lock:
            had = self._registered.pop(key, None) is not None
        self._teller.forget(key)
        if had or always_tell:
            self._registry.gang_lost(key, why)

    def unregister(self, key: str) -> None:
        """The slice is deleted: the controller forgets the gang."""
        self._forming.forget(key)
        self._registry.unregister_gang(key)
        with self._lock:
            self._registered.pop(key, None)
        self._teller.forget(key)

    def tell_coordinator(
        self, key: str, generation: int, coordinator: str, token: str, addresses: Sequence[str]
    ) -> None:
        """Tell these hosts after 0 host 0's JAX coordinator address as soon as each sidecar
        listens, in the background (``coordinator_handoff``): a pod's sidecar listens well
        before the pod is Ready, and its worker waits for the address."""
        self._teller.tell(key, generation, coordinator, token, addresses)

    def ensure(
        self, key: str, name: str, devices: int, generation: int, placement: Placement,
        addresses: tuple[str, ...], token: str, coordinator: str,
    ) -> str:
        """Register the serving gang unless the controller has it already; returns why not, or "".

        ``coordinator``: host 0's JAX coordinator address; any host after 0 not yet told it
        (`tell_coordinator`) is told now, before its Health is asked."""
        with self._lock:
            known = self._registered.get(key) == (generation, addresses)
        if known and not self._controller_has(addresses):
            log.warning("%s: the controller dropped the gang while its pods run; registering it again", key)
            known = False
            with self._lock:
                self._registered.pop(key, None)
        if known:
            return ""
        not_told = self._teller.tell_now(key, generation, coordinator, token, addresses[1:])
        if not_told:
            return "; ".join(not_told)
        problems = unready_hosts(addresses)
        if problems:
            self._forming.watch(key, addresses)
            return "; ".join(problems)
        self._forming.forget(key)
        decl = ir.SliceDecl(
            id=name, name=name, devices=devices,
            devices_per_host=placement.devices_per_host, island=placement.island,
        )
        gang = [GangHost(host_name(name, h.index), address) for h, address in zip(placement.hosts, addresses)]
        try:
            self._registry.register_gang(key, decl, placement, gang, token)
        except Exception as err:  # the controller refused: report and retry next look
            log.exception("registering the gang of %s with the controller failed", key)
            return f"the controller refused the gang: {err}"
        with self._lock:
            self._registered[key] = (generation, addresses)
        return ""

    def _controller_has(self, addresses: tuple[str, ...]) -> bool:
        """Whether the controller still streams to exactly these hosts (a broken link drops a gang)."""
        return any(
            tuple(h.address for h in info.hosts) == addresses for info in self._registry.describe().slices
        )
