"""A sidecar reaches its worker over the worker's session port, and only with the slice's token.

One one-host slice (127.0.0.25) started with a slice token. The worker offers its
session port in its gRPC session's ready event. A `WorkerLink` built here, as the
sidecar builds it, moves to the port and carries commands and events there; one told
not to (``--session-frames off``) stays on gRPC, attaches, and carries them too.
The port itself answers ready only to a hello with the token: a wrong token, a frame
of another kind and garbage are closed unanswered, and the worker goes on serving.

Each link here takes the worker's session from the slice's own sidecar, which takes it
back when its link reconnects; nothing else runs on this slice.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire import session_frames as frames
from pathways_wire.slice_token import ENV_TOKEN, call_metadata, new_token
from pathways_worker.sidecar.worker_link import WorkerLink
from tests.integration.test_host import HostProcs, start_slice, stop_hosts

pytestmark = pytest.mark.timeout(120)

TOKEN = new_token()
WAIT_S = 20.0


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcs]:
    saved = os.environ.get(ENV_TOKEN)
    os.environ[ENV_TOKEN] = TOKEN
    try:
        hosts = start_slice("session", ["127.0.0.25"], 1, Path(tmp_path_factory.mktemp("session")))
    finally:
        if saved is None:
            os.environ.pop(ENV_TOKEN, None)
        else:
            os.environ[ENV_TOKEN] = saved
    try:
        yield hosts[0]
    finally:
        stop_hosts(hosts)


def _session_port(host: HostProcs) -> int:
    """The port the worker offers in the ready event of a gRPC session opened with the token."""
    channel = grpc.insecure_channel(host.worker_address)
    try:
        events = pb_grpc.ExecutorStub(channel).Session(iter(()), timeout=WAIT_S, metadata=call_metadata(TOKEN))
        ready = next(events)
        assert ready.ready
        return int(ready.session_port)
    finally:
        channel.close()


def _answer_to_an_export(link: WorkerLink, call_id: str) -> pb.Exported:
    """What the worker answers, through `link`, to an export from a call it was told is released."""
    got: list[pb.Exported] = []
    arrived = threading.Event()

    def on_event(event: pb.WorkerEvent) -> None:
        got.extend(event.exported)
        if got:
            arrived.set()

    link._on_event = on_event  # type: ignore[method-assign]
    link.send(pb.WorkerCommand(release=pb.ReleaseCall(call_id=call_id)))
    link.send(pb.WorkerCommand(export=pb.ExportRequest(call_id=call_id, value=pb.ValueRef(node=0), token=7)))
    assert arrived.wait(WAIT_S), "the worker answered nothing to the export"
    return got[0]


@pytest.mark.parametrize("frames_wanted", [True, False], ids=["session-port", "grpc"])
def test_a_link_carries_commands_and_events_on_the_port_or_on_grpc(host: HostProcs, frames_wanted: bool) -> None:
    link = WorkerLink(host.worker_address, lambda event: None, TOKEN, frames_wanted=frames_wanted)
    try:
        assert link.wait_ready(WAIT_S), "the worker never answered ready"
        assert link.on_frames is frames_wanted
        assert link.worker_host
        answer = _answer_to_an_export(link, f"released-{frames_wanted}")
        assert answer.token == 7
        assert f"call released-{frames_wanted} was released" in answer.error
    finally:
        link.stop()


def _knock(port: int, payload: bytes) -> bytes:
    """What the session port answers to `payload` before it closes (b"" for nothing)."""
    with socket.create_connection(("127.0.0.25", port), timeout=WAIT_S) as sock:
        sock.sendall(payload)
        sock.settimeout(frames.HELLO_TIMEOUT_S + WAIT_S)
        answer = b""
        deadline = time.monotonic() + frames.HELLO_TIMEOUT_S + WAIT_S
        while time.monotonic() < deadline:
            chunk = sock.recv(1 << 16)
            if not chunk:
                return answer
            answer += chunk
            if len(answer) >= frames.FRAME.size:
                return answer
        raise AssertionError("the session port neither answered nor closed")


def _hello(token: str) -> bytes:
    body = pb.SessionHello(token=token).SerializeToString()
    return frames.FRAME.pack(frames.HELLO, len(body)) + body


@pytest.mark.parametrize(
    "payload",
    [_hello(new_token()), _hello(""), frames.FRAME.pack(frames.COMMAND, 0), b"GET / HTTP/1.1\r\n\r\n",
     frames.FRAME.pack(frames.HELLO, frames.MAX_FRAME_BYTES + 1)],
    ids=["other-slice-token", "no-token", "command-before-hello", "garbage", "oversized-hello"],
)
def test_the_session_port_closes_on_callers_without_the_token(host: HostProcs, payload: bytes) -> None:
    port = _session_port(host)
    assert port > 0
    assert _knock(port, payload) == b""


def test_the_session_port_answers_ready_to_the_token(host: HostProcs) -> None:
    answer = _knock(_session_port(host), _hello(TOKEN))
    kind, _ = frames.FRAME.unpack(answer[:frames.FRAME.size])
    assert kind == frames.EVENT
