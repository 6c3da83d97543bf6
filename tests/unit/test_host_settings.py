"""Host flags and their slice token: a host without one refuses, unless told to run unchecked;
and what a host sets in its own environment before it starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pathways_wire.slice_token import ENV_INSECURE, ENV_TOKEN, ENV_TOKEN_FILE, INSECURE_FLAG, MissingToken
from pathways_worker.settings import parse_sidecar_args, parse_worker_args
from pathways_worker.slice_auth import SliceTokenInterceptor

WORKER = ["--listen", "127.0.0.1:0", "--host-name", "s/host-0"]
SIDECAR = ["--listen", "127.0.0.1:0", "--worker", "127.0.0.1:1", "--host-name", "s/host-0"]


def test_a_worker_without_a_token_is_refused_naming_the_host() -> None:
    with pytest.raises(MissingToken, match="host s/host-0: refusing to start without a slice token"):
        parse_worker_args(WORKER, env={})


def test_an_empty_token_variable_counts_as_none() -> None:
    with pytest.raises(MissingToken, match="host s/host-0"):
        parse_sidecar_args(SIDECAR, env={ENV_TOKEN: "  "})


@pytest.mark.parametrize("env", [{}, {ENV_INSECURE: "1"}], ids=["flag", "env"])
def test_insecure_no_token_runs_unchecked_only_when_asked(env: dict[str, str]) -> None:
    flags = [INSECURE_FLAG] if not env else []
    worker = parse_worker_args([*WORKER, *flags], env=env)
    sidecar = parse_sidecar_args([*SIDECAR, *flags], env=env)
    assert worker.insecure_no_token and sidecar.insecure_no_token
    assert worker.slice_token == sidecar.slice_token == sidecar.data_token == ""


def test_a_token_given_is_checked_even_with_insecure_no_token() -> None:
    settings = parse_sidecar_args([*SIDECAR, INSECURE_FLAG], env={ENV_TOKEN: "t0k"})
    assert (settings.slice_token, settings.data_token, settings.insecure_no_token) == ("t0k", "t0k", False)


def test_an_empty_token_file_is_refused_even_with_insecure_no_token(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("")
    with pytest.raises(MissingToken, match=f"host s/host-0: refusing to start: the slice token file {empty}"):
        parse_worker_args([*WORKER, INSECURE_FLAG], env={ENV_TOKEN_FILE: str(empty)})


def test_the_token_file_is_read(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("from-secret\n")
    assert parse_worker_args([*WORKER, "--slice-token-file", str(token)], env={}).slice_token == "from-secret"


def test_an_interceptor_without_a_token_is_refused() -> None:
    with pytest.raises(ValueError, match="host s/host-0: refusing to serve without a slice token"):
        SliceTokenInterceptor("", "s/host-0")
    SliceTokenInterceptor("", "s/host-0", insecure=True)


def test_hosts_keep_openblas_to_one_thread_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pathways_worker.lifecycle import single_threaded_blas

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    single_threaded_blas()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    single_threaded_blas()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "4"


def test_only_hosts_after_zero_may_start_without_a_coordinator() -> None:
    env = {ENV_TOKEN: "t0k"}
    later = parse_worker_args([*WORKER, "--num-hosts", "2", "--host-index", "1"], env=env)
    assert later.coordinator == "", "its sidecar is told the address (pathways_worker.coordinator_file)"
    with pytest.raises(SystemExit, match="--coordinator '' is not HOST:PORT"):
        parse_worker_args([*WORKER, "--num-hosts", "2", "--host-index", "0"], env=env)
    with pytest.raises(SystemExit, match="--coordinator 'nowhere' is not HOST:PORT"):
        parse_worker_args([*WORKER, "--num-hosts", "2", "--host-index", "1", "--coordinator", "nowhere"], env=env)


def test_a_pods_bare_ipv6_addresses_are_read_and_written_in_brackets() -> None:
    """A pod's ``$(POD_IP):PORT`` leaves an IPv6 address bare; gRPC and JAX want brackets."""
    env = {ENV_TOKEN: "t0k"}
    worker = parse_worker_args(
        ["--listen", "fd00::5:8477", "--num-hosts", "2", "--host-index", "0", "--coordinator", "fd00::5:8476"],
        env=env,
    )
    assert (worker.listen, worker.coordinator) == ("[fd00::5]:8477", "[fd00::5]:8476")
    sidecar = parse_sidecar_args(["--listen", "[fd00::5]:8478", "--worker", "fd00::5:8477"], env=env)
    assert (sidecar.listen, sidecar.worker) == ("[fd00::5]:8478", "[fd00::5]:8477")
    ipv4 = parse_worker_args(["--listen", "10.0.0.7:8477"], env=env)
    assert ipv4.listen == "10.0.0.7:8477"


@pytest.mark.parametrize("flag", ["--listen", "--worker"])
def test_a_sidecar_address_without_a_port_is_refused_naming_its_flag(flag: str) -> None:
    argv = {"--listen": "127.0.0.1:0", "--worker": "127.0.0.1:1", flag: "[fd00::5]"}
    with pytest.raises(SystemExit, match=rf"{flag} '\[fd00::5\]' is not HOST:PORT"):
        parse_sidecar_args([a for kv in argv.items() for a in kv], env={ENV_TOKEN: "t0k"})
