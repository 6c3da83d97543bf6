"""The calls port's answers never wait on a client: what the socket does not take at once
waits in the connection's backlog, written by a thread of its own, in order."""

from __future__ import annotations

import socket
import threading
import time

from pathways_wire import pathways_pb2 as pb
from pathways_wire import session_frames as frames
from pathways_operator.controller.calls_port import _Connection


def test_answers_to_a_client_that_stopped_reading_wait_in_order_and_never_block_the_answerer() -> None:
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    connection = _Connection(None, None, "token", "")  # type: ignore[arg-type]
    connection._conn = ours
    body = b"x" * 60_000
    count = 40  # about 2.4 MB: far beyond what the socket buffers hold
    start = time.monotonic()
    for i in range(count):
        connection._send(pb.ControllerAnswer(id=i + 1, body=body))
    assert time.monotonic() - start < 5.0, "answering returned without the client reading"
    assert connection._backlog, "the rest waits in the backlog"

    got: list[int] = []
    stream = frames.reader(theirs)
    reader = threading.Thread(target=lambda: got.extend(a.id for a in iter_answers(stream, count)))
    reader.start()
    reader.join(30.0)
    assert got == list(range(1, count + 1)), "every answer, in order"
    ours.close()
    theirs.close()


def iter_answers(stream: object, count: int) -> list[pb.ControllerAnswer]:
    out = []
    for _ in range(count):
        answer = pb.ControllerAnswer()
        assert frames.read_message(stream, frames.EVENT, answer)  # type: ignore[arg-type]
        out.append(answer)
    return out
