"""Which operator leads: the decisions behind the operator's Lease.

Two operators serving one cluster would each place gangs on the same devices and
each drive the same hosts, so an operator that is told to (``--leader-election``)
acts only while it holds a Lease: it takes the Lease when nobody holds it or its
holder stopped renewing it, renews it while it leads, and stops acting when it
could not renew it for ``renew_deadline_s`` (which is shorter than the Lease's
duration, so it has stopped before another may take over).

As in client-go's leader election, expiry is judged on this process's clock, from
when it first saw the Lease's record unchanged, never from the timestamps another
machine wrote: clocks of two machines need not agree, their rates do. A holder
that stops cleanly gives the Lease back (an empty holder), so its successor takes
it at once. Pure: the caller reads the Lease and passes its clock in.
"""

from __future__ import annotations

import dataclasses
import enum


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says: its holder ("" when given back), when it was last renewed (as
    written, compared only for change), for how long it holds, and how often it changed hands."""

    holder: str
    renewed: str
    duration_s: float
    transitions: int


class Act(enum.Enum):
    CREATE = "create"
    """No Lease exists: make it, held by this operator."""
    TAKE = "take"
    """The Lease is free or lapsed: write this operator in as its holder."""
    RENEW = "renew"
    """This operator holds the Lease: renew it."""
    WAIT = "wait"
    """Another operator holds it: look again later."""


@dataclasses.dataclass(frozen=True)
class Step:
    act: Act
    holder: str = ""
    """Who holds the Lease while this operator waits."""
    transitions: int = 0
    """The Lease's count of changes of hands, once this step is carried out."""
    lapses_in_s: float = 0.0
    """While waiting: how long until the holder's Lease lapses if it is not renewed."""


class Leadership:
    """One operator's view of the Lease, the record it last saw and since when."""

    def __init__(self, identity: str) -> None:
        if not identity:
            raise ValueError("an operator's identity in its Lease must not be empty")
        self.identity = identity
        self._seen: LeaseRecord | None = None
        self._seen_since = 0.0

    def observe(self, record: LeaseRecord | None, now: float) -> Step:
        """What to do about the Lease read at ``now`` (None: there is none)."""
        if record is None:
            self._seen = None
            return Step(Act.CREATE, transitions=0)
        if record != self._seen:
            self._seen, self._seen_since = record, now
        if record.holder == self.identity:
            return Step(Act.RENEW, transitions=record.transitions)
        if not record.holder:
            return Step(Act.TAKE, transitions=record.transitions + 1)
        left = record.duration_s - (now - self._seen_since)
        if left < 0:
            return Step(Act.TAKE, transitions=record.transitions + 1)
        return Step(Act.WAIT, holder=record.holder, lapses_in_s=left)


def renewal_lost(last_renewed: float, now: float, renew_deadline_s: float) -> bool:
    """Whether a leader whose last successful renewal was at ``last_renewed`` must stop acting."""
    return now - last_renewed > renew_deadline_s
