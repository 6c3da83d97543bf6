"""Which clients lost their lease: the decision behind freeing a dead client's objects.

A client that has said `KeepAlive` once holds a lease on its calls and objects;
it renews it by saying it again. One silent for longer than the lease (it
disconnected, or was killed) loses everything it owned on every host. Clients
that never said `KeepAlive` hold no lease and keep what they have until they
free it. Pure: the controller's timer passes the clock in.
"""

from __future__ import annotations

from collections.abc import Mapping

DEFAULT_LEASE_S = 10.0


def lapsed(last_seen: Mapping[str, float], now: float, lease_s: float) -> list[str]:
    """The clients whose last `KeepAlive` is older than `lease_s` at `now`, in name order."""
    return sorted(client for client, seen in last_seen.items() if now - seen > lease_s)
