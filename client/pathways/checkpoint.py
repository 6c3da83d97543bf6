"""Snapshots of a program's persistent state, written with orbax-checkpoint.

A program's *state* is whatever pytree its entrypoint holds between steps: usually
`pw.Array` handles, whose values stay on the hosts from one call to the next and
come to the client only when a snapshot is taken (all of them at once, `pw.fetch`).
:class:`Checkpointer` keeps snapshots of that pytree in a directory, one orbax
checkpoint per snapshot::

    <directory>/<step>/state      the pytree (orbax StandardSave: OCDBT + tensorstore)
    <directory>/<step>/meta       JSON: {"step": <step>, "time": ...}

``<step>`` is the number of steps completed when the snapshot was taken, i.e.
the step a resumed run starts from. Nothing here is specific to Pathways: any
orbax user can read a snapshot with ``ocp.CheckpointManager(directory)`` and
``ocp.args.Composite(state=ocp.args.StandardRestore())``.

Writes are asynchronous: :meth:`Checkpointer.save` copies the arrays to host
memory and returns, and orbax commits the files on a background thread (a
snapshot is visible only once committed, so a crash mid-write leaves the
previous one as the latest). The step loop waits only when a second snapshot
is asked for while the first is still being written, and at :meth:`close`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from pathways_wire.errors import InvalidProgramError
from pathways_wire.transfer import numeric_dtype

_KEEP = 2
"""Committed snapshots kept: the latest, and one before it in case the latest is cut short."""


class Checkpointer:
    """Asynchronous orbax snapshots of one program's state under ``directory``."""

    def __init__(self, directory: str | Path, *, keep: int = _KEEP) -> None:
        import orbax.checkpoint as ocp

        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._closed = False
        self._ocp = ocp
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, enable_async_checkpointing=True, create=True
            ),
        )

    def latest_step(self) -> int | None:
        """The step of the newest committed snapshot, or None when there is none."""
        step = self._manager.latest_step()
        return None if step is None else int(step)

    def restore(self, step: int | None = None) -> tuple[int, Any] | None:
        """``(step, state)`` of the newest snapshot (or of ``step``), or None when there is none.

        Arrays come back as numpy arrays; a snapshot taken without state gives ``None``. A
        ``step`` with no committed snapshot is refused, naming the steps there are.
        """
        ocp = self._ocp
        kept = sorted(int(s) for s in self._manager.all_steps())
        if step is None:
            if not kept:
                return None
            step = kept[-1]  # the newest, as `latest_step` says
        elif step not in kept:
            raise ValueError(
                f"{self.directory} holds no committed snapshot of step {step}; it holds "
                f"{', '.join(map(str, kept)) or 'none'}: restore one of those, or the latest (step=None)"
            )
        args: dict[str, Any] = {"meta": ocp.args.JsonRestore()}
        has_state = (self.directory / str(step) / "state").exists()
        if has_state:
            args["state"] = ocp.args.StandardRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**args))
        meta = restored["meta"] or {}
        state = _host_tree(restored["state"]) if has_state else None
        return int(meta.get("step", step)), state

    def save(self, step: int, state: Any) -> float:
        """Start writing ``state`` as the snapshot of ``step``; returns seconds the caller was held.

        Returns as soon as the arrays are copied off the caller's buffers; the
        files are committed in the background. A state orbax cannot write (a string leaf)
        is refused here, naming the leaf, rather than failing the write in the background.
        """
        if self._closed:
            raise ValueError(f"the Checkpointer of {self.directory} is closed; make a new one to save")
        if int(step) < 0:
            raise ValueError(f"snapshot step {step}: a step is a count of steps done, 0 or more")
        ocp = self._ocp
        start = time.perf_counter()
        args: dict[str, Any] = {"meta": ocp.args.JsonSave({"step": int(step), "time": time.time()})}
        if state is not None:
            args["state"] = ocp.args.StandardSave(_host_tree(_savable(state)))
        self._manager.save(int(step), args=ocp.args.Composite(**args), force=True)
        return time.perf_counter() - start

    def wait(self) -> None:
        """Block until every snapshot started so far is committed."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Commit what is in flight and stop orbax's background threads."""
        if self._closed:
            return
        self._closed = True
        self._manager.wait_until_finished()
        self._manager.close()


def _host_tree(state: Any) -> Any:
    """The pytree with every leaf a numpy array (orbax saves them as-is; scalars become 0-d):
    its `pw.Array` handles fetched side by side, not one after another."""
    import jax

    from pathways.array import fetch

    return jax.tree_util.tree_map(np.asarray, fetch(state))


def _savable(tree: Any) -> Any:
    """`tree` if orbax can write each of its leaves (arrays of numbers and booleans; a
    number, a boolean and None are such leaves), else an error naming the first that is not."""
    import jax

    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        dtype = np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype  # a handle's, unfetched
        if not numeric_dtype(dtype):
            raise InvalidProgramError(
                f"snapshot state{jax.tree_util.keystr(path)} is {type(leaf).__name__} of dtype "
                f"{dtype.str!r}: a snapshot holds arrays of numbers and booleans; keep this leaf "
                "out of the state, or hold it as numbers"
            )
    return tree
