"""The client's link to a calls port (`pathways.calls_link`), against a port served here.

Each test serves a loopback port with `session_frames.SessionPort` that admits the hello
with the right token and answers requests as the test says: out of order, with an
error, never, or by closing the connection. The controller behind a real port is
`tests/integration/test_calls_port.py`.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO

import grpc
import pytest

from pathways.calls_link import CallsLink, CallsPortError, credentials_of
from pathways_wire import calls_frames
from pathways_wire import pathways_pb2 as pb
from pathways_wire import session_frames as frames
from pathways_wire.driver_protocol import CLIENT_TOKEN_METADATA, PROGRAM_METADATA

pytestmark = pytest.mark.timeout(30)

TOKEN = "right-token"
Answerer = Callable[[socket.socket, list[pb.ControllerRequest]], bool]
"""Called with each request so far; False ends the connection."""


class Port:
    def __init__(self, answer: Answerer) -> None:
        self.hellos: list[pb.SessionHello] = []
        self._answer = answer
        self._port = frames.SessionPort("test calls", "127.0.0.1", "", None, admit=self._admit)
        self.port = self._port.port

    def _admit(self, hello: pb.SessionHello, peer: str) -> frames.Serve | None:
        self.hellos.append(hello)
        return self._serve if hello.token == TOKEN else None

    def _serve(self, conn: socket.socket, stream: BinaryIO, peer: str) -> None:
        frames.send_message(conn, frames.EVENT, pb.ControllerAnswer())
        seen: list[pb.ControllerRequest] = []
        request = pb.ControllerRequest()
        while frames.read_message(stream, frames.COMMAND, request):
            seen.append(request)
            if not self._answer(conn, seen):
                return
            request = pb.ControllerRequest()

    def close(self) -> None:
        self._port.close()


def serve(answer: Answerer) -> Iterator[Port]:
    port = Port(answer)
    try:
        yield port
    finally:
        port.close()


def reply(conn: socket.socket, request: pb.ControllerRequest, status: pb.CallStatus) -> None:
    frames.send_message(conn, frames.EVENT, pb.ControllerAnswer(id=request.id, body=status.SerializeToString()))


def test_answers_reach_their_own_requests_whatever_their_order() -> None:
    def answer_in_reverse(conn: socket.socket, seen: list[pb.ControllerRequest]) -> bool:
        if len(seen) == 2:
            for request in reversed(seen):
                asked = pb.CallStatusRequest.FromString(request.body)
                reply(conn, request, pb.CallStatus(call_id=asked.call_id, state=pb.CallStatus.SUCCEEDED))
        return True

    for port in serve(answer_in_reverse):
        link = CallsLink("127.0.0.1", port.port, TOKEN, "ns/prog")
        try:
            first = link.WaitCall.future(pb.CallStatusRequest(call_id="first"), timeout=10)
            second = link.WaitCall.future(pb.CallStatusRequest(call_id="second"), timeout=10)
            assert first.result(10).call_id == "first"
            assert second.result(10).call_id == "second"
            assert link.answered == 2
            assert port.hellos[0].program == "ns/prog"
        finally:
            link.close()


def test_an_error_answer_raises_the_status_it_names() -> None:
    def refuse(conn: socket.socket, seen: list[pb.ControllerRequest]) -> bool:
        frames.send_message(conn, frames.EVENT, pb.ControllerAnswer(
            id=seen[-1].id, code="PERMISSION_DENIED", details="Run: not yours"))
        return True

    for port in serve(refuse):
        link = CallsLink("127.0.0.1", port.port, TOKEN, "")
        try:
            with pytest.raises(CallsPortError) as refused:
                link.Run(pb.RunRequest(program_id="p"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert refused.value.details() == "Run: not yours"
            assert isinstance(refused.value, grpc.RpcError)
        finally:
            link.close()


def test_a_blocking_call_gives_up_at_its_deadline() -> None:
    for port in serve(lambda conn, seen: True):  # never answers
        link = CallsLink("127.0.0.1", port.port, TOKEN, "")
        try:
            start = time.monotonic()
            with pytest.raises(CallsPortError) as late:
                link.FinishCall(pb.ReleaseCall(call_id="c"), timeout=0.3)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - start < 5
        finally:
            link.close()


def test_a_future_fails_at_its_deadline() -> None:
    for port in serve(lambda conn, seen: True):
        link = CallsLink("127.0.0.1", port.port, TOKEN, "")
        try:
            waiting = link.WaitCall.future(pb.CallStatusRequest(call_id="c"), timeout=0.2)
            err = waiting.exception(timeout=10)
            assert isinstance(err, CallsPortError) and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            link.close()


def test_a_closed_connection_fails_what_is_outstanding_and_the_next_call_reconnects() -> None:
    closed = threading.Event()

    def close_on_first(conn: socket.socket, seen: list[pb.ControllerRequest]) -> bool:
        if closed.is_set():
            reply(conn, seen[-1], pb.CallStatus(call_id="again", state=pb.CallStatus.SUCCEEDED))
            return True
        closed.set()
        conn.shutdown(socket.SHUT_RDWR)
        return False

    for port in serve(close_on_first):
        link = CallsLink("127.0.0.1", port.port, TOKEN, "")
        try:
            waiting = link.WaitCall.future(pb.CallStatusRequest(call_id="c"), timeout=10)
            err = waiting.exception(timeout=10)
            assert isinstance(err, CallsPortError) and err.code() == grpc.StatusCode.UNAVAILABLE
            deadline = time.monotonic() + 10
            while True:  # the reader may not have seen the end yet: a call on the dead socket fails
                try:
                    assert link.WaitCall(pb.CallStatusRequest(call_id="again"), timeout=5).call_id == "again"
                    break
                except CallsPortError as failed:
                    assert failed.code() == grpc.StatusCode.UNAVAILABLE
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            assert len(port.hellos) == 2
        finally:
            link.close()


def test_a_wrong_token_is_closed_unanswered_and_the_call_fails_unavailable() -> None:
    for port in serve(lambda conn, seen: True):
        link = CallsLink("127.0.0.1", port.port, "wrong-token", "")
        try:
            with pytest.raises(CallsPortError) as refused:
                link.Run(pb.RunRequest(program_id="p"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "calls port" in refused.value.details()
        finally:
            link.close()


def test_a_closed_link_refuses_further_calls() -> None:
    for port in serve(lambda conn, seen: True):
        link = CallsLink("127.0.0.1", port.port, TOKEN, "")
        link.close()
        with pytest.raises(CallsPortError) as closed:
            link.Run(pb.RunRequest(program_id="p"), timeout=10)
        assert closed.value.code() == grpc.StatusCode.UNAVAILABLE


def test_credentials_are_read_from_the_grpc_metadata() -> None:
    assert credentials_of(((CLIENT_TOKEN_METADATA, "t"), (PROGRAM_METADATA, "ns/p"))) == ("t", "ns/p")
    assert credentials_of(()) == ("", "")


def test_only_waiting_requests_are_answered_off_the_reading_thread() -> None:
    assert calls_frames.waits("WaitCall", pb.CallStatusRequest())
    assert calls_frames.waits("Run", pb.RunRequest(wait=True))
    assert not calls_frames.waits("Run", pb.RunRequest())
    assert not calls_frames.waits("FinishCall", pb.ReleaseCall())


def test_the_port_names_what_it_carries_when_asked_for_another_method() -> None:
    assert calls_frames.refusal("Run") == ""
    why = calls_frames.refusal("CreateSlice")
    assert "'CreateSlice'" in why and "Run, WaitCall, FinishCall" in why and "gRPC" in why
