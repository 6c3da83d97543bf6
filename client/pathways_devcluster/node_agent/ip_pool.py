"""Pod IPs for the node agent: one loopback /24 per agent, one address per pod.

The agent is a stand-in for the kubelet, not a kubelet, and has no CNI: each pod
it runs gets a loopback address ``<subnet>.N`` (N from 10, the lowest free first, reused
once the pod is gone), and its containers bind that address as they would a pod IP.
Linux routes all of 127/8 to ``lo``, so nothing needs configuring.

The /24 itself is claimed with an ``flock`` on a file under the temp directory, so a
second agent, or a second test session on the same machine, takes the next free one
(127.0.1, 127.0.2, ...); the lock goes with the process however it exits.
"""

from __future__ import annotations

import fcntl
import tempfile
import threading
from pathlib import Path
from typing import IO

SUBNET_LOCK_DIR = Path(tempfile.gettempdir()) / "kpw-pod-subnets"


def claim_subnet(wanted: str = "auto") -> tuple[str, IO[bytes]]:
    """Locks a loopback /24 for this process's pods; returns it and the held lock file.

    ``auto`` takes the first of 127.0.0, 127.0.1, ... that no live agent holds.
    """
    SUBNET_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    candidates = [f"127.0.{k}" for k in range(255)] if wanted == "auto" else [wanted]
    for subnet in candidates:
        lock = open(SUBNET_LOCK_DIR / f"{subnet}.lock", "ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return subnet, lock
        except BlockingIOError:
            lock.close()
    raise RuntimeError(f"pod subnet {wanted} is held by another node agent ({SUBNET_LOCK_DIR})")


class IpAllocator:
    """``<subnet>.N`` for N in [first, 254], lowest free first, reused once released."""

    def __init__(self, subnet: str = "127.0.0", first: int = 10) -> None:
        self._subnet = subnet
        self._first = first
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            for n in range(self._first, 255):
                if n not in self._used:
                    self._used.add(n)
                    return f"{self._subnet}.{n}"
        raise RuntimeError(f"no free pod IP left in {self._subnet}.{self._first}-254")

    def release(self, ip: str) -> None:
        with self._lock:
            self._used.discard(int(ip.rsplit(".", 1)[1]))
