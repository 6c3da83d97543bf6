"""A VirtualSlice's phase, derived from what the operator observes, never read back.

``status`` is the operator's report, but anyone allowed to write the status
subresource can write anything into it: ``phase: Failed`` on a Ready slice,
``restarts: 99``, hosts on other Nodes. A reconciler that starts from the
phase it reads back acts on whatever was written (a forged ``Failed`` once
deleted a healthy gang's pods). So the slice reconciler starts every look from
:func:`observed_phase`, computed from facts it can check, and writes the phase
it ends on; a forged status is simply overwritten at the next look.

What each fact comes from:

======================  ==============================================================
placement               the pods' placement annotation, or the operator's own
                        admission ledger (in memory; lost on restart, which is safe:
                        before a gang's first pod exists it holds no devices)
pods of the gang        the pods the slice controls, of its current generation
registered              the controller in the operator's own process has the gang
draining                pods of the slice from an earlier gang still terminating
preempted               the operator evicted the gang itself (in memory)
restarts, failure       the *slice record*: annotations the operator writes on the
                        VirtualSlice (``pathways.dev/restarts``, ``pathways.dev/failure``),
                        as a Deployment keeps its revision; nothing observable is left
                        of them once a gang's pods are gone. Checked against what is
                        observed: while a gang's pods run, they say which generation
                        it is (:func:`current_generation`). A recorded failure is
                        final, as phase Failed is (raising maxRestarts revives nothing)
suspended               ``spec.suspend``
======================  ==============================================================

``status`` is read back only to keep the report continuous: a condition keeps
its ``lastTransitionTime`` while its status holds, and an Event is posted when
a condition changes. A forged status can at most cause or suppress one Event.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from pathways_operator.core.phases import SlicePhase


@dataclasses.dataclass(frozen=True)
class SliceRecord:
    """What the operator must remember about a slice that no object shows any more."""

    restarts: int = 0
    """Gangs recreated so far: the generation of the next pods (counts against maxRestarts)."""
    failure: str = ""
    """Why the slice failed for good (restarts exhausted), or "" while it may run."""


def parse_record(restarts: str | None, failure: str | None) -> SliceRecord:
    """The record from its annotation values; anything unreadable counts as absent."""
    text = (restarts or "").strip()
    count = int(text) if text.isdigit() else 0
    return SliceRecord(restarts=count, failure=(failure or "").strip())


def current_generation(recorded: int, pods: Iterable[tuple[int, bool]]) -> int:
    """The slice's generation, from its pods' ``(generation, deleting)`` and the recorded restarts.

    A gang whose pods run (not being deleted) is the current one, whatever is
    recorded; with none running, the record counts, but never below a pod that
    still exists (its generation was used already).
    """
    listed = list(pods)
    running = [g for g, deleting in listed if not deleting]
    if running:
        return max(running)
    return max([recorded, *(g for g, _ in listed)])


@dataclasses.dataclass(frozen=True)
class SliceObservation:
    """The facts one look at a slice gathered; see the module docstring for their sources."""

    failure: str = ""
    suspended: bool = False
    placed: bool = False
    """An admitted placement exists for the slice's current generation."""
    hosts: int = 0
    """Hosts in that placement."""
    pods: int = 0
    """Pods of the current gang that exist (a lost one makes the gang Recovering next)."""
    registered: bool = False
    """The controller has this generation of the gang: it was whole and serving, programs use it."""
    draining: bool = False
    """Pods of an earlier gang of the slice still exist."""
    preempted: bool = False
    """The operator evicted this generation of the gang for a slice of higher priority."""


def observed_phase(o: SliceObservation) -> SlicePhase:
    """The phase a slice is in, given what is observed; the reconcile starts from it.

    Failed only on the operator's own record; Ready only while a placed gang is
    whole and known to the controller (registered once every host served);
    Launching for any other placed gang; Recovering while an earlier gang drains (unless it was evicted, which
    puts the slice back in the queue: Pending); Suspended for a suspended slice
    holding nothing; Pending otherwise.
    """
    if o.failure:
        return SlicePhase.FAILED
    if o.placed:
        whole = o.hosts > 0 and o.pods >= o.hosts
        return SlicePhase.READY if whole and o.registered else SlicePhase.LAUNCHING
    if o.draining and not o.preempted:
        return SlicePhase.RECOVERING
    if o.suspended and not o.draining:
        return SlicePhase.SUSPENDED
    return SlicePhase.PENDING
