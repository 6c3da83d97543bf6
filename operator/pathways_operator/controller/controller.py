"""The controller: resource manager and island scheduler behind one lock.

It owns three tables — slices (`slices`: gangs of hosts), programs
(`programs`: loaded IR bound to slices) and calls (`calls`: running program
calls) — and turns client requests into host commands. Where gangs come from
is its `Gangs` strategy's business (`gangs`): the embedded runtime places and
starts local hosts itself, on Kubernetes the operator registers the gangs it
placed. Everything else is the same on both:

* A call (`calls.run`) is planned once per program and set of gangs
  (`plans`) and stamped with the call; its computations go to the island
  scheduler and every host gets its grants; hosts then run on their own while
  the controller counts their batched completions.
* A host that dies fails the calls on its slice at once (every other host of
  those calls is told, so nothing waits forever) and its gang is replaced.
* Objects (outputs a client keeps) stay on the hosts that made it until the
  client drops them or its lease lapses (`calls`, `objects`).
* Every slice has a token (`pathways_wire.slice_token`) its hosts demand on
  every call: the controller presents it on its control streams, hands it to
  its clients in `SliceInfo` and `RunReply.host_tokens` (its client form), and puts the
  receiving slice's token on every `Route`, so a slice's hosts can push only
  where the program sends values.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb
from pathways_operator.controller.calls import SHARED_WINDOW, Calls
from pathways_operator.controller.gangs import (
    EmbeddedGangs, GangLinks, Gangs, HostLauncher, KubernetesGangs, SliceAsk,
)
from pathways_operator.controller.programs import Programs
from pathways_operator.controller.slices import SliceTable
from pathways_operator.core.placement import Machine

G_co = TypeVar("G_co", bound=Gangs, covariant=True)

LEASE_CHECK_S = 0.5
"""How often lapsed client leases, and held host failures past their grace, are looked for."""

WINDOW = 256
"""Grants outstanding per slice while one call has work for it."""


class Controller(Generic[G_co]):
    """The single controller every client and driver talks to; `gangs` says where its gangs come from."""

    def __init__(
        self,
        machines: Callable[[], list[Machine]],
        gangs: Callable[[SliceTable, GangLinks], G_co],
        window: int = WINDOW,
        shared_window: int = SHARED_WINDOW,
    ) -> None:
        """`machines`: the devices there are (the controller counts its own slices'
        use on top); `gangs`: builds the strategy over the controller's tables."""
        self._slices = SliceTable(machines)
        self._programs = Programs()
        self.calls = Calls(self._slices, self._programs, window, shared_window)
        """Program calls: run, wait for, finish."""
        self.gangs: G_co = gangs(self._slices, GangLinks(self._slices, self.calls))
        self._stopped = threading.Event()
        threading.Thread(target=self._expire_leases, name="client-leases", daemon=True).start()

    def _expire_leases(self) -> None:
        """Frees what clients that stopped saying KeepAlive owned (`core.client_leases`), and
        fails calls whose held host failure ran out of grace (`core.call_tracking`)."""
        while not self._stopped.wait(LEASE_CHECK_S):
            now = time.monotonic()
            self.calls.expire_leases(now)
            self.calls.fail_held(now)

    @staticmethod
    def embedded(
        machines: Callable[[], list[Machine]],
        launcher: HostLauncher,
        window: int = WINDOW,
        shared_window: int = SHARED_WINDOW,
    ) -> Controller[EmbeddedGangs]:
        """The embedded runtime's controller: it places gangs on `machines` and starts them with `launcher`."""
        return Controller(
            machines, lambda slices, links: EmbeddedGangs(slices, links, launcher), window, shared_window
        )

    @staticmethod
    def kubernetes(
        machines: Callable[[], list[Machine]],
        explain_missing: Callable[[str], str] | None = None,
    ) -> Controller[KubernetesGangs]:
        """The operator's controller: gangs are VirtualSlices the operator registers
        (`explain_missing` says why one is not there yet)."""
        return Controller(machines, lambda slices, links: KubernetesGangs(slices, links, explain_missing))

    @property
    def computations_dispatched(self) -> int:
        return self.calls.dispatched

    def contended_grants(self) -> dict[float, int]:
        return self.calls.contended_grants()

    def create_slice(
        self, decl: ir.SliceDecl, client: str, timeout_s: float, namespace: str = ""
    ) -> pb.SliceInfo:
        """The slice `decl` for `client`, waiting up to `timeout_s` for it to be ready."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        return self.gangs.create_slice(SliceAsk(decl, client, namespace, timeout_s, deadline))

    def release_slice(self, slice_id: str, client: str) -> None:
        self.gangs.release_slice(slice_id, client)

    def host_failed(self, slice_id: str, host_name: str, reason: str) -> None:
        """A host of `slice_id` is gone: fail its calls and replace the gang."""
        self.gangs.host_failed(slice_id, host_name, reason)

    def load_program(self, program: ir.Program, bindings: dict[str, str]) -> str:
        with self._slices.lock:
            return self._programs.load(program, bindings, self._slices.live_decl)

    def describe(self) -> pb.ClusterInfo:
        return self._slices.describe()

    def close(self) -> None:
        self._stopped.set()
        self.gangs.close()
