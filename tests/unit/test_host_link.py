"""The order a host's control stream sends commands in, held ones included.

The link is never started: the test takes its messages as its sender thread would.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_wire import session_frames as frames
from pathways_operator.controller import host_link
from pathways_operator.controller.host_link import HostLink


@pytest.fixture
def l() -> Iterator[HostLink]:
    made = HostLink("127.0.0.1:1", "host-0", "slice-0", lambda *_: None, lambda *_: None)
    yield made
    made.close()


def release(call_id: str) -> pb.HostCommand:
    return pb.HostCommand(release=pb.ReleaseCall(call_id=call_id))


def launch(call_id: str) -> pb.HostCommand:
    return pb.HostCommand(launch=pb.Launch(call_id=call_id))


def sent(message: pb.HostCommand) -> list[str]:
    """The commands of one message, as kind:call."""
    commands = list(message.batch.commands) if message.WhichOneof("command") == "batch" else [message]
    out = []
    for c in commands:
        kind = str(c.WhichOneof("command"))
        call_id = "" if kind == "grants" else getattr(c, kind).call_id
        out.append(f"{kind}:{call_id}")
    return out


def test_a_held_release_rides_at_the_end_of_the_next_message(l: HostLink) -> None:
    stream = l._commands()
    l.send(release("c1"), later=True)
    l.send(launch("c2"))
    l.send(pb.HostCommand(grants=pb.GrantBatch(runs=[pb.GrantRun(call_id="c2", first_seq=1, nodes=[0])])))
    message = next(stream)
    assert sent(message) == ["launch:c2", "grants:", "release:c1"]


def test_a_held_release_goes_alone_once_its_wait_is_up(l: HostLink) -> None:
    stream = l._commands()
    start = time.monotonic()
    l.send(release("c1"), later=True)
    l.send(release("c2"), later=True)
    message = next(stream)
    assert sent(message) == ["release:c1", "release:c2"], "held commands keep their order"
    assert time.monotonic() - start >= host_link.LATER_S


def test_control_frames_are_on_unless_switched_off_and_a_bad_value_is_named() -> None:
    from pathways_operator.controller.host_link import control_frames_wanted

    assert control_frames_wanted({})
    assert control_frames_wanted({"PATHWAYS_CONTROL_FRAMES": " On "})
    assert not control_frames_wanted({"PATHWAYS_CONTROL_FRAMES": "off"})
    with pytest.raises(ValueError, match="PATHWAYS_CONTROL_FRAMES='yes' is neither on nor off"):
        control_frames_wanted({"PATHWAYS_CONTROL_FRAMES": "yes"})


def _frames_from(sock: socket.socket, count: int) -> list[list[str]]:
    stream = frames.reader(sock)
    out = []
    for _ in range(count):
        message = pb.HostCommand()
        assert frames.read_message(stream, frames.COMMAND, message)
        out.append(sent(message))
    return out


def moved_to(l: HostLink, sock: socket.socket) -> threading.Thread:
    """Starts the link's sender on `sock`, as the move to the control port does; once
    what was queued went, `send` writes there itself."""
    sender = threading.Thread(target=l._send_frames, args=(sock,), daemon=True)
    sender.start()
    deadline = time.monotonic() + 10.0
    while l._direct is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert l._direct is sock
    return sender


def test_on_the_control_port_what_was_queued_goes_first_then_send_writes_itself(l: HostLink) -> None:
    ours, theirs = socket.socketpair()
    theirs.settimeout(10.0)
    with ours, theirs:
        l.send(launch("c1"))  # before the move: queued
        l.send(release("c0"), later=True)
        sender = moved_to(l, ours)
        l.send(release("c1"), later=True)
        l.send(launch("c2"))  # written by this thread, the held release after it
        assert _frames_from(theirs, 2) == [["launch:c1", "release:c0"], ["launch:c2", "release:c1"]]
        l.send(release("c2"), later=True)  # nothing follows: the sender writes it once its wait is up
        assert _frames_from(theirs, 1) == [["release:c2"]]
        l.close()
        sender.join(10.0)
        assert not sender.is_alive()


class _CountedWakes(queue.Queue[pb.HostCommand | None]):
    """The link's queue, counting the wake-ups `send` gives its sender."""

    def __init__(self) -> None:
        super().__init__()
        self.wakes = 0

    def put(self, item: pb.HostCommand | None, block: bool = True, timeout: float | None = None) -> None:
        if item is host_link._WAKE:
            self.wakes += 1
        super().put(item, block, timeout)


def test_a_command_held_while_the_sender_waits_out_an_earlier_hold_wakes_nobody(l: HostLink) -> None:
    counted = _CountedWakes()
    l._queue = counted  # type: ignore[assignment]
    ours, theirs = socket.socketpair()
    theirs.settimeout(10.0)
    with ours, theirs:
        sender = moved_to(l, ours)
        l.send(release("c1"), later=True)  # wakes the sender, which starts its wait
        deadline = time.monotonic() + 10.0
        while not l._sender_timed and time.monotonic() < deadline:
            time.sleep(0.001)
        assert l._sender_timed
        l.send(launch("c2"))  # written at once, the held release after it
        l.send(release("c2"), later=True)  # the sender wakes for c1's wait anyway, and waits out c2's
        assert _frames_from(theirs, 2) == [["launch:c2", "release:c1"], ["release:c2"]]
        assert counted.wakes == 1
        l.close()
        sender.join(10.0)
        assert not sender.is_alive()


def test_what_is_sent_together_goes_as_one_message_in_order_from_any_thread(l: HostLink) -> None:
    ours, theirs = socket.socketpair()
    theirs.settimeout(10.0)
    with ours, theirs:
        sender = moved_to(l, ours)
        l.send(release("c0"), later=True)
        with l.together():
            l.send(launch("c1"))
            with l.together():  # nested: the outermost sends
                l.send(pb.HostCommand(grants=pb.GrantBatch(runs=[pb.GrantRun(call_id="c1", first_seq=1, nodes=[0])])))
            other = threading.Thread(target=l.send, args=(launch("c2"),))
            other.start()
            other.join(10.0)
        l.send(launch("c3"))
        assert _frames_from(theirs, 2) == [["launch:c1", "grants:", "launch:c2", "release:c0"], ["launch:c3"]]
        l.close()
        sender.join(10.0)


def test_what_is_sent_together_before_the_move_is_queued_in_order(l: HostLink) -> None:
    stream = l._commands()
    with host_link.links_together([l]):
        l.send(launch("c1"))
        l.send(launch("c2"))
    l.send(launch("c3"))
    assert sent(next(stream)) == ["launch:c1", "launch:c2", "launch:c3"]
