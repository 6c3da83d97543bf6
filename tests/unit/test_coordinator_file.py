"""The coordinator address a sidecar hands its worker: written whole and once, read back, waited for."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pathways_worker import coordinator_file
from pathways_worker.coordinator_file import CoordinatorConflict


def test_an_address_written_is_what_the_worker_reads(tmp_path: Path) -> None:
    assert coordinator_file.read(str(tmp_path)) is None
    assert coordinator_file.write(str(tmp_path), "10.0.0.1:8476") is True
    assert coordinator_file.read(str(tmp_path)) == "10.0.0.1:8476"
    assert os.listdir(tmp_path) == [coordinator_file.FILE_NAME], "no partial file is left behind"


def test_the_same_address_again_changes_nothing_and_another_is_refused(tmp_path: Path) -> None:
    coordinator_file.write(str(tmp_path), "10.0.0.1:8476")
    assert coordinator_file.write(str(tmp_path), "10.0.0.1:8476") is False
    with pytest.raises(CoordinatorConflict, match="already given coordinator 10.0.0.1:8476, not 10.0.0.9:8476"):
        coordinator_file.write(str(tmp_path), "10.0.0.9:8476")
    assert coordinator_file.read(str(tmp_path)) == "10.0.0.1:8476"


@pytest.mark.parametrize("rounds", [50])
def test_writers_at_once_write_the_address_once_and_refuse_another(tmp_path: Path, rounds: int) -> None:
    """The operator tells a sidecar twice at once (its background teller and its look), and
    the sidecar's gRPC threads write in parallel: one write takes, the same address again is
    a no-op, another address is refused, and no writer fails or leaves a partial file."""
    for round_ in range(rounds):
        shm = tmp_path / str(round_)
        addresses = ["10.0.0.1:8476"] * 6 + ["10.0.0.9:8476"] * 2
        results: list[object] = [None] * len(addresses)
        start = threading.Barrier(len(addresses))

        def write(i: int) -> None:
            start.wait(5)
            try:
                results[i] = coordinator_file.write(str(shm), addresses[i])
            except CoordinatorConflict as err:
                results[i] = err
            except Exception as err:  # noqa: BLE001 - what the test looks for
                results[i] = f"failed: {type(err).__name__}: {err}"

        threads = [threading.Thread(target=write, args=(i,)) for i in range(len(addresses))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        written = coordinator_file.read(str(shm))
        assert [r for r in results if isinstance(r, str)] == [], results
        assert results.count(True) == 1, results
        for address, result in zip(addresses, results):
            if result is not True:
                assert (result is False) == (address == written), (address, written, results)
                assert isinstance(result, CoordinatorConflict) == (address != written), results
        assert os.listdir(shm) == [coordinator_file.FILE_NAME], "no partial file is left behind"


@pytest.mark.parametrize("address", ["", "10.0.0.1", ":8476", "10.0.0.1:port", "10.0.0.1:0", "10.0.0.1:70000"])
def test_a_malformed_address_is_refused_naming_it(tmp_path: Path, address: str) -> None:
    with pytest.raises(ValueError, match=f"coordinator address {address!r} is not HOST:PORT"):
        coordinator_file.write(str(tmp_path), address)
    assert coordinator_file.read(str(tmp_path)) is None


def test_the_worker_waits_for_the_address_until_it_comes(tmp_path: Path) -> None:
    writer = threading.Timer(0.1, coordinator_file.write, (str(tmp_path), "10.0.0.1:8476"))
    writer.start()
    try:
        assert coordinator_file.wait_for(str(tmp_path), within_s=10.0, poll_s=0.01) == "10.0.0.1:8476"
    finally:
        writer.join(5)


def test_the_wait_ends_empty_when_no_address_comes(tmp_path: Path) -> None:
    assert coordinator_file.wait_for(str(tmp_path), within_s=0.05, poll_s=0.01) is None


def test_removing_the_address_leaves_the_directory_as_it_was(tmp_path: Path) -> None:
    coordinator_file.write(str(tmp_path), "10.0.0.1:8476")
    coordinator_file.remove(str(tmp_path))
    coordinator_file.remove(str(tmp_path))  # twice: nothing to remove is no error
    assert os.listdir(tmp_path) == []


def test_a_worker_never_told_the_address_exits_saying_what_it_waited_for(tmp_path: Path) -> None:
    from pathways_worker.settings import parse_worker_args
    from pathways_worker.worker.__main__ import _coordinator_from_sidecar

    settings = parse_worker_args(
        ["--listen", "127.0.0.1:0", "--host-index", "1", "--num-hosts", "2", "--shm-dir", str(tmp_path),
         "--host-name", "s/host-1"],
        env={"PATHWAYS_SLICE_TOKEN": "t0k"},
    )
    with pytest.raises(SystemExit, match=(
        r"host s/host-1: started without --coordinator \(PATHWAYS_COORDINATOR\), and its sidecar was not "
        r"given the slice's JAX coordinator address within 0.05 s"
    )):
        _coordinator_from_sidecar(settings, within_s=0.05)
    coordinator_file.write(str(tmp_path), "10.0.0.1:8476")
    assert _coordinator_from_sidecar(settings, within_s=0.05) == "10.0.0.1:8476"
