"""Process identities and the removal of directories whose owners are gone."""

from __future__ import annotations

import os
from pathlib import Path

from pathways.embedded import STATE_PREFIX, remove_stale_state_dirs
from pathways_wire.process_tree import ProcessId, hold_dir, pid_alive, unowned


def test_this_process_is_alive_and_round_trips_as_text() -> None:
    me = ProcessId.current()
    assert me.alive() and pid_alive(os.getpid())
    assert ProcessId.from_text(me.to_text()) == me


def test_a_reused_pid_is_not_the_same_process() -> None:
    me = ProcessId.current()
    assert not ProcessId(me.pid, me.start + 1).alive()


def test_malformed_owner_text_is_no_identity() -> None:
    assert ProcessId.from_text("12") is None
    assert ProcessId.from_text("a b") is None


def _state_dir(root: Path, name: str, owner: ProcessId | None) -> Path:
    path = root / f"{STATE_PREFIX}{name}"
    path.mkdir()
    if owner is not None:
        (path / "owner").write_text(owner.to_text())
    return path


def test_only_state_dirs_of_gone_owners_are_removed(tmp_path: Path) -> None:
    me = ProcessId.current()
    gone = _state_dir(tmp_path, "gone", ProcessId(me.pid, me.start + 1))
    live = _state_dir(tmp_path, "live", me)
    unowned = _state_dir(tmp_path, "new", None)  # just made, owner not written yet
    other = tmp_path / "unrelated"
    other.mkdir()
    assert remove_stale_state_dirs(tmp_path) == [gone]
    assert not gone.exists() and live.exists() and unowned.exists() and other.exists()


def test_a_held_state_dir_is_kept_even_when_its_recorded_owner_looks_gone(tmp_path: Path) -> None:
    me = ProcessId.current()
    held = _state_dir(tmp_path, "held", ProcessId(me.pid, me.start + 1))
    fd = hold_dir(held)
    try:
        assert not unowned(held)
        assert remove_stale_state_dirs(tmp_path) == []
    finally:
        os.close(fd)
    assert unowned(held)
    assert remove_stale_state_dirs(tmp_path) == [held]


def test_host_shm_dirs_of_a_gone_controller_are_removed_unless_held(tmp_path: Path) -> None:
    from pathways_operator.local_hosts import remove_stale_shm_dirs

    gone_pid = 4_194_305  # above any pid_max: no such process
    stale = tmp_path / f"pathways-{gone_pid}-127.0.0.10"
    held = tmp_path / f"pathways-{gone_pid}-127.0.0.11"
    live = tmp_path / f"pathways-{os.getpid()}-127.0.0.12"
    by_hand = tmp_path / f"pathways-{gone_pid}"  # a host's default directory: not a launcher's
    for path in (stale, held, live, by_hand):
        path.mkdir()
    fd = hold_dir(held)
    try:
        assert remove_stale_shm_dirs(tmp_path) == [stale]
    finally:
        os.close(fd)
    assert held.exists() and live.exists() and by_hand.exists()
