"""The order the sidecar's link to its worker writes commands in, on the session port.

The link's own thread finds no worker (nothing listens at its address); the test hands
it one end of a socket pair as its session port and reads the frames from the other.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_wire import session_frames as frames
from pathways_worker.sidecar.worker_link import WorkerLink


@pytest.fixture
def on_port() -> Iterator[tuple[WorkerLink, socket.socket]]:
    link = WorkerLink("127.0.0.1:1", lambda event: None)
    ours, theirs = socket.socketpair()
    theirs.settimeout(10.0)
    reader = threading.Thread(
        target=link._on_session_port, args=(ours, frames.reader(ours), pb.WorkerEvent(ready=True)), daemon=True
    )
    reader.start()
    # wait for the link to be open on the port, not for `ready`: the link's own thread,
    # finding no worker at its address, clears `ready` after each of its tries
    deadline = time.monotonic() + 10.0
    while link._sock is not ours and time.monotonic() < deadline:
        time.sleep(0.001)
    assert link._sock is ours
    yield link, theirs
    link.stop()
    theirs.close()
    reader.join(10.0)


def launch(call_id: str) -> pb.WorkerCommand:
    return pb.WorkerCommand(launch=pb.Launch(call_id=call_id))


def messages(sock: socket.socket, count: int) -> list[list[str]]:
    """The launches' call ids in each of the next `count` messages."""
    stream = frames.reader(sock)
    out = []
    for _ in range(count):
        message = pb.WorkerCommand()
        assert frames.read_message(stream, frames.COMMAND, message)
        commands = message.batch.commands if message.WhichOneof("command") == "batch" else [message]
        out.append([c.launch.call_id for c in commands])
    return out


def test_commands_sent_together_go_as_one_message_in_order_from_any_thread(
    on_port: tuple[WorkerLink, socket.socket],
) -> None:
    link, theirs = on_port
    link.send(launch("c0"))
    with link.together():
        link.send(launch("c1"))
        with link.together():  # nested: the outermost sends
            link.send(launch("c2"))
        other = threading.Thread(target=link.send, args=(launch("c3"),))
        other.start()
        other.join(10.0)
    with link.together():
        link.send(launch("c4"))  # alone: sent as itself, not a batch of one
    assert messages(theirs, 3) == [["c0"], ["c1", "c2", "c3"], ["c4"]]
