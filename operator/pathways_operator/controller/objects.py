"""The controller's object table: where each value a client keeps lives, and whose it is.

An object is an output of a call that the client still holds a handle to:
`(call_id, value)`. It is entered when the call starts (its place is known
from the plan, so a later call can consume it before it exists), kept past
the call's end only if the client's `FinishCall` keeps it, and removed when
the client drops it or loses its lease. Its gang and generation say where
it lives: an object whose gang was relaunched is lost, and a call that uses
it fails saying so. Pure bookkeeping under the controller's lock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from pathways_wire import pathways_pb2 as pb
from pathways_operator.controller.errors import ControllerError

ObjectKey = tuple[str, int, int]
"""(call_id, node, index)."""


def object_key(ref: pb.ObjectRef) -> ObjectKey:
    return (ref.call_id, ref.value.node, ref.value.index)


def object_label(key: ObjectKey) -> str:
    return f"object (computation {key[1]}, output {key[2]}) of call {key[0]}"


@dataclass
class ObjectRecord:
    client: str
    slice_id: str
    slice_name: str
    generation: int
    lost: str = ""
    """Why the object is gone with its gang ("" while it lives)."""


class ObjectTable:
    def __init__(self) -> None:
        self._objects: dict[ObjectKey, ObjectRecord] = {}
        self._by_call: dict[str, set[ObjectKey]] = defaultdict(set)

    def __len__(self) -> int:
        return len(self._objects)

    def add(self, key: ObjectKey, record: ObjectRecord) -> None:
        self._objects[key] = record
        self._by_call[key[0]].add(key)

    def resolve(self, ref: pb.ObjectRef, client: str, use: str) -> tuple[ObjectKey, ObjectRecord]:
        """The object a call's input names, or why it cannot be used (`use` says where it is used)."""
        key = object_key(ref)
        record = self._objects.get(key)
        if record is None:
            raise ControllerError(
                "NOT_FOUND",
                f"{use}: {object_label(key)} is not known: it was dropped, or its call ended "
                "without keeping it; keep a handle to it while later calls use it",
            )
        if record.client and client != record.client:
            raise ControllerError(
                "PERMISSION_DENIED", f"{use}: {object_label(key)} belongs to another client"
            )
        if record.lost:
            raise ControllerError(
                "NOT_FOUND", f"{use}: {object_label(key)} on slice '{record.slice_name}' was lost: {record.lost}"
            )
        return key, record

    def finish(self, call_id: str, keep: Iterable[tuple[int, int]]) -> None:
        """The call ended: only the outputs its client keeps stay objects."""
        kept = {(call_id, node, index) for node, index in keep}
        for key in self._by_call.pop(call_id, set()):
            if key in kept:
                self._by_call[call_id].add(key)
            else:
                self._objects.pop(key, None)

    def drop(self, keys: Iterable[ObjectKey], client: str) -> dict[str, list[ObjectKey]]:
        """Removes the client's objects among `keys`; those that still live, by slice id."""
        by_slice: dict[str, list[ObjectKey]] = defaultdict(list)
        for key in keys:
            record = self._objects.get(key)
            if record is None or (record.client and client and record.client != client):
                continue
            del self._objects[key]
            calls = self._by_call.get(key[0])
            if calls is not None:
                calls.discard(key)
                if not calls:
                    del self._by_call[key[0]]
            if not record.lost:
                by_slice[record.slice_id].append(key)
        return by_slice

    def owned_by(self, client: str) -> list[ObjectKey]:
        return [key for key, record in self._objects.items() if record.client == client]

    def lose_slice(self, slice_id: str, why: str) -> None:
        """The slice's gang is gone, and with it every object it held."""
        for record in self._objects.values():
            if record.slice_id == slice_id and not record.lost:
                record.lost = why


def object_ref(key: ObjectKey) -> pb.ObjectRef:
    return pb.ObjectRef(call_id=key[0], value=pb.ValueRef(node=key[1], index=key[2]))
