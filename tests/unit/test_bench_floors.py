"""Reading a process's CPU from its /proc stat line."""

from __future__ import annotations

import os

from bench.floors import all_roles, per_step_note, stat_cpu_ticks

REST = "S 1 2 3 0 -1 4194560 500 0 0 0 {utime} {stime} 7 8 20 0 9 0 100 1000 50"


def test_stat_cpu_ticks_adds_user_and_system_time() -> None:
    assert stat_cpu_ticks("4242 (python) " + REST.format(utime=120, stime=35)) == 155


def test_stat_cpu_ticks_counts_fields_after_a_command_name_with_spaces_and_parentheses() -> None:
    line = "4242 (pw-io (a) b) " + REST.format(utime=7, stime=3)
    assert stat_cpu_ticks(line) == 10


def test_stat_cpu_ticks_reads_this_process() -> None:
    with open("/proc/self/stat") as stat:
        assert stat_cpu_ticks(stat.read()) >= 0


def test_all_roles_sums_each_repeat_over_every_role() -> None:
    assert all_roles({"worker": [10.0, 12.0], "sidecar": [2.0, 3.0]}) == [12.0, 15.0]


def test_a_per_step_note_states_the_steps_and_the_resolution_they_give() -> None:
    note = per_step_note(40)
    assert "over 40 steps per repeat" in note
    assert "resolution 0.25 ms/step" in note or os.sysconf("SC_CLK_TCK") != 100
