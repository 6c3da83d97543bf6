"""How many connections a raw TCP port holds: before their hello, and after.

Every port the runtime serves over raw TCP (a worker's session port, a sidecar's
control port and data channel, the controller's calls port) reads a hello before it
serves a connection: the slice's token, or a program's. Until then the connection holds
a thread of the server, and whoever reaches the port may open one, token or not. A
flood of connections that never say their hello would hold a thread each: thousands of
them, until the process could start no more and its accept loop died with the
`RuntimeError`, leaving the port deaf after the flood had passed.

So a port holds at most `MAX_PENDING_HELLOS` such connections at once (each for at most
the hello's deadline): a connection past the bound is closed at once, before a thread
is spent on it. Hosts retry on a new connection, as they do after any drop, and a client's
put whose data connection is closed so goes over gRPC `Put` (`pathways.host_data`), as
does its call whose link to the controller's calls port has to connect then
(`pathways.calls_link`). A thread that cannot be started closes its connection and the
loop goes on (`accept_each`). Past the hello, a port serves at most `MAX_SERVED`
connections at once, a thread or two each: a client's token is in user code (a program's
driver), and its connections, idle for minutes, must not take the threads of everyone
else's. Past that bound a connection is refused, and the sender sees why. On a host's data
channel, connections of clients (the client form of the slice's token) are served at most
`MAX_CLIENTS_SERVED` of them, so the rest stays for the peer hosts that push the values
other slices wait for. On a port whose
callers present tokens of their own (the controller's calls port: one per program), one
token is served at most `MAX_SERVED_PER_CALLER` connections at once (`CallerCount`), so a
single driver cannot hold all of them either.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from pathways_wire import host_port

log = logging.getLogger(__name__)

MAX_PENDING_HELLOS = 64
"""Connections a port holds at once before reading their hello."""
MAX_SERVED = 256
"""Connections a port serves at once once their hello passed: each client keeps one on the
controller's calls port and at most a few idle ones on a host's data channel, and each peer
host at most one per sending thread."""
MAX_CLIENTS_SERVED = MAX_SERVED * 3 // 4
"""Clients' connections a host's data channel serves at once: the other quarter of
`MAX_SERVED` is kept for its peer hosts. Every client of a slice presents the same client
token, from user code, so a driver that held connections by the hundred would otherwise
turn away the pushes that every computation consuming another slice's value waits for."""
MAX_SERVED_PER_CALLER = 16
"""Connections one caller's token is served at once on a port of many callers' tokens: a
client keeps one on the controller's calls port (and makes a new one after a drop)."""
WARN_EVERY_S = 60.0
"""A port says at most this often that it closed connections past the bound."""


class _Refusals:
    """Counts a port's refused connections and says so at most every `WARN_EVERY_S`
    (the caller holds its count's lock while it calls `refused`)."""

    def __init__(self, name: str, why: str) -> None:
        self._name = name
        self._why = why
        self._count = 0
        self._warned = -WARN_EVERY_S

    def refused(self) -> str:
        """One more refused; the warning to log now (outside the lock), or ""."""
        self._count += 1
        now = time.monotonic()
        if now - self._warned < WARN_EVERY_S:
            return ""
        self._warned, count, self._count = now, self._count, 0
        return f"{self._name}: {count} connection(s) refused: {self._why}"


class ConnectionCount:
    """How many of a port's connections are in one stage (awaiting their hello, or served),
    bounded by `limit`; `stage` says which in the port's warning ("await their hello")."""

    def __init__(self, name: str, limit: int, stage: str) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._held = 0
        self._refusals = _Refusals(name, f"{limit} already {stage}")

    @property
    def held(self) -> int:
        return self._held

    def take(self) -> bool:
        """Room for one more connection; False past the bound."""
        with self._lock:
            if self._held < self._limit:
                self._held += 1
                return True
            warning = self._refusals.refused()
        if warning:
            log.warning("%s", warning)
        return False

    def give_back(self) -> None:
        """A connection left the stage."""
        with self._lock:
            self._held -= 1


class CallerCount:
    """How many connections each caller (by the token its hello presented) is served on a
    port at once, bounded by `limit` per caller; `name` is the port's, for its warning."""

    def __init__(self, name: str, limit: int = MAX_SERVED_PER_CALLER) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._refusals = _Refusals(name, f"their caller's token is served {limit} already")

    def take(self, caller: str) -> bool:
        """Room for one more of `caller`'s connections; False past its bound."""
        with self._lock:
            held = self._held.get(caller, 0)
            if held < self._limit:
                self._held[caller] = held + 1
                return True
            warning = self._refusals.refused()
        if warning:
            log.warning("%s", warning)
        return False

    def give_back(self, caller: str) -> None:
        """One of `caller`'s connections ended."""
        with self._lock:
            left = self._held.get(caller, 0) - 1
            if left > 0:
                self._held[caller] = left
            else:
                self._held.pop(caller, None)


def accept_each(
    listener: socket.socket, pending: ConnectionCount, serve: Callable[[socket.socket, str], None],
    thread_name: str, closed: Callable[[], bool],
) -> None:
    """Accepts connections until `listener` closes, each served by `serve(conn, peer)` on a
    thread of its own when `pending` has room; `serve` gives the room back once the hello is
    read or the connection ends. A connection past the bound, or one no thread can be had
    for, is closed at once."""
    while not closed():
        try:
            conn, peer = listener.accept()
        except OSError:
            return
        if not pending.take():
            conn.close()
            continue
        try:
            threading.Thread(target=serve, args=(conn, _peer(peer)), name=thread_name, daemon=True).start()
        except RuntimeError as err:  # no thread to be had: this connection only
            pending.give_back()
            conn.close()
            log.warning("%s: a connection from %s closed unread: %s", thread_name, _peer(peer), err)


def _peer(peer: tuple[str, int] | tuple[str, int, int, int]) -> str:
    return host_port.join(peer[0], peer[1])


def awaiting_hello(name: str) -> ConnectionCount:
    """A port's count of connections whose hello is not read yet."""
    return ConnectionCount(name, MAX_PENDING_HELLOS, "await their hello")


def served(name: str) -> ConnectionCount:
    """A port's count of connections it serves, their hello passed."""
    return ConnectionCount(name, MAX_SERVED, "are served")


def clients_served(name: str) -> ConnectionCount:
    """A data channel's count of the clients' connections it serves (`MAX_CLIENTS_SERVED`)."""
    return ConnectionCount(name, MAX_CLIENTS_SERVED, "of clients are served")
