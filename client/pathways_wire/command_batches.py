"""Commands queued for one stream go as few messages, in order.

A call puts its launch and its grants on each host's link back to back, and
each went as a message of its own: the controller's link, the sidecar and the
worker each took one, handed it on and came back for the next, so the grants
reached the worker a hop behind the launch (about 0.17 ms on a 2-core machine,
of a one-computation call's 3 ms). Now a stream's sender takes every command
already queued when it comes for its next message, up to `MAX_COMMANDS` and
`MAX_BYTES`, and sends them as one batch (`HostCommand.batch`,
`WorkerCommand.batch`), which the receiver carries out in order. A command
larger than `MAX_BYTES` goes alone; nothing waits to fill a batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from google.protobuf.message import Message

MAX_COMMANDS = 64
MAX_BYTES = 1 << 20

M = TypeVar("M", bound=Message)


def batches(
    take: Callable[[], M | None],
    poll: Callable[[], M | None],
    wrap: Callable[[list[M]], M],
    max_commands: int = MAX_COMMANDS,
    max_bytes: int = MAX_BYTES,
) -> Iterator[M]:
    """The messages of a stream.

    `take` waits for the next command (None: the stream ends); `poll` returns one
    already queued, or None. A lone command is sent as it is, several as
    `wrap(commands)`. A command that would take a batch past `max_bytes` starts
    the next one."""
    held: M | None = None
    while True:
        first = held if held is not None else take()
        held = None
        if first is None:
            return
        batch, total = [first], first.ByteSize()
        while len(batch) < max_commands:
            more = poll()
            if more is None:
                break
            size = more.ByteSize()
            if total + size > max_bytes:
                held = more
                break
            batch.append(more)
            total += size
        yield batch[0] if len(batch) == 1 else wrap(batch)


def each_alone(commands: Iterable[M], carry_out: Callable[[M], None], log: logging.Logger, what: str) -> None:
    """Carries out a batch's commands in order, each as if it had come alone: one that
    fails is logged as `what` and its kind, and the rest still run."""
    for command in commands:
        try:
            carry_out(command)
        except Exception:
            log.exception("%s %s failed", what, command.WhichOneof("command"))
