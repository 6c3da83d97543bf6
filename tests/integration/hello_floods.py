"""Floods of connections that never say their hello, for the tests of every raw TCP port."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from pathways_wire.port_connections import MAX_PENDING_HELLOS

T = TypeVar("T")
RECOVERY_S = 5.0


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the other end closed `sock` within `seconds`."""
    ready, _, _ = select.select([sock], [], [], seconds)
    return bool(ready) and sock.recv(1) == b""


@contextmanager
def held_past_the_bound(address: tuple[str, int]) -> Iterator[None]:
    """Holds `MAX_PENDING_HELLOS` connections that say nothing and checks that one more is
    closed at once; the flood lasts while the block runs (at most the port's hello
    deadline, `session_frames.HELLO_TIMEOUT_S`, after which the port closes them)."""
    silent = [socket.create_connection(address, timeout=10) for _ in range(MAX_PENDING_HELLOS)]
    try:
        with socket.create_connection(address, timeout=10) as extra:
            assert closed_within(extra, 2.0), "a connection past the bound was kept"
        yield
    finally:
        for sock in silent:
            sock.close()


def flood_past_the_bound(address: tuple[str, int]) -> None:
    """Holds `MAX_PENDING_HELLOS` connections that say nothing, checks that one more is
    closed at once, then closes them all."""
    with held_past_the_bound(address):
        pass


def once_served(attempt: Callable[[], T], refused: tuple[type[BaseException], ...], what: str) -> T:
    """`attempt()`'s result, tried again while it is refused: the flood's rooms come back as
    the port reads the ends of its connections, within `RECOVERY_S`."""
    deadline = time.monotonic() + RECOVERY_S
    while True:
        try:
            return attempt()
        except refused:
            assert time.monotonic() < deadline, f"{what} never served again"
            time.sleep(0.05)


def wait_until(check: Callable[[], bool], what: str, within_s: float = RECOVERY_S) -> None:
    """Polls `check` until it holds; fails naming `what` after `within_s`."""
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {within_s:g} s"
        time.sleep(0.02)
