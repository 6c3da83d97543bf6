"""Benchmark verdicts: when a figure is judged, and what its row says."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from bench.measure import Figure, best_of, figure
from bench.report import markdown, read_run
from bench.transfers import NO_COST, judged_move
from bench.verdicts import MIN_REPEATS, SHARE_TOLERANCE, rules_text, share_error, share_met, spread_text, verdict

STEADY = [1.0, 1.1, 1.05, 0.98, 1.02]


def judged(samples: list[float], *, met: bool = True, baseline: list[float] | None = None,
           exact: bool = False, limit: float | None = None, limit_each: bool = True) -> Figure:
    return figure("x", "f", "GB/s", samples, baseline="b", target="≥ 1", met=met,
                  baseline_samples=STEADY if baseline is None else baseline,
                  baseline_exact=exact, limit=limit, limit_each=limit_each)


def test_best_of_takes_the_fastest_of_its_samples_and_runs_each() -> None:
    runs = iter([3.0, 1.5, 9.0, 2.0, 2.5, 4.0])
    taken: list[float] = []

    def sample() -> float:
        taken.append(next(runs))
        return taken[-1]

    least = best_of(sample, 3)
    assert [least(), least()] == [1.5, 2.0]
    assert taken == [3.0, 1.5, 9.0, 2.0, 2.5, 4.0]


def test_met_and_missed_need_five_repeats_and_a_steady_baseline() -> None:
    assert verdict(judged([2.0] * MIN_REPEATS)) == "met"
    assert verdict(judged([0.5] * MIN_REPEATS, met=False)) == "missed"


def test_too_few_repeats_is_not_judged() -> None:
    assert verdict(judged([2.0, 2.1, 1.9])) == "noisy, not judged (n 3 < 5)"


def test_too_few_baseline_repeats_is_not_judged() -> None:
    assert verdict(judged([2.0] * 5, baseline=[1.0, 1.0])) == "noisy, not judged (baseline n 2 < 5)"


def test_a_wide_baseline_spread_is_not_judged() -> None:
    wide = [1.0, 1.2, 3.0, 1.1, 1.0]
    assert verdict(judged([2.0] * 5, baseline=wide)) == "noisy, not judged (baseline max/min 3.00 > 1.5)"


def test_a_baseline_spread_at_the_bound_is_judged() -> None:
    assert verdict(judged([2.0] * 5, baseline=[1.0, 1.5, 1.2, 1.1, 1.0])) == "met"


def test_an_exact_baseline_needs_no_repeats_of_its_own() -> None:
    assert verdict(judged([0.27] * 5, baseline=[], exact=True)) == "met"


def test_a_count_against_a_given_number_is_judged_from_one_count() -> None:
    bytes_moved = Figure("x", "bytes through the client", "KiB/step", 40.0, 40.0, 40.0, 1,
                         baseline="the batch", target="only the batch", met=True,
                         counted=True, baseline_exact=True)
    assert verdict(bytes_moved) == "met"


def test_a_measured_baseline_without_recorded_repeats_is_not_judged() -> None:
    old = Figure("x", "f", "GB/s", 2.0, 1.9, 2.1, 5, baseline="raw TCP", target="≥ 0.5×", met=True)
    assert verdict(old) == "noisy, not judged (baseline n 0 < 5)"


def test_a_repeat_above_the_limit_voids_a_figure_judged_by_each_repeat() -> None:
    f = judged([0.95, 0.97, 1.01, 0.96, 0.98], limit=1.0)
    assert verdict(f) == "invalid: 1.01 > 1, so the baseline is wrong"


def test_utilization_whose_median_is_above_one_is_invalid_never_met() -> None:
    f = judged([1.02, 0.99, 1.01, 1.03, 0.98], limit=1.0, limit_each=False)
    assert verdict(f) == "invalid: 1.01 > 1, so the baseline is wrong"


def test_utilization_whose_windows_scatter_about_one_is_judged_by_its_median() -> None:
    f = judged([0.95, 0.97, 1.01, 0.96, 0.98], limit=1.0, limit_each=False)
    assert verdict(f) == "met"


def test_utilization_at_one_is_judged() -> None:
    assert verdict(judged([0.95, 0.97, 1.0, 0.96, 0.98], limit=1.0)) == "met"


def test_a_move_whose_cost_was_lost_in_the_noise_is_invalid_never_met() -> None:
    rates = [2.5, 2.6, NO_COST, 2.4, NO_COST]  # two repeats: moved no slower than stayed
    f = judged_move(judged(rates))

    assert f.median == 2.6 and f.met, "the median alone would say met"
    assert verdict(f) == (
        f"invalid: inf > {f.limit:g}, a repeat's moved call was no slower than its stayed call: "
        "the move's cost was lost in the noise"
    )
    assert verdict(judged_move(judged([2.5, 2.6, 2.7, 2.4, 2.5]))) == "met"


def test_a_figure_without_target_has_no_verdict() -> None:
    assert verdict(figure("x", "f", "s", [1.0] * 5)) == ""


def test_shares_are_judged_relative_to_each_weight_share() -> None:
    assert share_met(0.072, 1 / 15)  # 8% over a weight-1 share of 0.067
    assert not share_met(0.0969, 1 / 15)  # 1.45x its share: absolutely only 0.03 off
    assert not share_met(0.47, 8 / 15)  # 12% under a weight-8 share of 0.533
    assert round(share_error(0.48, 8 / 15), 3) == 0.1


def test_one_measurement_is_never_printed_as_a_spread() -> None:
    one = figure("x", "utilization", "fraction", [0.6])
    assert spread_text(one) == ""
    assert spread_text(figure("x", "f", "s", [1.0, 2.0])) == "1–2"


def test_rows_state_n_and_verdict() -> None:
    rows = [judged([2.0, 2.1, 1.9]), figure("x", "one", "s", [0.6])]
    table = markdown(rows, {"date": "2026-11-24T08:00:00", "cores": "2"}, "quick", "run")
    assert "| x | f | 2 | GB/s | 1.9–2.1 | 3 | b | ≥ 1 | noisy, not judged (n 3 < 5) |" in table
    assert "| x | one | 0.6 | s |  | 1 |  |  |  |" in table


def test_a_failed_experiments_many_lined_error_is_one_row_of_the_table() -> None:
    failed = Figure("9 driver pods", "failed", "", float("nan"), float("nan"), float("nan"), 0,
                    note="AssertionError: the operator exited with 2 while starting:\n\nusage: a | b\nerror: x")
    table = markdown([failed], {"date": "2026-11-24T08:00:00", "cores": "2"}, "quick", "run")
    row = table.splitlines()[-1]
    assert row == ("| 9 driver pods | failed | AssertionError: the operator exited with 2 while starting: … "
                   "(the whole text is in the run's JSON) |  |  | 0 |  |  |  |")
    one_line = dataclasses.replace(failed, note="TimeoutError: a | b")
    table = markdown([one_line], {"date": "2026-11-24T08:00:00", "cores": "2"}, "quick", "run")
    assert table.splitlines()[-1] == "| 9 driver pods | failed | TimeoutError: a \\| b |  |  | 0 |  |  |  |"


def test_a_recorded_run_reads_back_as_the_figures_written(tmp_path: Path) -> None:
    f = judged([2.0] * 5, limit=1.0)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"mode": "quick", "machine": {"date": "d"},
                                "figures": [dataclasses.asdict(f)]}))
    mode, info, figures = read_run(path)
    assert (mode, info, figures) == ("quick", {"date": "d"}, [f])


def test_the_rules_results_md_states_name_the_constants_values() -> None:
    text = rules_text()
    assert "{" not in text and "}" not in text, text
    assert f"within {SHARE_TOLERANCE:.0%} of each weight's share" in text
    assert f"at least {MIN_REPEATS} repeats" in text
