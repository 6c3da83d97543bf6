"""The host's object store: every value the host holds, by object id.

A slot is created as a *future* (pending) before its value exists — when a
call is launched (its computations' outputs), a consumer waits for it, a fetch
asks for it, or a value arrives — and settles to ready (a jax.Array computed
here, or host numpy that arrived) or to failed (with the error that consumers
and fetchers will see); `states` lists the moves.

A slot is keyed by its `ObjectId`, and its holder (today the call that made or
received it) is only an index over those ids: dropping one value after its
last use and releasing everything a holder has are the same operation, so
values that outlive a call need a new holder, not a new store.

Byte accounting is what back-pressure is built on: a computation reserves the
bytes of its outputs before it runs (`reserve`), so `used` never exceeds the
limit by more than what arrived from outside (arrivals are bounded by the
sidecar). Pure and not thread-safe: the host's state machine owns it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from pathways_wire import pathways_pb2 as pb
from pathways_worker.value_ref import Ref, ref_name
from pathways_worker.worker.states import SLOT_MOVES, InvalidTransition, SlotState


class ObjectId(NamedTuple):
    """One value on this host: which call holds it, and which value of the program it is."""

    call_id: str
    ref: Ref


def object_name(oid: ObjectId) -> str:
    return f"{ref_name(oid.ref)} of call {oid.call_id}"


@dataclass(slots=True)
class Slot:
    oid: ObjectId
    state: SlotState = "pending"
    value: object = None          # jax.Array or np.ndarray once ready
    error: str = ""
    nbytes: int = 0
    waiting_exports: tuple[pb.ExportRequest, ...] = ()   # fetches asked before it settled

    @property
    def settled(self) -> bool:
        return self.state != "pending"


class ObjectStore:
    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.used = 0
        self._slots: dict[ObjectId, Slot] = {}
        self._held: dict[str, set[ObjectId]] = {}

    # ------------------------------------------------------------ slots

    def get(self, oid: ObjectId) -> Slot | None:
        return self._slots.get(oid)

    def slot(self, oid: ObjectId) -> Slot:
        """The slot for a value, created pending (a future) if new."""
        found = self._slots.get(oid)
        if found is None:
            found = self._slots[oid] = Slot(oid)
            self._held.setdefault(oid.call_id, set()).add(oid)
        return found

    def add_futures(self, holder: str, refs: Iterable[Ref]) -> None:
        """Pending slots for the values `holder` is about to make (a launched call's
        outputs), those it has none for yet."""
        slots = self._slots
        held = self._held.setdefault(holder, set())
        for ref in refs:
            oid = ObjectId(holder, ref)
            if oid not in slots:
                slots[oid] = Slot(oid)
                held.add(oid)

    def set_ready(self, oid: ObjectId, value: object, nbytes: int, prepaid: bool) -> Slot:
        """Settles a slot with its value; `prepaid` bytes were reserved already."""
        slot = self.slot(oid)
        _move(slot, "ready")
        slot.value, slot.error, slot.nbytes = value, "", nbytes
        if not prepaid:
            self.used += nbytes
        return slot

    def set_failed(self, oid: ObjectId, error: str) -> Slot:
        slot = self.slot(oid)
        _move(slot, "failed")
        self._forget_bytes(slot)
        slot.value, slot.error = None, error
        return slot

    def drop(self, oid: ObjectId) -> Slot | None:
        slot = self._slots.pop(oid, None)
        if slot is not None:
            self._forget_bytes(slot)
            held = self._held.get(oid.call_id)
            if held is not None:
                held.discard(oid)
        return slot

    def release(self, holder: str, keep: frozenset[Ref] = frozenset()) -> list[Slot]:
        """Drops everything the holder has but the values in `keep` (objects its
        client still holds, dropped one by one later); the dropped slots, for
        their waiting fetches."""
        held = self._held.pop(holder, set())
        kept = {oid for oid in held if oid.ref in keep}
        if kept:
            self._held[holder] = kept
        slots = [self._slots.pop(oid) for oid in held - kept]
        for slot in slots:
            self._forget_bytes(slot)
        return slots

    def held_by(self, holder: str) -> list[Slot]:
        return [self._slots[oid] for oid in self._held.get(holder, ())]

    def _forget_bytes(self, slot: Slot) -> None:
        self.used -= slot.nbytes
        slot.nbytes = 0

    # ------------------------------------------------------------ space

    @property
    def free(self) -> int:
        return self.limit - self.used

    def reserve(self, nbytes: int) -> None:
        self.used += nbytes

    def unreserve(self, nbytes: int) -> None:
        self.used -= nbytes

    def holders(self) -> list[tuple[str, int]]:
        """Holders of bytes, largest first (for "store full" errors)."""
        held = [(h, sum(self._slots[oid].nbytes for oid in ids)) for h, ids in self._held.items()]
        return sorted((h for h in held if h[1]), key=lambda h: -h[1])

    def describe_full(self, need: int) -> str:
        holders = ", ".join(f"{c} ({b} B)" for c, b in self.holders()[:5]) or "none"
        return f"needs {need} B, {self.free} B free of limit {self.limit} B; held by calls: {holders}"


def _move(slot: Slot, new: SlotState) -> None:
    if new not in SLOT_MOVES[slot.state]:
        raise InvalidTransition(object_name(slot.oid), slot.state, new)
    slot.state = new
