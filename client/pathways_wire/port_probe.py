"""Does anything accept connections at HOST:PORT yet? One TCP connect, then close.

A gang's processes start together and wait for each other: a worker for its
slice's JAX coordinator (host 0, still importing jax), a sidecar for its own
worker, the embedded launcher for every worker. Asking with a plain connect
costs tens of microseconds of CPU when nobody listens; opening a gRPC channel
and stream to find the same out costs about a millisecond and threads of its
own, on cores the starting processes need.
"""

from __future__ import annotations

import socket

from pathways_wire import host_port

PROBE_TIMEOUT_S = 1.0


def accepts(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``address`` (``HOST:PORT``; an IPv6 host may be in brackets) accepts a TCP connection."""
    try:
        with socket.create_connection(host_port.split(address), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False
