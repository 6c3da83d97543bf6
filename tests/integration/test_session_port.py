"""Hosts' control sessions on raw TCP ports, open only to the slice's token.

One one-host slice (127.0.0.25) started with a slice token. The worker offers its
session port in its gRPC session's ready event, the sidecar its control port in its
`Control` stream's first event. A `WorkerLink` built here, as the sidecar builds it,
moves to the worker's port and carries commands and events there; one told not to
(``--session-frames off``) stays on gRPC, attaches, and carries them too. A
`HostLink`, as the controller builds it, moves to the sidecar's port, or stays on
gRPC when told to. Each port answers only a hello with the token: a wrong token, a
frame of another kind and garbage are closed unanswered, and the host goes on serving.

Each link here takes the worker's session from the slice's own sidecar, which takes it
back when its link reconnects; nothing else runs on this slice.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire import session_frames as frames
from pathways_wire.slice_token import call_metadata, new_token
from pathways_operator.controller.host_link import HostLink
from pathways_worker.sidecar.worker_link import WorkerLink
from tests.integration.test_host import HostProcs, slice_with_token

pytestmark = pytest.mark.timeout(120)

TOKEN = new_token()
WAIT_S = 20.0


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcs]:
    with slice_with_token("session", "127.0.0.25", TOKEN, Path(tmp_path_factory.mktemp("session"))) as made:
        yield made


def _session_port(host: HostProcs) -> int:
    """The port the worker offers in the ready event of a gRPC session opened with the token."""
    ready = _first_event(host.worker_address, lambda channel: pb_grpc.ExecutorStub(channel).Session)
    assert ready.ready
    return int(ready.session_port)


def _control_port(host: HostProcs) -> int:
    """The port the sidecar offers in the first event of a `Control` stream opened with the token."""
    first = _first_event(host.address, lambda channel: pb_grpc.DataflowStub(channel).Control)
    assert first.hello_host
    return int(first.control_port)


def _first_event(address: str, method: Callable[[grpc.Channel], Any]) -> Any:
    channel = grpc.insecure_channel(address)
    try:
        return next(method(channel)(iter(()), timeout=WAIT_S, metadata=call_metadata(TOKEN)))
    finally:
        channel.close()


PORTS = {"worker-session-port": _session_port, "sidecar-control-port": _control_port}


def _answer_to_an_export(link: WorkerLink, call_id: str) -> pb.Exported:
    """What the worker answers, through `link`, to an export from a call it was told is released."""
    got: list[pb.Exported] = []
    arrived = threading.Event()

    def on_event(event: pb.WorkerEvent) -> None:
        got.extend(event.exported)
        if got:
            arrived.set()

    link._on_event = on_event
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
@pytest.mark.parametrize("which", PORTS)
def test_a_port_closes_on_callers_without_the_token(host: HostProcs, which: str, payload: bytes) -> None:
    port = PORTS[which](host)
    assert port > 0
    assert _knock(port, payload) == b""


@pytest.mark.parametrize("which", PORTS)
def test_a_port_answers_the_token_with_its_first_event(host: HostProcs, which: str) -> None:
    answer = _knock(PORTS[which](host), _hello(TOKEN))
    kind, _ = frames.FRAME.unpack(answer[:frames.FRAME.size])
    assert kind == frames.EVENT


@pytest.mark.parametrize("frames_wanted", [True, False], ids=["control-port", "grpc"])
def test_a_controller_link_carries_commands_on_the_port_or_on_grpc(host: HostProcs, frames_wanted: bool) -> None:
    """A release sent down the link reaches the worker: a fetch of that call is then
    refused as released, where before it is refused as not known. (The worker tests
    above took its session from the sidecar, whose first command after that only
    reconnects it, so the release is sent until the fetch says it arrived.)"""
    firsts: list[pb.HostEvent] = []
    broken: list[str] = []
    link = HostLink(host.address, "host-0", "slice-0", lambda _, event: firsts.append(event),
                    lambda _, why: broken.append(why), TOKEN, frames_wanted=frames_wanted)
    link.start()
    call_id = f"released-by-link-{frames_wanted}"
    try:
        deadline = time.monotonic() + WAIT_S
        while not firsts and time.monotonic() < deadline:
            time.sleep(0.02)
        assert firsts and firsts[0].hello_host, f"no first event ({broken})"
        assert link.on_frames is frames_wanted
        sidecar = pb_grpc.DataflowStub(grpc.insecure_channel(host.address))
        error = ""
        while not error and time.monotonic() < deadline:
            link.send(pb.HostCommand(release=pb.ReleaseCall(call_id=call_id)))
            try:
                list(sidecar.Fetch(pb.FetchRequest(call_id=call_id, value=pb.ValueRef(node=0)),
                                   timeout=1.0, metadata=call_metadata(TOKEN)))
            except grpc.RpcError as err:
                said = err.details() or ""
                if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED and "is not known on host" not in said:
                    error = said  # not known yet: the release has not reached the worker
        assert f"call {call_id} was released" in error
        assert not broken
    finally:
        link.close()


def test_programs_run_with_every_control_session_on_grpc(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PATHWAYS_CONTROL_FRAMES=off`` and ``PATHWAYS_SIDECAR_SESSION_FRAMES=off`` (a network
    that admits only the hosts' gRPC ports): an embedded cluster's calls still run, a chain
    of computations whose output the next call consumes giving the same results."""
    import numpy as np

    import pathways as pw

    monkeypatch.setenv("PATHWAYS_CONTROL_FRAMES", "off")
    monkeypatch.setenv("PATHWAYS_SIDECAR_SESSION_FRAMES", "off")
    pw.connect(islands={"island-a": 4}, devices_per_host=2)
    try:
        vslice = pw.make_virtual_device_set().add_slice(devices=2)
        step = pw.jit(lambda x: x * 2.0 + 1.0, slice=vslice)

        @pw.program(name="grpc-chain")
        def chain(x: object) -> object:
            for _ in range(4):
                x = step(x)
            return x

        x = np.arange(8, dtype=np.float32)
        once = chain(x)
        twice = np.asarray(chain(once))
        expected = x
        for _ in range(8):
            expected = expected * 2.0 + 1.0
        np.testing.assert_allclose(twice, expected)
    finally:
        pw.shutdown()
