"""`Checkpointer`: what it refuses when asked, rather than failing a write in the background."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pathways as pw
from pathways.checkpoint import Checkpointer


@pytest.mark.parametrize(
    ("state", "leaf"),
    [({"w": np.ones(2, np.float32), "tags": ["run", "v1"]}, "state['tags'][0] is str of dtype '<U3'"),
     ({"w": np.ones(2, np.float32), "names": np.array(["a", "b"])}, "state['names'] is ndarray of dtype '<U1'")],
)
def test_a_state_orbax_cannot_write_is_refused_naming_its_leaf_and_the_last_snapshot_stays(
    tmp_path: Path, state: object, leaf: str
) -> None:
    checkpointer = Checkpointer(tmp_path)
    try:
        checkpointer.save(1, {"w": np.full(2, 7.0, np.float32), "lr": 0.5, "none": None})
        with pytest.raises(pw.InvalidProgramError) as refused:
            checkpointer.save(2, state)
        assert str(refused.value).startswith(f"snapshot {leaf}: a snapshot holds arrays of numbers")
        checkpointer.wait()
        restored = checkpointer.restore()
        assert restored is not None
        step, kept = restored
        assert step == 1 and kept["none"] is None and float(kept["lr"]) == 0.5
        np.testing.assert_array_equal(kept["w"], [7.0, 7.0])
    finally:
        checkpointer.close()


def test_a_closed_checkpointer_or_a_negative_step_is_refused_at_save(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path)
    with pytest.raises(ValueError, match="snapshot step -1: a step is a count of steps done"):
        checkpointer.save(-1, {"w": np.ones(2, np.float32)})
    checkpointer.close()
    checkpointer.close()  # a second close is harmless
    with pytest.raises(ValueError, match="is closed; make a new one to save"):
        checkpointer.save(1, {"w": np.ones(2, np.float32)})
    assert checkpointer.latest_step() is None


def test_restoring_a_step_with_no_snapshot_names_the_steps_there_are(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path)
    try:
        for step in (3, 6):
            checkpointer.save(step, {"w": np.full(2, float(step), np.float32)})
        checkpointer.wait()
        with pytest.raises(ValueError) as refused:
            checkpointer.restore(4)
        assert str(refused.value) == (
            f"{tmp_path} holds no committed snapshot of step 4; it holds 3, 6: restore one of those, "
            "or the latest (step=None)"
        )
        restored = checkpointer.restore(3)
        assert restored is not None and restored[0] == 3
        np.testing.assert_array_equal(restored[1]["w"], [3.0, 3.0])
    finally:
        checkpointer.close()
