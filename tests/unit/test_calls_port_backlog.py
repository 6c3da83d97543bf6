"""The controller's calls port holds a bounded backlog of answers for a client that reads none."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from pathways_wire import calls_frames
from pathways_wire import pathways_pb2 as pb
from pathways_wire import session_frames as frames
from pathways_operator.controller import calls_port


def test_an_unknown_methods_name_is_repeated_only_in_part() -> None:
    why = calls_frames.refusal("\0" * 100_000)
    assert len(why) < 400 and "100000 characters" in why


def test_a_client_that_reads_no_answers_is_disconnected_once_its_backlog_is_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(calls_port, "MAX_BACKLOG_BYTES", 256 << 10)
    server, client = socket.socketpair()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    gate: Any = None  # unknown methods are refused before the service or the gate is asked
    connection = calls_port._Connection(gate, gate, "token", "ns/program")
    serving = threading.Thread(target=connection.serve, args=(server, frames.reader(server), "peer"), daemon=True)
    serving.start()
    client.settimeout(5.0)
    request = pb.ControllerRequest(method="x" * 4000)
    sent = 0
    closed = False
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and sent < 100_000:
        try:
            request.id = sent
            frames.send_message(client, frames.COMMAND, request)
            sent += 1
        except OSError:
            closed = True
            break
    serving.join(10)
    assert closed or not serving.is_alive(), "the port kept answering a client that reads nothing"
    assert connection._backlog_bytes <= 256 << 10
    server.close()
    client.close()
