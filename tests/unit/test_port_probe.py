"""Asking whether a port accepts connections, before anything heavier is opened to it."""

from __future__ import annotations

import socket

from pathways_wire.port_probe import accepts


def test_a_listening_port_accepts_and_the_probe_leaves_no_connection_open() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert accepts(address)
        server.settimeout(5.0)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(5.0)
            assert conn.recv(1) == b"", "the probe closes its connection at once"


def test_a_bound_port_that_does_not_listen_refuses() -> None:
    # how a launcher holds a port for a process that has not started serving yet
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        assert not accepts(f"127.0.0.1:{held.getsockname()[1]}")


def test_an_address_in_brackets_is_probed_without_them() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert accepts(f"[127.0.0.1]:{server.getsockname()[1]}")


def test_an_address_without_a_port_number_is_refused_not_raised() -> None:
    assert not accepts("127.0.0.1:worker")
    assert not accepts("no-port-at-all")
