"""The slice's JAX coordinator address, handed from a host's sidecar to its worker.

Host 0's worker serves the slice's ``jax.distributed`` coordination service on its own
pod IP, which exists only once that pod has started. The operator creates every pod
of a gang at once rather than waiting for that IP, so the other hosts start without
the address: the operator tells each of their sidecars (``Dataflow.Coordinator``,
which only holders of the slice's token may call) as soon as host 0 has its IP, the
sidecar writes it into the shared-memory directory the two containers share, and
the worker, once it has imported jax, waits for it there (:func:`wait_for`).

The file is written once, whole (a hard link to a finished file), and never changed: a
second address for the same host is refused, since a worker may already have joined
the first.
"""

from __future__ import annotations

import os
import tempfile
import time

from pathways_wire import host_port

FILE_NAME = "jax-coordinator"
"""In the host's shared-memory directory."""
POLL_S = 0.02


class CoordinatorConflict(Exception):
    """This host was already given another address."""


def path_in(shm_dir: str) -> str:
    return os.path.join(shm_dir, FILE_NAME)


def check_address(address: str) -> str:
    """``address`` as `host_port.join` writes it (an IPv6 host in brackets) if it is
    HOST:PORT with a port in 1..65535; ValueError naming it otherwise."""
    try:
        host, port = host_port.split(address)
    except ValueError:
        host, port = "", 0
    if port == 0:
        raise ValueError(f"coordinator address {address!r} is not HOST:PORT with a port in 1..65535 "
                         "(an IPv6 host in brackets: [fd00::5]:8476)")
    return host_port.join(host, port)


def write(shm_dir: str, address: str) -> bool:
    """Writes the address for the worker; False when it was written before (the same
    address). Raises CoordinatorConflict for another address, ValueError for a malformed one.

    Writers may race (the operator can tell a sidecar twice at once, and its gRPC threads
    serve both): each writes a partial file of its own and links it in as the address
    only if none is there yet, so exactly one write takes and the rest compare."""
    address = check_address(address)
    path = path_in(shm_dir)
    os.makedirs(shm_dir, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=shm_dir, prefix=f"{FILE_NAME}.", suffix=".partial")
    try:
        os.fchmod(fd, 0o644)  # the worker container may run as another user
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(address)
        try:
            os.link(partial, path)
            return True
        except FileExistsError:
            pass
    finally:
        os.unlink(partial)
    found = read(shm_dir)
    if found != address:
        raise CoordinatorConflict(f"this host was already given coordinator {found}, not {address}")
    return False


def read(shm_dir: str) -> str | None:
    try:
        with open(path_in(shm_dir), encoding="ascii") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def wait_for(shm_dir: str, within_s: float, poll_s: float = POLL_S) -> str | None:
    """The address once the sidecar has written it; None if ``within_s`` passed first."""
    deadline = time.monotonic() + within_s
    while True:
        found = read(shm_dir)
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


def remove(shm_dir: str) -> None:
    try:
        os.unlink(path_in(shm_dir))
    except FileNotFoundError:
        pass
