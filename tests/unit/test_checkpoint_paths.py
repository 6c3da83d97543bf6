"""A program's checkpoint directory is always one claim directory of its own namespace."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from pathways_operator.core.checkpoint_paths import CheckpointPathError, checkpoint_path, newest_snapshot

ROOT = PurePosixPath("/var/lib/pathways/checkpoints")
UID = "0123456789abcdef"


def test_claim_name_gives_the_programs_directory_in_that_claim() -> None:
    assert checkpoint_path(ROOT, "team-a", "training-ckpt", "lm", UID) == ROOT / "team-a/training-ckpt/lm-01234567"
    assert checkpoint_path(ROOT, "team-a", "ckpt.v2", "lm", UID) == ROOT / "team-a/ckpt.v2/lm-01234567"


def test_relative_root_is_kept_relative() -> None:
    assert checkpoint_path(PurePosixPath("state/checkpoints"), "ns", "c", "p", UID) == PurePosixPath(
        "state/checkpoints/ns/c/p-01234567"
    )


@pytest.mark.parametrize(
    "volume",
    ["../../../../tmp/x", "/tmp/abs", "../other-namespace-claim", "..", ".", "", "a/b", "a/../b", "c/"],
)
def test_volume_that_is_a_path_is_refused_naming_the_field(volume: str) -> None:
    with pytest.raises(CheckpointPathError) as refused:
        checkpoint_path(ROOT, "team-a", volume, "lm", UID)
    message = str(refused.value)
    assert message.startswith(f"spec.checkpoint.volume {volume!r} is not the name of a PersistentVolumeClaim")
    assert f"{ROOT}/team-a/" in message and "give the name of a claim in namespace team-a" in message


def test_the_newest_snapshot_is_the_highest_committed_step() -> None:
    assert newest_snapshot(["2", "4", "6.orbax-checkpoint-tmp-1700000000", "meta.json"]) == 4
    assert newest_snapshot(["10", "8"]) == 10
    assert newest_snapshot(["2.orbax-checkpoint-tmp-1"]) is None
    assert newest_snapshot([]) is None
