"""Phases of VirtualSlices and PathwaysPrograms, and the only moves between them.

Every phase the operator can write into ``status.phase`` is declared here, once,
together with one transition table per kind. Reconcilers never assign a phase
directly: they ask :func:`check_transition`, so an illegal move (say a Failed
slice becoming Ready because a stale pod event arrived) fails loudly with the
object's name, the old and the new phase, instead of silently corrupting status.

A VirtualSlice lives like this::

    Pending ──admitted──▶ Launching ──all hosts up──▶ Ready
       ▲                     │  ▲                       │
       │                     │  └──── re-placed ────┐   │ host lost
       └── no room now ──────┴──────────────────── Recovering ◀┘
       └────────── preempted by a higher priority (Launching or Ready) ─────────
    (any live phase) ──▶ Suspended ──resume──▶ Pending
    (any live phase) ──▶ Failed  (restarts exhausted or invalid spec; terminal)

A PathwaysProgram::

    Pending ──slices ready──▶ Running ──last step──▶ Succeeded
       ▲                         │
       └──── a slice recovers ───┘          (any live phase) ──▶ Failed
    (Pending or Running) ──▶ Suspended ──resume──▶ Pending
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import TypeVar, overload


class SlicePhase(enum.StrEnum):
    """``VirtualSlice.status.phase``; the values are the strings written to the API."""

    PENDING = "Pending"
    """Waiting in the admission queue for room for the whole gang on one island."""
    LAUNCHING = "Launching"
    """Placed and bound; the gang's pods are starting."""
    READY = "Ready"
    """Every host is up and the slice's JAX job is formed."""
    RECOVERING = "Recovering"
    """A host was lost; the whole gang is being torn down to be recreated."""
    FAILED = "Failed"
    """Terminal: restarts exhausted or the spec can never be satisfied."""
    SUSPENDED = "Suspended"
    """``spec.suspend`` is true: no pods, no devices held."""


class ProgramPhase(enum.StrEnum):
    """``PathwaysProgram.status.phase``; the values are the strings written to the API."""

    PENDING = "Pending"
    """Waiting for its slices to become Ready."""
    RUNNING = "Running"
    """Steps are being dispatched to the slices' hosts."""
    SUCCEEDED = "Succeeded"
    """Terminal: every step completed and results are stored."""
    FAILED = "Failed"
    """Terminal: invalid spec, a failed slice, or a computation error."""
    SUSPENDED = "Suspended"
    """``spec.suspend`` is true: no computations are scheduled."""


_S = SlicePhase
_P = ProgramPhase

SLICE_TRANSITIONS: Mapping[SlicePhase, frozenset[SlicePhase]] = {
    _S.PENDING: frozenset({_S.LAUNCHING, _S.SUSPENDED, _S.FAILED}),
    # Back to Pending when binding lost a race for devices: release and requeue.
    _S.LAUNCHING: frozenset({_S.READY, _S.RECOVERING, _S.PENDING, _S.SUSPENDED, _S.FAILED}),
    # Back to Pending when preempted by a slice of higher priority: evicted and requeued.
    _S.READY: frozenset({_S.RECOVERING, _S.PENDING, _S.SUSPENDED, _S.FAILED}),
    # Recreating needs a new placement: straight to Launching when there is room,
    # back to the queue when there is not.
    _S.RECOVERING: frozenset({_S.LAUNCHING, _S.PENDING, _S.SUSPENDED, _S.FAILED}),
    _S.SUSPENDED: frozenset({_S.PENDING, _S.FAILED}),
    _S.FAILED: frozenset(),
}
"""Allowed ``old -> new`` moves of a VirtualSlice (staying in a phase is always allowed)."""

PROGRAM_TRANSITIONS: Mapping[ProgramPhase, frozenset[ProgramPhase]] = {
    _P.PENDING: frozenset({_P.RUNNING, _P.SUSPENDED, _P.FAILED}),
    # Back to Pending when a slice it runs on is recovering: it waits for it again.
    _P.RUNNING: frozenset({_P.SUCCEEDED, _P.FAILED, _P.PENDING, _P.SUSPENDED}),
    _P.SUSPENDED: frozenset({_P.PENDING, _P.FAILED}),
    _P.SUCCEEDED: frozenset(),
    _P.FAILED: frozenset(),
}
"""Allowed ``old -> new`` moves of a PathwaysProgram (staying in a phase is always allowed)."""

SLICE_KIND = "VirtualSlice"
PROGRAM_KIND = "PathwaysProgram"


class InvalidTransition(Exception):
    """A reconciler tried a phase change the tables above do not allow.

    Carries the object so that the log line alone says what went wrong.
    """

    def __init__(
        self, kind: str, name: str, old: str, new: str, allowed: Iterable[str] = ()
    ) -> None:
        self.kind = kind
        self.name = name
        self.old = old
        self.new = new
        allowed_text = ", ".join(sorted(allowed)) or "nothing (terminal)"
        super().__init__(
            f"{kind} {name!r} cannot move from phase {old} to {new}; "
            f"allowed from {old}: {allowed_text}"
        )


_Phase = TypeVar("_Phase", SlicePhase, ProgramPhase)


@overload
def check_transition(name: str, old: SlicePhase, new: SlicePhase) -> SlicePhase: ...
@overload
def check_transition(name: str, old: ProgramPhase, new: ProgramPhase) -> ProgramPhase: ...
def check_transition(name: str, old: _Phase, new: _Phase) -> _Phase:
    """Return ``new`` if ``old -> new`` is allowed for the object ``name``, else raise.

    The kind (VirtualSlice or PathwaysProgram) follows from the phase type, so a
    caller cannot check a slice against the program table by mistake. Staying in
    the same phase is always allowed: reconciles are repeated.
    """
    if isinstance(old, SlicePhase) and isinstance(new, SlicePhase):
        kind, allowed = SLICE_KIND, SLICE_TRANSITIONS[old]
    elif isinstance(old, ProgramPhase) and isinstance(new, ProgramPhase):
        kind, allowed = PROGRAM_KIND, PROGRAM_TRANSITIONS[old]
    else:
        raise TypeError(
            f"phases of {name!r} mix kinds: {type(old).__name__}.{old.name} "
            f"and {type(new).__name__}.{new.name}"
        )
    if new != old and new not in allowed:
        raise InvalidTransition(kind, name, str(old), str(new), (str(p) for p in allowed))
    return new


def is_terminal(phase: SlicePhase | ProgramPhase) -> bool:
    """True for phases nothing leaves (Failed, Succeeded): the object is done."""
    if isinstance(phase, SlicePhase):
        return not SLICE_TRANSITIONS[phase]
    return not PROGRAM_TRANSITIONS[phase]
