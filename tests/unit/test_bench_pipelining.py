"""Experiment 3's CPU rows: the floor a setup's CPU per step sets on this machine's cores."""

from __future__ import annotations

import os

import pytest

from bench import pipelining
from bench.measure import figure


def test_the_floor_is_the_tokens_of_a_step_over_its_cpu_spread_on_every_core() -> None:
    cores = os.cpu_count() or 1
    spmd = figure(pipelining.EXP, "SPMD", "tokens/s", [1000.0] * 5)
    cpu = {"worker": [80.0] * 5, "sidecar": [20.0] * 5}  # ms of CPU per step, 100 in all

    rows = pipelining._cpu_figures("pipeline", cpu, 512, spmd, {"worker": [30.0] * 5, "sidecar": [20.0] * 5})

    by_name = {row.name: row for row in rows}
    total = by_name["pipeline: CPU per step, all processes"]
    assert total.median == 100.0 and total.ratio == 2.0
    floor = next(row for row in rows if "floor" in row.name)
    assert floor.median == pytest.approx(512 / (0.1 / cores))
    assert floor.ratio == pytest.approx(floor.median / 1000.0)
    assert by_name["pipeline: CPU per step, workers"].median == 80.0
