"""Is a gang really up? Ask every host's dataflow sidecar, with a bound on the wait.

A pod whose readiness probe passes only says the sidecar accepts TCP
connections, and the probe runs once a second. Before the operator hands a gang to
the controller it calls ``Dataflow.Health`` on each sidecar (once the pods run, without
waiting for that probe) and requires ``worker_ready``: the worker
has joined the slice's JAX job and holds its devices. The calls run in
parallel, each with a deadline, so one hung host costs one timeout, not one per
host.

The sidecars usually serve well before their workers have formed the JAX job
(importing jax and joining the job is most of a gang's start-up). Rather than
leave the gang to the slice's next periodic look, a :class:`FormingWatch` asks
the sidecars again and wakes the slice the moment every worker is ready, so the
slice is Ready as soon as its JAX job has formed. Each question asks the sidecar
to answer once its worker is ready or `FORMING_ASK_S` passed
(``HealthRequest.wait_ready_s``), so a forming gang costs the operator and its
sidecars one call per host every second, not one every `FORMING_POLL_S`: about
20 ms of CPU a second each, on the cores the starting hosts need. A sidecar that
answers at once (one that does not wait) is asked again after `FORMING_POLL_S`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 2.0
FORMING_POLL_S = 0.05
FORMING_ASK_S = 1.0
"""How long a watch's question may wait for a sidecar's worker to be ready."""
FORMING_WATCH_S = 120.0
"""How long a watch asks before it leaves the gang to the slice's periodic looks."""
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 250),
]
"""A watch's channels try a sidecar that refused them again within 50-250 ms: gRPC's own
back-off (1 s, growing) would hold a sidecar that starts listening a moment after the
first question unasked for a second."""


def rpc_failure(err: grpc.RpcError) -> str:
    """``CODE: details`` of a failed call, as the operator's messages quote it."""
    code = err.code().name if hasattr(err, "code") else "ERROR"
    details = err.details() if hasattr(err, "details") else ""
    return f"{code}: {details}" if details else code


def each_sidecar(ask: Callable[[str], str], addresses: Sequence[str]) -> list[str]:
    """``ask`` of each sidecar at once (a thread each, at most 16), its answers in order."""
    if not addresses:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(addresses))) as pool:
        return list(pool.map(ask, addresses))


def _ask(channel: grpc.Channel, address: str, timeout_s: float, wait_ready_s: float = 0.0) -> str:
    try:
        reply = pb_grpc.DataflowStub(channel).Health(
            pb.HealthRequest(wait_ready_s=wait_ready_s), timeout=timeout_s + wait_ready_s
        )
    except grpc.RpcError as err:
        return f"sidecar {address} did not answer Health ({rpc_failure(err)})"
    if not reply.worker_ready:
        return f"sidecar {address} answers but its worker is not ready yet"
    return ""


def _probe(address: str, timeout_s: float) -> str:
    with grpc.insecure_channel(address) as channel:
        return _ask(channel, address, timeout_s)


def unready_hosts(addresses: Sequence[str], timeout_s: float = HEALTH_TIMEOUT_S) -> list[str]:
    """One sentence per sidecar that is not ready; empty when every host is."""
    return [p for p in each_sidecar(lambda a: _probe(a, timeout_s), addresses) if p]


class FormingWatch:
    """One thread per forming gang that wakes its slice once every worker is ready."""

    def __init__(self, wake: Callable[[str], None], *, poll_s: float = FORMING_POLL_S,
                 limit_s: float = FORMING_WATCH_S, ask_s: float = FORMING_ASK_S) -> None:
        self._wake = wake
        self._poll_s = poll_s
        self._ask_s = ask_s
        self._limit_s = limit_s
        self._lock = threading.Lock()
        self._watching: dict[str, tuple[tuple[str, ...], threading.Event]] = {}

    def watch(self, key: str, addresses: tuple[str, ...]) -> None:
        """Watch the gang of ``key`` on ``addresses`` unless it is watched already."""
        with self._lock:
            found = self._watching.get(key)
            if found is not None and found[0] == addresses and not found[1].is_set():
                return
            if found is not None:
                found[1].set()
            done = threading.Event()
            self._watching[key] = (addresses, done)
        threading.Thread(target=self._run, args=(key, addresses, done), name=f"forming-{key}",
                         daemon=True).start()

    def forget(self, key: str) -> None:
        with self._lock:
            found = self._watching.pop(key, None)
        if found is not None:
            found[1].set()

    def _run(self, key: str, addresses: tuple[str, ...], done: threading.Event) -> None:
        channels = {a: grpc.insecure_channel(a, options=RECONNECT_OPTIONS) for a in addresses}
        pending = list(addresses)
        deadline = time.monotonic() + self._limit_s
        try:
            while pending and not done.wait(self._poll_s):
                still = []
                for address in pending:
                    if done.is_set():
                        return
                    if _ask(channels[address], address, HEALTH_TIMEOUT_S, self._ask_s):
                        still.append(address)
                pending = still
                if time.monotonic() > deadline:
                    return
            if not pending and not done.is_set():
                log.info("%s: every worker of the gang is ready", key)
                self._wake(key)
        finally:
            done.set()
            for channel in channels.values():
                channel.close()
