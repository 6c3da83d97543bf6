"""What ``pathways status -w`` knows: the objects its lists and watch events have shown it.

A watch starts from a list (every object, and the list's resourceVersion), then applies
events one at a time: ``ADDED`` and ``MODIFIED`` put the object, ``DELETED`` takes it
away, ``BOOKMARK`` only moves the version on. A list replaces everything known of its
kind, which is how a watch recovers when the server says its version is gone (410).
The tables are printed again only when the snapshot (each object's uid and
resourceVersion) differs from the one last printed.

Pure: no API, no threads, no clock; :mod:`pathways.cli.watch_streams` feeds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from pathways.kube_views import ProgramView
from pathways_wire.kube_names import PROGRAM_PLURAL, SLICE_PLURAL
Manifest = dict[str, Any]
Plural = Literal["virtualslices", "pathwaysprograms"]
EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
SLICES = cast(Plural, SLICE_PLURAL)
PROGRAMS = cast(Plural, PROGRAM_PLURAL)
WATCHED: tuple[Plural, ...] = (SLICES, PROGRAMS)
Snapshot = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Listed:
    """A full list of one kind: replaces what was known of it."""

    plural: Plural
    items: Sequence[Manifest]


@dataclass(frozen=True)
class Changed:
    """One watch event."""

    plural: Plural
    type: EventType
    object: Manifest


@dataclass(frozen=True)
class StreamFailed:
    """A kind can no longer be followed; ``message`` says why and what to do."""

    plural: Plural
    message: str


Update = Listed | Changed | StreamFailed


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def resume_version(current: str, event_type: str, obj: Mapping[str, Any]) -> str:
    """The resourceVersion to watch from after this event (bookmarks included)."""
    if event_type not in get_args(EventType):
        return current
    return str((obj.get("metadata") or {}).get("resourceVersion") or current)


@dataclass
class WatchedObjects:
    """The VirtualSlices and PathwaysPrograms a watch has seen, by kind, namespace and name."""

    kinds: tuple[Plural, ...] = WATCHED
    _objects: dict[Plural, dict[tuple[str, str], Manifest]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Every watched kind has been listed: there is a whole picture to print."""
        return all(plural in self._objects for plural in self.kinds)

    def apply(self, update: Listed | Changed) -> None:
        if isinstance(update, Listed):
            self._objects[update.plural] = {_key(o): dict(o) for o in update.items}
            return
        known = self._objects.setdefault(update.plural, {})
        if update.type in ("ADDED", "MODIFIED"):
            known[_key(update.object)] = dict(update.object)
        elif update.type == "DELETED":
            known.pop(_key(update.object), None)

    def objects(self, plural: Plural) -> list[Manifest]:
        """One kind, ordered by namespace and name as a list returns them."""
        known = self._objects.get(plural, {})
        return [known[key] for key in sorted(known)]

    def snapshot(self) -> Snapshot:
        """Each object's uid and resourceVersion: equal snapshots print the same tables."""
        return tuple(
            (str(o["metadata"].get("uid")), str(o["metadata"].get("resourceVersion")))
            for plural in self.kinds
            for o in self.objects(plural)
        )


@dataclass(frozen=True)
class Outcome:
    """How ``--until-done`` ends: every program done, and which of them Failed."""

    done: bool
    failed: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()


def until_done(programs: Sequence[ProgramView]) -> Outcome:
    """Done once there are programs and each has Succeeded or Failed."""
    pending = tuple(p.name for p in programs if not p.done)
    failed = tuple(p.name for p in programs if p.phase == "Failed")
    return Outcome(done=bool(programs) and not pending, failed=failed, pending=pending)
