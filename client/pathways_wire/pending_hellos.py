"""A raw TCP port's connections that have not said who they are yet.

Every port the runtime serves over raw TCP (a worker's session port, a sidecar's
control port and data channel, the controller's calls port) reads a hello before it
serves a connection: the slice's token, or a program's. Until then the connection holds
a thread of the server, and whoever reaches the port may open one, token or not. A
flood of connections that never say their hello would hold a thread each: thousands of
them, until the process could start no more and its accept loop died with the
`RuntimeError`, leaving the port deaf after the flood had passed.

So a port holds at most `MAX_PENDING_HELLOS` such connections at once (each for at most
the hello's deadline): a connection past the bound is closed at once, before a thread
is spent on it, and the hosts and clients that hold a token retry on a new connection as
they do after any drop. A thread that cannot be started closes its connection and the
loop goes on (`accept_each`).
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
WARN_EVERY_S = 60.0
"""A port says at most this often that it closed connections past the bound."""


class PendingHellos:
    """How many of a port's connections await their hello, bounded by `limit`."""

    def __init__(self, name: str, limit: int = MAX_PENDING_HELLOS) -> None:
        self._name = name
        self._limit = limit
        self._lock = threading.Lock()
        self._pending = 0
        self._refused = 0
        self._warned = -WARN_EVERY_S

    @property
    def pending(self) -> int:
        return self._pending

    def take(self) -> bool:
        """Room for one more connection to say its hello; False past the bound."""
        with self._lock:
            if self._pending < self._limit:
                self._pending += 1
                return True
            self._refused += 1
            now = time.monotonic()
            if now - self._warned < WARN_EVERY_S:
                return False
            self._warned, refused, self._refused = now, self._refused, 0
        log.warning("%s: %d connection(s) closed unread: %d already await their hello",
                    self._name, refused, self._limit)
        return False

    def give_back(self) -> None:
        """A connection said its hello, or was closed without one."""
        with self._lock:
            self._pending -= 1


def accept_each(
    listener: socket.socket, pending: PendingHellos, serve: Callable[[socket.socket, str], None],
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
