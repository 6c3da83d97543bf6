"""The report one look at an object builds: its phase, its conditions, its Events, what to do.

Both state machines (``slice_machine``, ``program_machine``) decide by filling a
:class:`Report`: every phase change goes through
:func:`~pathways_operator.core.phases.check_transition` (an illegal move raises
``InvalidTransition`` naming the object, the old and the new phase), every
condition through :func:`~pathways_operator.core.reasons.set_condition` with the
time the look was taken (a value, not a clock), and Events and actions are
collected in the order they were decided. The reconciler writes the finished
report once and carries out the actions; nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Generic, Literal, TypeVar

from pathways_operator.core.phases import ProgramPhase, SlicePhase, check_transition
from pathways_operator.core.reasons import (
    Condition,
    ConditionStatus,
    Reason,
    find_condition,
    is_condition_true,
    set_condition,
)

EventType = Literal["Normal", "Warning"]


@dataclasses.dataclass(frozen=True)
class Event:
    """A core/v1 Event to post on the object: type, reason, message."""

    type: EventType
    reason: str
    message: str


_Phase = TypeVar("_Phase", SlicePhase, ProgramPhase)
_Action = TypeVar("_Action")


class Report(Generic[_Phase, _Action]):
    """The working copy of one look's decisions; the machines fill it, the reconciler reads it."""

    def __init__(
        self, name: str, generation: int, now: str, phase: _Phase, conditions: Iterable[Condition],
        delay: float,
    ) -> None:
        self.name = name
        """The object's ``namespace/name``: what an illegal transition names."""
        self.generation = generation
        self.now = now
        """When the look was taken (RFC 3339): the time a condition that changes gets."""
        self.phase: _Phase = phase
        self.conditions: list[Condition] = list(conditions)
        self.events: list[Event] = []
        self.actions: list[_Action] = []
        self.delay = delay
        """Seconds until the object wants its next look."""

    def move(self, phase: _Phase) -> None:
        """Go to ``phase``; raises InvalidTransition for a move the phase table does not allow."""
        self.phase = check_transition(self.name, self.phase, phase)

    def condition(self, type_: str, status: ConditionStatus, reason: Reason, message: str) -> None:
        self.conditions = set_condition(
            self.conditions, Condition(str(type_), status, str(reason), message, self.generation), self.now
        )

    def find(self, type_: str) -> Condition | None:
        return find_condition(self.conditions, type_)

    def is_true(self, type_: str) -> bool:
        return is_condition_true(self.conditions, type_)

    def event(self, type_: EventType, reason: Reason, message: str) -> None:
        self.events.append(Event(type_, str(reason), message))

    def act(self, *actions: _Action) -> None:
        self.actions.extend(actions)

    def take_actions(self) -> list[_Action]:
        """The actions decided since the last call, in order (the reconciler carries them out)."""
        taken, self.actions = self.actions, []
        return taken
