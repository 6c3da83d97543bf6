"""A session port reads a hello before it knows its sender: bounded in size and in time.

Real loopback sockets against a `SessionPort` (the worker's session port, the sidecar's
control port and the controller's calls port are all one). Checked: a hello with the
token is served; one longer than `MAX_HELLO_BYTES` is closed before its body is read;
one trickled a byte at a time, each byte inside the read timeout, is still closed once
`HELLO_TIMEOUT_S` has passed since the connection came.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import BinaryIO

import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_wire import session_frames as frames
from tests.integration.hello_floods import closed_within, flood_past_the_bound, once_served, wait_until

TOKEN = "port-token"


@pytest.fixture
def port() -> Iterator[tuple[frames.SessionPort, list[str]]]:
    served: list[str] = []
    done = threading.Event()

    def serve(conn: socket.socket, stream: object, peer: str) -> None:
        served.append(peer)
        frames.send_message(conn, frames.EVENT, pb.WorkerEvent())
        done.wait(10)

    p = frames.SessionPort("test", "127.0.0.1", TOKEN, serve)
    yield p, served
    done.set()
    p.close()



def test_a_hello_with_the_token_is_served(port: tuple[frames.SessionPort, list[str]]) -> None:
    p, served = port
    sock, stream = frames.connect("127.0.0.1", p.port, TOKEN, pb.WorkerEvent())
    with sock, stream:
        assert len(served) == 1


def test_a_hello_past_its_bound_is_closed_before_its_body_is_read(port: tuple[frames.SessionPort, list[str]]) -> None:
    p, served = port
    with socket.create_connection(("127.0.0.1", p.port), timeout=10) as sock:
        sock.sendall(frames.FRAME.pack(frames.HELLO, frames.MAX_HELLO_BYTES + 1))
        assert closed_within(sock, 5.0)
    assert served == []


def test_a_hello_trickled_past_its_deadline_is_closed(
    port: tuple[frames.SessionPort, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frames, "HELLO_TIMEOUT_S", 0.6)
    p, served = port
    started = time.monotonic()
    closed = False
    with socket.create_connection(("127.0.0.1", p.port), timeout=10) as sock:
        sock.sendall(frames.FRAME.pack(frames.HELLO, 1000))
        for _ in range(40):  # a byte every 0.1 s: each read waits far less than the timeout
            try:
                sock.sendall(b"x")
            except OSError:
                closed = True
                break
            if closed_within(sock, 0.1):
                closed = True
                break
    assert closed, "the port kept a hello that never ended"
    assert time.monotonic() - started < 3.0
    assert served == []


def test_connections_past_the_bound_of_unsaid_hellos_are_closed_at_once_and_the_port_recovers(
    port: tuple[frames.SessionPort, list[str]],
) -> None:
    p, served = port
    flood_past_the_bound(("127.0.0.1", p.port))
    assert served == []
    sock, stream = once_served(lambda: frames.connect("127.0.0.1", p.port, TOKEN, pb.WorkerEvent()),
                               (OSError, ValueError), "the port")
    with sock, stream:
        assert len(served) == 1


def test_sessions_past_the_bound_of_served_connections_are_closed_unanswered(
    port: tuple[frames.SessionPort, list[str]],
) -> None:
    from pathways_wire.port_connections import MAX_SERVED

    p, served = port
    held: list[tuple[socket.socket, BinaryIO]] = []
    try:
        for _ in range(MAX_SERVED):  # each connect waits for its answer: the hellos never pile up
            held.append(frames.connect("127.0.0.1", p.port, TOKEN, pb.WorkerEvent()))
        wait_until(lambda: p.served == MAX_SERVED, "every held session served")
        with pytest.raises((OSError, ValueError)):
            frames.connect("127.0.0.1", p.port, TOKEN, pb.WorkerEvent())
        assert len(served) == MAX_SERVED
    finally:
        for sock, stream in held:
            stream.close()
            sock.close()


def test_a_callers_sessions_past_its_own_bound_are_closed_while_another_caller_is_served() -> None:
    """A port of many callers' tokens (the controller's calls port) serves one token at most
    `per_caller` connections at once: the next is closed unanswered, another token's is
    served, and once one of the first caller's ends, that caller is served again."""
    served: list[str] = []

    def serve(conn: socket.socket, stream: BinaryIO, peer: str) -> None:
        served.append(peer)
        frames.send_message(conn, frames.EVENT, pb.WorkerEvent())
        stream.read()  # until the caller closes its end

    def admit(hello: pb.SessionHello, peer: str) -> frames.Serve | None:
        return serve if hello.token in ("driver-a", "driver-b") else None

    p = frames.SessionPort("test calls", "127.0.0.1", "", None, admit=admit, per_caller=3)
    held: list[tuple[socket.socket, BinaryIO]] = []
    try:
        for _ in range(3):
            held.append(frames.connect("127.0.0.1", p.port, "driver-a", pb.WorkerEvent()))
        with pytest.raises((OSError, ValueError)):
            frames.connect("127.0.0.1", p.port, "driver-a", pb.WorkerEvent())
        held.append(frames.connect("127.0.0.1", p.port, "driver-b", pb.WorkerEvent()))
        assert len(served) == 4 and p.served == 4
        sock, stream = held.pop(0)  # one of driver-a's ends
        stream.close()
        sock.close()
        wait_until(lambda: p.served == 3, "the ended session given back")
        held.append(frames.connect("127.0.0.1", p.port, "driver-a", pb.WorkerEvent()))
        assert len(served) == 5
    finally:
        for sock, stream in held:
            stream.close()
            sock.close()
        p.close()
