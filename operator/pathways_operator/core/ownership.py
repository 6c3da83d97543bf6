"""Whose object is it: the only test the operator applies before it touches one.

The operator names the objects it makes after their VirtualSlice (Secret
``<slice>-pathways-token``, pods ``<slice>-<index>``, labelled
``pathways.dev/slice=<slice>``), but a name or a label proves nothing: a user
may have made a Secret of that name before the slice existed, or labelled an
unrelated pod. What proves ownership is the object's *controller*
ownerReference (``controller: true``) carrying the uid of this very
VirtualSlice. The operator deletes, patches, binds and adopts only such
objects, and refuses to use any other, naming it.

:func:`ownership` sorts an object into one of three answers:

``OWNED``
    controlled by this slice (this uid): the operator's own.
``EARLIER``
    controlled by an earlier VirtualSlice of the same name (another uid): left
    over from a slice that was deleted and applied again, going away with its
    owner through garbage collection; wait for it.
``FOREIGN``
    anything else (no controller, or another controller): not the operator's,
    never touched; the slice waits and says which object is in the way.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any


class Ownership(enum.Enum):
    """The three answers of :func:`ownership` (see the module docstring)."""

    OWNED = "owned"
    EARLIER = "earlier"
    """Controlled by a deleted object of the same kind and name: going away; wait for it."""
    FOREIGN = "foreign"


@dataclasses.dataclass(frozen=True)
class OwnerRef:
    """One ``metadata.ownerReferences`` entry, as much of it as ownership needs."""

    kind: str
    name: str
    uid: str
    controller: bool = False

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> OwnerRef:
        return cls(
            kind=str(raw.get("kind") or ""),
            name=str(raw.get("name") or ""),
            uid=str(raw.get("uid") or ""),
            controller=raw.get("controller") is True,
        )


def owner_refs(metadata: Mapping[str, Any]) -> tuple[OwnerRef, ...]:
    """The ownerReferences of an object's ``metadata``."""
    return tuple(OwnerRef.from_manifest(r) for r in metadata.get("ownerReferences") or [])


def controller_of(refs: Iterable[OwnerRef]) -> OwnerRef | None:
    """The controller reference (at most one is allowed by the API server), or None."""
    return next((r for r in refs if r.controller), None)


def ownership(refs: Iterable[OwnerRef], *, kind: str, name: str, uid: str) -> Ownership:
    """Whether an object with ``refs`` belongs to the ``kind`` object ``name`` of ``uid``."""
    controller = controller_of(refs)
    if controller is None or controller.kind != kind:
        return Ownership.FOREIGN
    if uid and controller.uid == uid:
        return Ownership.OWNED
    if controller.name == name:
        return Ownership.EARLIER
    return Ownership.FOREIGN


def describe_controller(refs: Iterable[OwnerRef]) -> str:
    """Who controls an object, for messages: "no controller" or "controlled by Kind name"."""
    controller = controller_of(refs)
    if controller is None:
        return "no controller"
    return f"controlled by {controller.kind} {controller.name}"
