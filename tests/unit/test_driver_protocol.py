"""The driver's progress file, read the same way by the driver and the operator."""

from __future__ import annotations

from pathlib import Path

from pathways_wire.driver_protocol import (
    EXIT_RETRYABLE,
    PROGRESS_FILE,
    RunStart,
    driver_log_config_map,
    run_starts,
    steps_completed,
)


def test_no_progress_file_means_no_step_done(tmp_path: Path) -> None:
    assert steps_completed(tmp_path / PROGRESS_FILE) == 0


def test_steps_completed_is_one_past_the_highest_step_and_skips_a_line_cut_short(tmp_path: Path) -> None:
    progress = tmp_path / PROGRESS_FILE
    progress.write_text('{"step": 0}\n{"step": 2, "loss": 1.5}\n{"step": 1}\n{"step": 3, "lo', encoding="utf-8")
    assert steps_completed(progress) == 3


def test_records_without_an_integer_step_count_for_nothing(tmp_path: Path) -> None:
    progress = tmp_path / PROGRESS_FILE
    progress.write_text('[1, 2]\n{"step": "4"}\n{"step": true}\n{"step": -3}\n', encoding="utf-8")
    assert steps_completed(progress) == 0


def test_retryable_status_is_ex_tempfail_and_the_log_config_map_is_named_for_the_program() -> None:
    assert EXIT_RETRYABLE == 75
    assert driver_log_config_map("train") == "train-driver-log"


def test_run_starts_are_read_back_from_a_log_in_order() -> None:
    log = "\n".join([
        "--- starting at step 0: -m pathways.driver",
        RunStart(0, None).line,
        "some output of the program",
        RunStart(6, 6).line,
        "pathways.driver: starting at step 9 (something else)",
    ])
    assert RunStart(6, 6).line == "pathways.driver: starting at step 6 (restored the snapshot of step 6)"
    assert RunStart(4, None).line == "pathways.driver: starting at step 4 (no snapshot restored)"
    assert run_starts(log) == [RunStart(0, None), RunStart(6, 6)]
