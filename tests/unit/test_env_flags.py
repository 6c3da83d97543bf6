"""Flags with environment defaults: the flag wins, else the variable, else the default, and
a variable that does not parse stops the process naming both it and the flag. A library's
numeric knobs (`env_number`) are refused the same way, naming the variable and the bound."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

import pytest

from pathways_wire.env_flags import env_number, env_option
from pathways_wire.slice_token import ENV_INSECURE
from pathways_worker.settings import parse_sidecar_args, parse_worker_args

WORKER = ["--listen", "127.0.0.1:0", "--host-name", "s/host-0"]
SIDECAR = ["--listen", "127.0.0.1:0", "--worker", "127.0.0.1:1", "--host-name", "s/host-0"]


def parser(env: dict[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="host")
    env_option(p, "--devices", variable="HOST_DEVICES", env=env, type=int, default=1)
    env_option(p, "--mode", variable="HOST_MODE", env=env, default="on", choices=("on", "off"))
    return p


def test_the_flag_wins_over_the_variable_which_wins_over_the_default() -> None:
    assert parser({}).parse_args([]).devices == 1
    assert parser({"HOST_DEVICES": "4"}).parse_args([]).devices == 4
    assert parser({"HOST_DEVICES": "4"}).parse_args(["--devices", "8"]).devices == 8
    assert parser({"HOST_DEVICES": "  "}).parse_args([]).devices == 1


def test_a_bad_variable_is_a_usage_error_naming_it_and_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parser({"HOST_DEVICES": "four"}).parse_args([])
    assert stop.value.code == 2
    assert (
        "argument --devices: HOST_DEVICES='four' is not valid (invalid int value): fix HOST_DEVICES or pass --devices"
        in capsys.readouterr().err
    )


def test_a_bad_variable_is_no_error_when_the_flag_is_given() -> None:
    assert parser({"HOST_DEVICES": "four"}).parse_args(["--devices", "2"]).devices == 2


def test_a_bad_flag_keeps_argparses_words(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser({}).parse_args(["--devices", "four"])
    assert "argument --devices: invalid int value: 'four'" in capsys.readouterr().err


def test_a_variable_outside_the_choices_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser({"HOST_MODE": "maybe"}).parse_args([])
    assert "HOST_MODE='maybe' is not valid (choose from 'on', 'off'): fix HOST_MODE or pass --mode" in (
        capsys.readouterr().err
    )


def test_a_worker_with_a_bad_host_index_variable_says_which(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parse_worker_args(WORKER, env={ENV_INSECURE: "1", "PATHWAYS_HOST_INDEX": "two"})
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "PATHWAYS_HOST_INDEX='two' is not valid (invalid int value)" in err
    assert "fix PATHWAYS_HOST_INDEX or pass --host-index" in err


def test_a_sidecar_refuses_a_data_channel_variable_that_is_neither_on_nor_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_sidecar_args(SIDECAR, env={ENV_INSECURE: "1", "PATHWAYS_SIDECAR_DATA_CHANNEL": "maybe"})
    assert "PATHWAYS_SIDECAR_DATA_CHANNEL='maybe' is not valid (choose from 'on', 'off')" in capsys.readouterr().err


def test_the_operator_with_a_bad_devices_per_host_variable_says_which(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathways_operator.__main__ import _parser

    monkeypatch.setenv("PATHWAYS_DEVICES_PER_HOST", "four")
    with pytest.raises(SystemExit) as stop:
        _parser().parse_args([])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "PATHWAYS_DEVICES_PER_HOST='four' is not valid (invalid int value)" in err
    assert "fix PATHWAYS_DEVICES_PER_HOST or pass --devices-per-host" in err


def test_the_operator_names_a_bad_metrics_port_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathways_operator.__main__ import _parser

    monkeypatch.setenv("PATHWAYS_METRICS_PORT", "ninety")
    with pytest.raises(SystemExit):
        _parser().parse_args([])
    err = capsys.readouterr().err
    assert "PATHWAYS_METRICS_PORT='ninety' is not valid (expected a port number, 0 (off) or any" in err
    assert "fix PATHWAYS_METRICS_PORT or pass --metrics-port" in err
    monkeypatch.setenv("PATHWAYS_METRICS_PORT", "any")
    assert _parser().parse_args([]).metrics_port == -1


def test_a_numeric_knob_is_its_default_when_unset_or_blank_and_its_value_when_set() -> None:
    assert env_number({}, "K", 32, minimum=1) == 32
    assert env_number({"K": "  "}, "K", 0.5) == 0.5
    assert env_number({"K": "7"}, "K", 32, minimum=1) == 7 and isinstance(env_number({"K": "7"}, "K", 1.0), float)


@pytest.mark.parametrize(
    ("text", "default", "bounds", "said"),
    [("abc", 32, {"minimum": 1}, "K='abc' is not a whole number; set it to one, or unset it for the default 32"),
     ("2.5", 32, {"minimum": 1}, "K='2.5' is not a whole number"),
     ("ten", 600.0, {"positive": True}, "K='ten' is not a number"),
     ("0", 32, {"minimum": 1}, "K='0' must be at least 1; unset it for the default 32"),
     ("0", 600.0, {"positive": True}, "K='0' must be above 0; unset it for the default 600.0"),
     ("-1", 0.0, {"minimum": 0.0}, "K='-1' must be at least 0.0"),
     ("nan", 600.0, {"positive": True}, "K='nan' is not a finite number"),
     ("inf", 600.0, {}, "K='inf' is not a finite number")],
)
def test_a_numeric_knob_out_of_its_bounds_is_refused_naming_variable_value_and_bound(
    text: str, default: float, bounds: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValueError) as err:
        env_number({"K": text}, "K", default, **bounds)
    assert said in str(err.value)


def test_importing_the_client_with_a_bad_knob_names_the_variable() -> None:
    done = subprocess.run([sys.executable, "-c", "import pathways"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATHWAYS_MAX_OUTSTANDING_CALLS": "many"})
    assert done.returncode != 0
    assert "PATHWAYS_MAX_OUTSTANDING_CALLS='many' is not a whole number" in done.stderr


@pytest.mark.parametrize(("variable", "flag"), [("PATHWAYS_WINDOW", "--window"),
                                                ("PATHWAYS_SHARED_WINDOW", "--shared-window")])
def test_the_embedded_controller_names_a_bad_window_variable(
    variable: str, flag: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathways_operator import local

    monkeypatch.setenv(variable, "0")
    with pytest.raises(SystemExit) as stop:
        local.main(["--state-dir", "/nonexistent-never-made"])
    assert stop.value.code == 2
    assert f"{variable}='0' is not valid ('0' is not a positive integer): fix {variable} or pass {flag}" in (
        capsys.readouterr().err
    )
