"""The sidecar–worker session's frames (`pathways_wire.session_frames`) over a socket pair."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_wire import session_frames as frames
from pathways_wire.transfer import TransferError


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.settimeout(10.0)
    b.settimeout(10.0)
    with a, b:
        yield a, b


def test_commands_arrive_whole_and_in_order(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    sent = [pb.WorkerCommand(release=pb.ReleaseCall(call_id=f"call-{i}")) for i in range(3)]
    for command in sent:
        frames.send_message(a, frames.COMMAND, command)
    a.shutdown(socket.SHUT_WR)
    stream = frames.reader(b)
    got = []
    command = pb.WorkerCommand()
    while frames.read_message(stream, frames.COMMAND, command):
        got.append(command)
        command = pb.WorkerCommand()
    assert [c.release.call_id for c in got] == ["call-0", "call-1", "call-2"]


def test_a_frame_larger_than_one_write_arrives_whole(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    big = pb.WorkerCommand(arrival=pb.Arrival(call_id="c", data=b"x" * (frames.JOINED_BYTES * 8)))
    sender = threading.Thread(target=frames.send_message, args=(a, frames.COMMAND, big))
    sender.start()
    got = pb.WorkerCommand()
    assert frames.read_message(frames.reader(b), frames.COMMAND, got)
    sender.join(10)
    assert got.arrival.data == big.arrival.data


def test_a_frame_of_another_kind_is_refused_naming_the_kind(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    frames.send_message(a, frames.EVENT, pb.WorkerEvent(ready=True))
    with pytest.raises(TransferError, match="frame.kind"):
        frames.read_message(frames.reader(b), frames.COMMAND, pb.WorkerCommand())


def test_a_length_past_the_bound_is_refused_before_reading_it(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(frames.FRAME.pack(frames.COMMAND, frames.MAX_FRAME_BYTES + 1))
    with pytest.raises(TransferError, match="frame.length"):
        frames.read_message(frames.reader(b), frames.COMMAND, pb.WorkerCommand())


def test_garbage_in_a_frame_is_refused_as_not_a_message(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    body = b"\xff\xff\xff\xff not a protobuf"
    a.sendall(frames.FRAME.pack(frames.HELLO, len(body)) + body)
    with pytest.raises(TransferError, match="SessionHello"):
        frames.read_message(frames.reader(b), frames.HELLO, pb.SessionHello())


def test_a_connection_closed_inside_a_frame_is_an_error_not_an_end(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(frames.FRAME.pack(frames.COMMAND, 100) + b"short")
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(ConnectionError, match="95 bytes before the end"):
        frames.read_message(frames.reader(b), frames.COMMAND, pb.WorkerCommand())


def test_a_connection_closed_between_frames_is_the_end(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.shutdown(socket.SHUT_WR)
    assert frames.read_message(frames.reader(b), frames.COMMAND, pb.WorkerCommand()) is False
