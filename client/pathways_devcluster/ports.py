"""Loopback ports for the test servers that cannot bind port 0 and say which port they got.

Where a server can, it binds port 0 and reports its port (etcd's client URL, the
operator's controller and metrics endpoints). Four cannot:

* kube-apiserver refuses ``--secure-port=0`` ("It cannot be turned off with 0",
  ``k8s.io/apiserver/pkg/server/options/serving.go``, ``SecureServingOptions.Validate``);
* kube-controller-manager and kube-scheduler take ``--secure-port=0`` as "no HTTPS at
  all" (same file, ``ApplyTo``), which leaves no health endpoint to wait on;
* kopf's liveness endpoint reads port 0 as "no port given" and binds 80
  (``kopf/_core/engines/probing.py``: ``parts.port or HTTP_PORT``).

The old way, binding port 0, closing the socket and handing the number on, races: the
kernel gives the same ephemeral port to the next ``bind(0)`` or outgoing connection of
any process. ``reserve_port`` closes both holes instead. It takes ports *outside* the
kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), which the kernel
never hands out by itself, and claims each with an ``flock`` on a file under the temp
directory, so two test sessions on one machine never pick the same one. A reservation
lasts until ``release`` or until this process exits, however it exits.
"""

from __future__ import annotations

import fcntl
import random
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

PORT_LOCK_DIR = Path(tempfile.gettempdir()) / "kpw-ports"
RESERVED_RANGE = (20000, 32767)
"""Where reserved ports come from: below Linux's default ephemeral range (32768-60999)."""

_held: list[ReservedPort] = []


@dataclass(eq=False)
class ReservedPort:
    """A loopback port that no other test session will pick while this one holds it."""

    port: int
    _lock: IO[bytes] | None

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        if self in _held:
            _held.remove(self)


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> range:
    """The ports the kernel picks for ``bind(0)`` and outgoing connections."""
    try:
        low, high = (int(v) for v in path.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def candidate_ports(ephemeral: range, reserved: tuple[int, int] = RESERVED_RANGE) -> list[int]:
    """Ports of ``reserved`` outside ``ephemeral``; all of ``reserved`` if none are."""
    ports = [p for p in range(reserved[0], reserved[1] + 1) if p not in ephemeral]
    return ports or list(range(reserved[0], reserved[1] + 1))


def reserve_port() -> ReservedPort:
    """A free loopback port outside the ephemeral range, claimed for this process."""
    PORT_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    ports = candidate_ports(ephemeral_range())
    start = random.randrange(len(ports))
    for port in ports[start:] + ports[:start]:
        lock = open(PORT_LOCK_DIR / f"{port}.lock", "ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        if _bindable(port):
            reservation = ReservedPort(port, lock)
            _held.append(reservation)
            return reservation
        lock.close()
    raise RuntimeError(
        f"no free loopback port in {RESERVED_RANGE[0]}-{RESERVED_RANGE[1]} outside the "
        f"ephemeral range (locks in {PORT_LOCK_DIR})"
    )
