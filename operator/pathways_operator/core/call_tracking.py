"""Where each program call stands, and where each slice's gang stands, decided without I/O.

A call runs once every computation of its program has completed on every host of its slice.
The island scheduler grants a computation a sequence number on its slice; every host of the
gang then reports that grant once. :class:`CallProgress` counts those reports, fails the call
on the first failed one, and says which hosts still owe which grants, so that a call that
seems stuck can name its stragglers.

On a gang of several hosts, a host that dies mid-computation makes its peers' collectives
fail too, and their reports often arrive before the controller learns of the death. So a
failure reported by one host of a multi-host gang, while others still owe the grant, is
*held* for :data:`HOST_FAILURE_GRACE_S`: if the gang is lost meanwhile, the call fails
naming the host that died; otherwise (or once every host has reported) it fails with the
first host's error (:meth:`CallProgress.due`). The controller's threads only feed it host events and
send what it decides.

States are listed once (:data:`CallState`, :data:`GangState`), and so are the moves between
them; any other move raises :class:`InvalidTransition` naming the call or slice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Literal

from pathways_wire.wording import fraction

CallState = Literal["running", "succeeded", "failed"]
"""A call runs until every computation has completed (succeeded) or one failed (failed)."""

CALL_TRANSITIONS: Mapping[CallState, frozenset[CallState]] = {
    "running": frozenset({"succeeded", "failed"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
}

GangState = Literal["launching", "ready", "lost", "failed", "released"]
"""A slice's gang of hosts as the controller sees it.

``launching`` until every host's link is up; ``ready`` while calls may run on it (a gang the
operator registers again is ready again, with new links); ``lost`` after a host failed and
before the gang is back; ``failed`` when it could not be launched again; ``released`` once
its last client let it go.
"""

GANG_TRANSITIONS: Mapping[GangState, frozenset[GangState]] = {
    "launching": frozenset({"ready", "failed", "released"}),
    "ready": frozenset({"ready", "lost", "released"}),
    "lost": frozenset({"ready", "failed", "released"}),
    "failed": frozenset({"ready", "released"}),
    "released": frozenset(),
}

Grant = tuple[str, int]
"""A granted computation: (slice id, sequence number on that slice)."""


class InvalidTransition(Exception):
    """A move between states that the declared transitions do not allow."""

    def __init__(self, what: str, old: str, new: str) -> None:
        super().__init__(f"{what}: cannot move from {old!r} to {new!r}")
        self.what, self.old, self.new = what, old, new


def check_gang_move(slice_name: str, old: GangState, new: GangState) -> GangState:
    """``new`` if a gang may move there from ``old``; else :class:`InvalidTransition`."""
    if new not in GANG_TRANSITIONS[old]:
        raise InvalidTransition(f"slice '{slice_name}' gang", old, new)
    return new


HOST_FAILURE_GRACE_S = 2.0
"""How long one host's failure on a multi-host gang waits for news of a host that died."""


@dataclass(frozen=True)
class Report:
    """What one host's completion of a grant changed."""

    grant_done: bool
    """Every host of the gang has now reported the grant: the scheduler may move on."""
    failed_now: str = ""
    """Non-empty when this report failed the call: the message to tell the hosts."""


GRANT_DONE = Report(grant_done=True)


