"""How many connections a port holds, before and after their hello: bounded, and a failed thread costs one connection."""

from __future__ import annotations

import socket
import threading
import pytest

from pathways_wire import port_connections
from pathways_wire.port_connections import ConnectionCount, accept_each, awaiting_hello


def test_room_is_bounded_and_comes_back() -> None:
    pending = ConnectionCount("test", 2, "await their hello")
    assert pending.take() and pending.take()
    assert not pending.take()
    pending.give_back()
    assert pending.take()
    assert pending.held == 2


def test_a_connection_no_thread_can_be_had_for_is_closed_and_the_next_is_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_thread = threading.Thread
    failures = [1]

    class FlakyThread(real_thread):  # type: ignore[misc, valid-type]
        def start(self) -> None:
            if self.name == "test-conn" and failures[0]:
                failures[0] -= 1
                raise RuntimeError("can't start new thread")
            super().start()

    listener = socket.create_server(("127.0.0.1", 0))
    pending = awaiting_hello("test")
    served = threading.Event()

    def serve(conn: socket.socket, peer: str) -> None:
        pending.give_back()
        conn.sendall(b"hi")
        conn.close()
        served.set()

    monkeypatch.setattr(threading, "Thread", FlakyThread)  # the module port_connections starts threads with
    loop = real_thread(target=accept_each, args=(listener, pending, serve, "test-conn", lambda: False), daemon=True)
    loop.start()
    try:
        with socket.create_connection(listener.getsockname(), timeout=5) as first:
            assert first.recv(2) == b""  # closed: no thread for it
        with socket.create_connection(listener.getsockname(), timeout=5) as second:
            assert second.recv(2) == b"hi"
        assert served.wait(5) and loop.is_alive()
        assert pending.held == 0
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the loop's accept
        listener.close()
        loop.join(5)
        assert not loop.is_alive()


def test_past_the_bound_a_connection_is_closed_before_a_thread_is_spent() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    pending = ConnectionCount("test", 1, "await their hello")
    release = threading.Event()
    started: list[str] = []

    def serve(conn: socket.socket, peer: str) -> None:
        started.append(peer)
        release.wait(5)
        pending.give_back()
        conn.close()

    loop = threading.Thread(target=accept_each, args=(listener, pending, serve, "test-conn", lambda: False),
                            daemon=True)
    loop.start()
    try:
        held = socket.create_connection(listener.getsockname(), timeout=5)
        with socket.create_connection(listener.getsockname(), timeout=5) as extra:
            assert extra.recv(1) == b""
        assert len(started) == 1
        release.set()
        held.close()
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the loop's accept
        listener.close()
        loop.join(5)
        assert not loop.is_alive()
