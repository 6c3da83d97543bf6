"""Host 0's JAX coordinator address, handed to the other hosts of a forming gang.

Every pod of a gang is created at once, before host 0's pod has the IP its worker
serves the slice's ``jax.distributed`` coordinator on, so the other hosts' workers
start without it. The operator tells their sidecars (``Dataflow.Coordinator``, with the
slice's token), and each sidecar hands it to its worker
(``pathways_worker.coordinator_file``), which waits for it once it has imported jax.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Sequence

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.port_probe import accepts
from pathways_wire.slice_token import METADATA_KEY

from pathways_operator.k8s.sidecar_health import each_sidecar, rpc_failure

log = logging.getLogger(__name__)

TELL_TIMEOUT_S = 2.0
TELL_RETRY_S = 0.05
"""How often a sidecar not yet told is tried again (a TCP connect while it does not listen)."""
TELL_LIMIT_S = 120.0
"""How long a gang's hosts are tried in the background; the worker waits as long."""


def _tell(address: str, coordinator: str, token: str, timeout_s: float = TELL_TIMEOUT_S) -> str:
    """"" once the sidecar at ``address`` took ``coordinator``; else why not."""
    with grpc.insecure_channel(address) as channel:
        try:
            pb_grpc.DataflowStub(channel).Coordinator(
                pb.CoordinatorRequest(address=coordinator), timeout=timeout_s,
                metadata=((METADATA_KEY, token),),
            )
        except grpc.RpcError as err:
            return f"sidecar {address} was not told the JAX coordinator address ({rpc_failure(err)})"
    return ""


def _tell_each(addresses: Sequence[str], coordinator: str, token: str) -> list[str]:
    """`_tell` for each of ``addresses`` in parallel, in their order."""
    return each_sidecar(lambda a: _tell(a, coordinator, token), addresses)


@dataclasses.dataclass(eq=False)
class _Telling:
    """What a gang's hosts after 0 are told, and which were."""

    generation: int
    coordinator: str
    token: str
    pending: set[str] = dataclasses.field(default_factory=set)
    told: set[str] = dataclasses.field(default_factory=set)
    running: bool = False
    done: threading.Event = dataclasses.field(default_factory=threading.Event)


class CoordinatorTeller:
    """Tells a forming gang's hosts after 0 host 0's JAX coordinator address, each the moment
    its sidecar listens.

    A host's worker waits for that address once it has imported jax, and its pod turns
    Ready (its sidecar's readiness probe, every second) only later than its sidecar
    listens: telling the hosts only once every pod was Ready held the job's forming back
    by up to that probe. So the slice's reconciler hands each host over as soon as it and
    host 0 have pod IPs (:meth:`tell`), and one thread per gang tries every host not yet
    told each `TELL_RETRY_S` (a TCP connect first, so a sidecar not yet listening costs no
    gRPC call), for at most `TELL_LIMIT_S`; :meth:`tell_now` tells, before the gang is
    registered, any host still not told.
    """

    def __init__(self, *, retry_s: float = TELL_RETRY_S, limit_s: float = TELL_LIMIT_S) -> None:
        self._retry_s = retry_s
        self._limit_s = limit_s
        self._lock = threading.Lock()
        self._gangs: dict[str, _Telling] = {}

    def tell(self, key: str, generation: int, coordinator: str, token: str, addresses: Iterable[str]) -> None:
        """Have each of ``addresses`` told ``coordinator`` in the background, unless it was."""
        with self._lock:
            telling = self._telling(key, generation, coordinator, token)
            telling.pending.update(a for a in addresses if a not in telling.told)
            if not telling.pending or telling.running:
                return
            telling.running = True
        threading.Thread(target=self._run, args=(key, telling), name=f"coordinator-{key}", daemon=True).start()

    def tell_now(self, key: str, generation: int, coordinator: str, token: str, addresses: Sequence[str]) -> list[str]:
        """Tell every one of ``addresses`` not told yet, at once; one sentence per sidecar that was not told."""
        with self._lock:
            telling = self._telling(key, generation, coordinator, token)
            left = [a for a in addresses if a not in telling.told]
        problems = []
        for address, problem in zip(left, _tell_each(left, coordinator, token), strict=True):
            if problem:
                problems.append(problem)
            else:
                self._told(telling, address)
        return problems

    def forget(self, key: str) -> None:
        with self._lock:
            telling = self._gangs.pop(key, None)
        if telling is not None:
            telling.done.set()

    def _telling(self, key: str, generation: int, coordinator: str, token: str) -> _Telling:
        """The gang's telling for this generation and address (under the lock); an earlier one ends."""
        telling = self._gangs.get(key)
        if telling is None or (telling.generation, telling.coordinator, telling.token) != (
            generation, coordinator, token
        ):
            if telling is not None:
                telling.done.set()
            telling = self._gangs[key] = _Telling(generation, coordinator, token)
        return telling

    def _told(self, telling: _Telling, address: str) -> None:
        with self._lock:
            telling.told.add(address)
            telling.pending.discard(address)

    def _run(self, key: str, telling: _Telling) -> None:
        deadline = time.monotonic() + self._limit_s
        while True:
            with self._lock:
                pending = sorted(telling.pending)
                if not pending or telling.done.is_set() or time.monotonic() > deadline:
                    telling.running = False
                    return
            for address in pending:
                if accepts(address) and not _tell(address, telling.coordinator, telling.token):
                    log.info("%s: sidecar %s told the JAX coordinator %s", key, address, telling.coordinator)
                    self._told(telling, address)
            telling.done.wait(self._retry_s)
