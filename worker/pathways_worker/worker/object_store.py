"""The host's object store: every value of every live call, by call.

A slot is created as a *future* (pending) before its value exists — when a
consumer starts waiting, a fetch asks for it, or a value arrives — and settles
once, to ready (a jax.Array computed here, or host numpy that arrived) or to
failed (with the error that consumers and fetchers will see). Entries are
tagged with their call, so releasing a call frees everything it held.

Byte accounting is what back-pressure is built on: a computation reserves the
bytes of its outputs before it runs (`reserve`), so `used` never exceeds the
limit by more than what arrived from outside (arrivals are bounded by the
sidecar). The store itself is not thread-safe: the executor guards it with its
one lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from pathways_wire import pathways_pb2 as pb
from pathways_worker.value_ref import Ref

SlotState = Literal["pending", "ready", "failed"]


@dataclass
class Slot:
    state: SlotState = "pending"
    value: Any = None          # jax.Array or np.ndarray once ready
    error: str = ""
    nbytes: int = 0
    waiting_exports: list[pb.ExportRequest] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        return self.state != "pending"


class ObjectStore:
    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.used = 0
        self._calls: dict[str, dict[Ref, Slot]] = {}

    # ------------------------------------------------------------ slots

    def get(self, call_id: str, ref: Ref) -> Slot | None:
        return self._calls.get(call_id, {}).get(ref)

    def slot(self, call_id: str, ref: Ref) -> Slot:
        """The slot for a value, created pending (a future) if new."""
        slots = self._calls.setdefault(call_id, {})
        found = slots.get(ref)
        if found is None:
            found = slots[ref] = Slot()
        return found

    def set_ready(self, call_id: str, ref: Ref, value: Any, nbytes: int, prepaid: bool) -> Slot:
        """Settles a slot with its value; `prepaid` bytes were reserved already."""
        slot = self.slot(call_id, ref)
        self._forget_bytes(slot)
        slot.state, slot.value, slot.error, slot.nbytes = "ready", value, "", nbytes
        if not prepaid:
            self.used += nbytes
        return slot

    def set_failed(self, call_id: str, ref: Ref, error: str) -> Slot:
        slot = self.slot(call_id, ref)
        self._forget_bytes(slot)
        slot.state, slot.value, slot.error = "failed", None, error
        return slot

    def drop(self, call_id: str, ref: Ref) -> Slot | None:
        slot = self._calls.get(call_id, {}).pop(ref, None)
        if slot is not None:
            self._forget_bytes(slot)
        return slot

    def release_call(self, call_id: str) -> list[Slot]:
        slots = list(self._calls.pop(call_id, {}).values())
        for slot in slots:
            self._forget_bytes(slot)
        return slots

    def slots_of(self, call_id: str) -> dict[Ref, Slot]:
        return self._calls.get(call_id, {})

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
        """Calls holding bytes, largest first (for "store full" errors)."""
        held = [(c, sum(s.nbytes for s in slots.values())) for c, slots in self._calls.items()]
        return sorted((h for h in held if h[1]), key=lambda h: -h[1])

    def describe_full(self, need: int) -> str:
        holders = ", ".join(f"{c} ({b} B)" for c, b in self.holders()[:5]) or "none"
        return f"needs {need} B, {self.free} B free of limit {self.limit} B; held by calls: {holders}"


def host_nbytes(value: Any) -> int:
    """Bytes a value occupies on this host (all addressable shards)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    return int(sum(s.data.nbytes for s in value.addressable_shards))