@dataclass
class CallProgress:
    """One call's completions, counted per grant and per host."""

    call_id: str
    program: str
    slices: frozenset[str]
    total: int
    state: CallState = "running"
    message: str = ""
    completed: int = 0
    waiting: dict[Grant, int] = field(default_factory=dict)
    """Outstanding grant -> hosts that have not reported it yet."""
    reported: dict[Grant, set[str]] = field(default_factory=dict)
    """Outstanding grant -> hosts that already reported it."""
    held: tuple[str, float] | None = None
    """A failure held back (its message, and when it fails the call): see the module docstring."""

    @property
    def running(self) -> bool:
        return self.state == "running"

    def _move(self, new: CallState) -> None:
        if new not in CALL_TRANSITIONS[self.state]:
            raise InvalidTransition(f"program '{self.program}' call {self.call_id}", self.state, new)
        self.state = new

    def granted(self, grant: Grant, hosts: int) -> None:
        """The scheduler granted a computation of this call to a gang of ``hosts`` hosts."""
        self.waiting[grant] = hosts

    def granted_run(self, slice_id: str, first_seq: int, count: int, hosts: int) -> None:
        """`granted` for ``count`` grants on ``slice_id`` numbered from ``first_seq``."""
        self.waiting.update(dict.fromkeys(zip(repeat(slice_id, count), range(first_seq, first_seq + count)), hosts))

    def report(
        self, grant: Grant, host: str, ok: bool, error: str, node: int, now: float = 0.0
    ) -> Report | None:
        """A host completed ``grant`` (at ``now``); None if the call was not waiting for it."""
        left = self.waiting.get(grant)
        if left is None:
            return None
        failed_now = ""
        if not ok and self.running and self.held is None:
            message = error or f"computation {node} failed on {host}"
            if left > 1:
                self.held = (message, now + HOST_FAILURE_GRACE_S)
            else:
                failed_now = message
                self.fail(message)
        if left > 1:
            self.reported.setdefault(grant, set()).add(host)  # the last host's would go at once
            self.waiting[grant] = left - 1
            return Report(grant_done=False, failed_now=failed_now)
        del self.waiting[grant]
        self.reported.pop(grant, None)
        if ok:
            self.completed += 1
        if self.running and self.held is not None:
            failed_now = self.held[0]  # every host has reported: no death is coming to explain it
            self.fail(failed_now)
        elif self.running and self.completed == self.total:
            self._move("succeeded")
        return Report(grant_done=True, failed_now=failed_now) if failed_now else GRANT_DONE

    def report_run(self, slice_id: str, first_seq: int, count: int, host: str) -> tuple[list[int], str]:
        """`report` of a success from ``host`` for each of ``count`` grants on ``slice_id``
        numbered from ``first_seq`` (a host's completion of a run): the seqs whose every
        host has now reported them, and the failure this ended the call with (held back
        until now; see the module docstring), or ""."""
        waiting, reported = self.waiting, self.reported
        done: list[int] = []
        failed_now = ""
        for seq in range(first_seq, first_seq + count):
            grant = (slice_id, seq)
            left = waiting.get(grant)
            if left is None:
                continue
            if left > 1:
                reported.setdefault(grant, set()).add(host)
                waiting[grant] = left - 1
                continue
            del waiting[grant]
            if reported:
                reported.pop(grant, None)
            done.append(seq)
            if self.held is not None and self.running:
                failed_now = self.held[0]
                self.fail(failed_now)
        self.completed += len(done)
        if done and self.running and self.completed == self.total:
            self._move("succeeded")
        return done, failed_now

    def due(self, now: float) -> str:
        """Fails the call with its held failure once the grace has passed; the message, or ""."""
        if self.held is None or not self.running or now < self.held[1]:
            return ""
        self.fail(self.held[0])
        return self.message

    def fail(self, message: str) -> None:
        self._move("failed")
        self.message = message

    def forget_slice(self, slice_id: str) -> None:
        """The slice's gang is gone: nothing more will be reported for its grants."""
        self.waiting = {k: v for k, v in self.waiting.items() if k[0] != slice_id}
        self.reported = {k: v for k, v in self.reported.items() if k[0] != slice_id}

    def stragglers(self, gang_hosts: Mapping[str, Iterable[tuple[str, str]]]) -> str:
        """For a call still running: which hosts owe which granted computations.

        ``gang_hosts`` maps each slice id to its current hosts, as (name, how to show it).
        """
        owed: dict[str, list[int]] = defaultdict(list)
        for slice_id, seq in sorted(self.waiting):
            done = self.reported.get((slice_id, seq), set())
            for host, shown in gang_hosts.get(slice_id, ()):
                if host not in done:
                    owed[shown].append(seq)
        progress = fraction(self.completed, self.total, "computation")
        if not owed:
            return (
                f"{progress} done; the rest are not granted yet "
                "(waiting for their inputs or behind other programs on the slice)"
            )
        hosts = "; ".join(f"host {h} has not completed grant(s) {seqs[:5]}" for h, seqs in sorted(owed.items()))
        return f"{progress} done; waiting on {hosts}"
