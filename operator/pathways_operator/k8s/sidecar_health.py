"""Is a gang really up? Ask every host's dataflow sidecar, with a bound on the wait.

A pod whose readiness probe passes only says the sidecar accepts TCP
connections. Before the operator hands a gang to the controller it calls
``Dataflow.Health`` on each sidecar and requires ``worker_ready``: the worker
has joined the slice's JAX job and holds its devices. The calls run in
parallel, each with a deadline, so one hung host costs one timeout, not one per
host.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc

HEALTH_TIMEOUT_S = 2.0


def _probe(address: str, timeout_s: float) -> str:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = pb_grpc.DataflowStub(channel).Health(pb.HealthRequest(), timeout=timeout_s)
        except grpc.RpcError as err:
            code = err.code().name if hasattr(err, "code") else "ERROR"
            return f"sidecar {address} did not answer Health ({code})"
    if not reply.worker_ready:
        return f"sidecar {address} answers but its worker is not ready yet"
    return ""


def unready_hosts(addresses: Sequence[str], timeout_s: float = HEALTH_TIMEOUT_S) -> list[str]:
    """One sentence per sidecar that is not ready; empty when every host is."""
    if not addresses:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(addresses))) as pool:
        problems = list(pool.map(lambda a: _probe(a, timeout_s), addresses))
    return [p for p in problems if p]
