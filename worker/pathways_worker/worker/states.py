"""The states of a host's grants and values, each listed once with the moves allowed.

A grant (one computation of one call, in the order the island scheduler gave
it) is `queued` behind earlier grants, `waiting` at the head of the run order
while its inputs or the store room for its outputs are missing, `running`
while the executor thread hands it to JAX, and ends `dispatched` (the finisher
takes it over) or `failed` (it could not run, or JAX refused it).

A slot (one value in the object store) is `pending`, a future, until it
settles `ready` or `failed`. A ready value can still fail (its computation
failed after dispatch), and a failed one can fail again with a more specific
error. Anything else is a bug, and says so with `InvalidTransition`.
"""

from __future__ import annotations

from typing import Literal

GrantState = Literal["queued", "waiting", "running", "dispatched", "failed"]
GRANT_MOVES: dict[GrantState, frozenset[GrantState]] = {
    "queued": frozenset({"waiting", "running", "failed"}),
    "waiting": frozenset({"running", "failed"}),
    "running": frozenset({"dispatched", "failed"}),
    "dispatched": frozenset(),
    "failed": frozenset(),
}

SlotState = Literal["pending", "ready", "failed"]
SLOT_MOVES: dict[SlotState, frozenset[SlotState]] = {
    "pending": frozenset({"ready", "failed"}),
    "ready": frozenset({"failed"}),
    "failed": frozenset({"failed"}),
}


class InvalidTransition(Exception):
    """A grant or a value was asked to move in a way its state does not allow."""

    def __init__(self, what: str, old: str, new: str) -> None:
        super().__init__(f"{what} cannot move from '{old}' to '{new}'")
        self.what, self.old, self.new = what, old, new
