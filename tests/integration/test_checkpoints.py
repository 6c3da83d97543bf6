"""Suspend and resume on the local runtime: the same result as an uninterrupted run.

``pw.launch`` runs ``examples.programs:train_regression`` on the embedded cluster; a
suspend mid-training snapshots the weights with orbax, releases the slice, and a
resume continues from the snapshot. The snapshots are plain orbax checkpoints.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import pathways as pw
from pathways.runs import RunState

pytestmark = pytest.mark.timeout(300)

ENTRYPOINT = "examples.programs:train_regression"
ARGS = {"features": 8, "batch_per_device": 8, "learning_rate": 0.05, "seed": 3}
STEPS = 24


def _wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_suspend_and_resume_give_the_uninterrupted_result(runtime: pw.Runtime, tmp_path: Path) -> None:
    straight = pw.launch(ENTRYPOINT, args=ARGS, steps=STEPS, slices={"main": 8}, name="straight")
    expected = straight.result(timeout=180)

    run = pw.launch(
        ENTRYPOINT, args={**ARGS, "step_seconds": 0.05}, steps=STEPS, slices={"main": 8},
        checkpoint_dir=tmp_path / "ckpt", every_steps=5, name="interrupted",
    )
    ctx = run.contexts[0]
    _wait_for(lambda: ctx.checkpoint_stats.snapshots >= 1, 120, "the first periodic snapshot")
    assert run.suspend(timeout=60) is RunState.SUSPENDED
    stopped_at = run.steps_completed
    assert 5 <= stopped_at < STEPS, stopped_at
    assert ctx.checkpoint_stats.steps[-1] == stopped_at, "a suspend snapshots the step it stopped at"

    run.resume()
    assert run.contexts[1].start_step == stopped_at
    got = run.result(timeout=180)
    assert run.state is RunState.SUCCEEDED
    np.testing.assert_array_equal(np.asarray(got["weights"]), np.asarray(expected["weights"]))
    np.testing.assert_array_equal(np.asarray(got["losses"]), np.asarray(expected["losses"]))
    assert len(np.asarray(got["losses"])) == STEPS


def test_orbax_reads_a_snapshot_directly(runtime: pw.Runtime, tmp_path: Path) -> None:
    import orbax.checkpoint as ocp

    run = pw.launch(
        ENTRYPOINT, args=ARGS, steps=6, slices={"main": 4}, checkpoint_dir=tmp_path / "ckpt",
        every_steps=3, name="readable",
    )
    result = run.result(timeout=180)
    manager = ocp.CheckpointManager(tmp_path / "ckpt")
    assert manager.latest_step() == 6
    restored = manager.restore(
        6, args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
    )
    np.testing.assert_array_equal(np.asarray(restored["state"]["w"]), np.asarray(result["weights"]))
    assert restored["meta"]["step"] == 6
    assert len(restored["state"]["losses"]) == 6
    manager.close()


def test_only_the_newest_two_snapshots_are_kept(runtime: pw.Runtime, tmp_path: Path) -> None:
    run = pw.launch(
        ENTRYPOINT, args=ARGS, steps=9, slices={"main": 4}, checkpoint_dir=tmp_path / "ckpt",
        every_steps=2, name="retained",
    )
    run.result(timeout=180)
    assert run.contexts[0].checkpoint_stats.steps == [2, 4, 6, 8], "every 2 steps a snapshot was written"
    on_disk = sorted(int(p.name) for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit())
    assert on_disk == [6, 8]
