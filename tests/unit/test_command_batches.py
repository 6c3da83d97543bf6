"""Commands queued for one stream go as few messages, in order (`command_batches`)."""

from __future__ import annotations

import logging
from collections import deque

import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_wire.command_batches import batches, each_alone


def grants(call_id: str) -> pb.HostCommand:
    return pb.HostCommand(grants=pb.GrantBatch(runs=[pb.GrantRun(call_id=call_id, first_seq=1, nodes=[0])]))


def launch(call_id: str, payload: int = 0) -> pb.HostCommand:
    inputs = [pb.InlineValue(data=b"x" * payload)] if payload else []
    return pb.HostCommand(launch=pb.Launch(call_id=call_id, inputs=inputs))


def wrap(commands: list[pb.HostCommand]) -> pb.HostCommand:
    return pb.HostCommand(batch=pb.HostCommands(commands=commands))


def sent(waves: list[list[pb.HostCommand]], **limits: int) -> list[pb.HostCommand]:
    """The messages a stream sends when each wave of commands is queued while its
    sender is away, the sender coming back for the next message once a wave is in."""
    pending: deque[pb.HostCommand] = deque()
    later = deque(waves)

    def take() -> pb.HostCommand | None:
        if not pending and later:
            pending.extend(later.popleft())
        return pending.popleft() if pending else None

    def poll() -> pb.HostCommand | None:
        return pending.popleft() if pending else None

    return list(batches(take, poll, wrap, **limits))


def kinds(message: pb.HostCommand) -> list[str]:
    if message.WhichOneof("command") == "batch":
        return [f"{c.WhichOneof('command')}:{c.launch.call_id or c.grants.runs[0].call_id}"
                for c in message.batch.commands]
    return [f"{message.WhichOneof('command')}:{message.launch.call_id or message.grants.runs[0].call_id}"]


def test_a_launch_and_its_grants_queued_together_go_as_one_message_in_order() -> None:
    messages = sent([[launch("c1"), grants("c1")]])

    assert [kinds(m) for m in messages] == [["launch:c1", "grants:c1"]]


def test_a_command_alone_goes_as_it_is_not_wrapped() -> None:
    (message,) = sent([[launch("c1")]])

    assert message == launch("c1")


def test_nothing_waits_to_fill_a_batch_each_wave_goes_when_the_sender_comes() -> None:
    messages = sent([[launch("c1"), grants("c1")], [launch("c2")]])

    assert [kinds(m) for m in messages] == [["launch:c1", "grants:c1"], ["launch:c2"]]


def test_a_batch_holds_at_most_max_commands() -> None:
    queued = [grants(f"c{i}") for i in range(5)]

    messages = sent([queued], max_commands=2)

    assert [kinds(m) for m in messages] == [
        ["grants:c0", "grants:c1"], ["grants:c2", "grants:c3"], ["grants:c4"],
    ]


def test_a_command_that_would_pass_max_bytes_starts_the_next_message_and_is_not_lost() -> None:
    big = launch("big", payload=3000)
    queued = [launch("c1"), big, launch("c2")]

    messages = sent([queued], max_bytes=2000)

    assert [kinds(m) for m in messages] == [["launch:c1"], ["launch:big"], ["launch:c2"]]
    assert messages[1] == big, "a command larger than max_bytes goes alone, whole"


def test_the_stream_ends_when_take_has_nothing_more() -> None:
    assert sent([]) == []


def test_each_command_of_a_batch_is_carried_out_alone_a_failing_one_logged_and_the_rest_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[str] = []

    def carry_out(command: pb.HostCommand) -> None:
        if command.launch.call_id == "bad":
            raise ValueError("no such program")
        done.append(command.launch.call_id)

    with caplog.at_level(logging.ERROR):
        each_alone([launch("c1"), launch("bad"), launch("c2")], carry_out, logging.getLogger("t"), "command")

    assert done == ["c1", "c2"]
    assert [r.getMessage() for r in caplog.records] == ["command launch failed"]
