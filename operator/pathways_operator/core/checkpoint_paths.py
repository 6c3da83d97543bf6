"""Where a program's checkpoints live, and why a claim name can never move them.

Claims named by ``spec.checkpoint.volume`` are mounted under the operator's
checkpoint root, one directory per namespace: a program's snapshots go to
``<root>/<namespace>/<volume>/<program>-<uid8>``. ``volume`` comes from the user, so
the joined path is normalised and must still be exactly one claim directory below
``<root>/<namespace>/``: a name like ``../other-namespace-claim``, ``/tmp/x`` or
``a/b`` would otherwise write (and, on clean-up, delete) files of another namespace
or outside the root. The CRD accepts only claim names; this check also covers
objects stored before it did. Lexical only (no file system access), hence pure.

A restarted driver continues from the newest snapshot in that directory: orbax names
each committed snapshot by its step (``6/``) and one still being written by its step and
a temporary suffix, so `newest_snapshot` reads the step from the names alone.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from pathlib import PurePosixPath


class CheckpointPathError(ValueError):
    """``spec.checkpoint.volume`` does not name one claim directory of the namespace."""


def newest_snapshot(names: Iterable[str]) -> int | None:
    """The step of the newest committed snapshot among a checkpoint directory's entries, or None."""
    steps = [int(name) for name in names if name.isdigit()]
    return max(steps) if steps else None


def checkpoint_path(root: PurePosixPath, namespace: str, volume: str, program: str, uid: str) -> PurePosixPath:
    """``<root>/<namespace>/<volume>/<program>-<uid8>``, or raise naming ``spec.checkpoint.volume``."""
    base = PurePosixPath(posixpath.normpath(root / namespace))
    path = PurePosixPath(posixpath.normpath(base / volume / f"{program}-{uid[:8]}"))
    if path.parent.parent != base or path.parent.name != volume:
        raise CheckpointPathError(
            f"spec.checkpoint.volume {volume!r} is not the name of a PersistentVolumeClaim: "
            f"checkpoints would go to {path}, which is not a claim's directory under "
            f"{base}/ (namespace {namespace}); give the name of a claim in namespace {namespace}, "
            "lowercase letters, digits, '-' and '.', with no '/'"
        )
    return path
