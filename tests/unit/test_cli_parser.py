"""The ``pathways`` flags as argparse reads them, without running any command."""

from __future__ import annotations

import pytest

from pathways.cli import COMMANDS
from pathways.cli.parser import build_parser, usage_problem


def test_every_command_the_parser_knows_has_a_runner(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["no-such-command"])
    choices = capsys.readouterr().err.rpartition("(choose from ")[2].rstrip(")\n")
    assert {name.strip("' ") for name in choices.split(",")} == set(COMMANDS)


def test_connection_flags_work_before_or_after_the_command() -> None:
    before = build_parser().parse_args(["-n", "team", "--context", "c", "status"])
    after = build_parser().parse_args(["status", "-n", "team", "--context", "c"])
    assert (before.namespace, before.context) == (after.namespace, after.context) == ("team", "c")
    assert build_parser().parse_args(["status"]).namespace is None


def test_status_watch_flags_and_durations() -> None:
    args = build_parser().parse_args(["status", "-w", "--until-done", "--timeout", "1h30m", "--interval", "0.2"])
    assert (args.watch, args.until_done, args.timeout, args.interval) == (True, True, 5400.0, 0.2)
    assert usage_problem(args) is None


def test_until_done_without_watch_is_a_usage_problem() -> None:
    assert usage_problem(build_parser().parse_args(["status", "--until-done"])) == "--until-done needs -w (watch)"


def test_compile_namespace_is_only_for_the_manifest() -> None:
    assert build_parser().parse_args(["compile", "p.py", "-n", "team"]).namespace == "team"
    assert build_parser().parse_args(["compile", "p.py"]).namespace is None


@pytest.mark.parametrize(
    "argv", [["logs", "slice", "s", "-c", "worker", "--all-containers"], ["run", "p.py", "--steps", "0"]]
)
def test_conflicting_or_bad_values_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(argv)
    assert stop.value.code == 2


@pytest.mark.parametrize("command", ["describe", "logs"])
@pytest.mark.parametrize(
    ("given", "kind"),
    [("slice", "slice"), ("vslice", "slice"), ("VirtualSlices", "slice"), ("vs", "slice"),
     ("vslice.pathways.dev", "slice"), ("program", "program"), ("pwprog", "program"),
     ("pwp", "program"), ("pathwaysprogram", "program"), ("programs", "program")],
)
def test_a_kind_may_be_named_as_kubectl_names_its_resource(command: str, given: str, kind: str) -> None:
    assert build_parser().parse_args([command, given, "x"]).kind == kind


def test_an_unknown_kind_is_refused_listing_the_names_of_each(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["describe", "pod", "x"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "'pod' names no kind: use slice (or slices, virtualslice" in err
    assert "or program (or programs, pathwaysprogram, pathwaysprograms, pwprog, pwp)" in err
