"""A host started without its slice's JAX coordinator address joins once its sidecar is told it.

The operator creates every pod of a gang at once, before host 0's pod has the IP its
coordinator serves on, and then tells the other hosts' sidecars that address
(``Dataflow.Coordinator``, slice token required). Real processes: host 0's worker with
its coordinator, host 1's worker without one, host 1's sidecar started beside it on
the port the worker will serve on, as in a pod.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from pathways_operator.coordinator_port import HeldPort
from pathways_operator.k8s.coordinator_handoff import CoordinatorTeller
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.slice_token import ENV_TOKEN, METADATA_KEY
from pathways_worker import coordinator_file
from tests.integration.test_host import listening_address, spawn_host_process

pytestmark = pytest.mark.timeout(240)

START_TIMEOUT_S = 120.0
TOKEN = "t0k-coordinator-handoff"
IPS = ("127.0.0.31", "127.0.0.32")


def _tell(stub: pb_grpc.DataflowStub, address: str, token: str | None) -> None:
    metadata = () if token is None else ((METADATA_KEY, token),)
    stub.Coordinator(pb.CoordinatorRequest(address=address), timeout=10, metadata=metadata)


def _code(err: pytest.ExceptionInfo[grpc.RpcError]) -> grpc.StatusCode:
    return err.value.code()


def test_a_host_without_the_coordinator_joins_once_its_sidecar_is_told_and_only_by_the_token_holder(
    tmp_path: Path,
) -> None:
    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, ENV_TOKEN: TOKEN}
    coordinator = HeldPort(IPS[0])
    worker_port = HeldPort(IPS[1], "worker")
    shm = [str(tmp_path / f"shm-{i}") for i in range(2)]
    procs: list[subprocess.Popen[bytes]] = []

    def start(i: int, role: str, *flags: str) -> subprocess.Popen[bytes]:
        proc = spawn_host_process(
            [sys.executable, "-m", f"pathways_worker.{role}", "--shm-dir", shm[i],
             "--host-name", f"handoff/host-{i}", *flags],
            tmp_path / f"{role}-{i}.log", env,
        )
        procs.append(proc)
        return proc

    try:
        host0 = start(0, "worker", "--listen", f"{IPS[0]}:0", "--host-index", "0", "--num-hosts", "2",
                      "--coordinator", coordinator.address, "--devices", "1")
        host1 = start(1, "worker", "--listen", worker_port.address, "--host-index", "1", "--num-hosts", "2",
                      "--devices", "1")
        sidecar1 = start(1, "sidecar", "--listen", f"{IPS[1]}:0", "--worker", worker_port.address)
        deadline = time.monotonic() + START_TIMEOUT_S
        address = listening_address(sidecar1, deadline, tmp_path / "sidecar-1.log")
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.DataflowStub(channel)
            for token in (None, "another slice's token"):
                with pytest.raises(grpc.RpcError) as refused:
                    _tell(stub, "127.0.0.66:1234", token)
                assert _code(refused) is grpc.StatusCode.UNAUTHENTICATED
            assert coordinator_file.read(shm[1]) is None, "a caller without the token changed nothing"
            with pytest.raises(grpc.RpcError) as malformed:
                _tell(stub, "nowhere", TOKEN)
            assert _code(malformed) is grpc.StatusCode.INVALID_ARGUMENT
            assert "'nowhere' is not HOST:PORT" in str(malformed.value.details())
            assert host1.poll() is None, "the worker waits for the address"

            _tell(stub, coordinator.address, TOKEN)
            _tell(stub, coordinator.address, TOKEN)  # told again, as a restarted operator would
            with pytest.raises(grpc.RpcError) as conflict:
                _tell(stub, f"{IPS[0]}:1", TOKEN)
            assert _code(conflict) is grpc.StatusCode.FAILED_PRECONDITION

            for i, worker in enumerate((host0, host1)):
                listening_address(worker, deadline, tmp_path / f"worker-{i}.log")
            while not stub.Health(pb.HealthRequest(wait_ready_s=1.0), timeout=10).worker_ready:
                assert time.monotonic() < deadline, "host 1's worker joined but its sidecar never saw it ready"
        assert f"JAX coordinator {coordinator.address}, from the sidecar" in (tmp_path / "worker-1.log").read_text()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()
        coordinator.release()
        worker_port.release()


def test_a_sidecar_that_listens_only_after_the_operator_asked_is_told_as_soon_as_it_does(tmp_path: Path) -> None:
    """The slice's reconciler asks as soon as a pod has an IP, before its sidecar listens;
    the teller keeps trying that host until it is told, and the worker joins."""
    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, ENV_TOKEN: TOKEN}
    coordinator = HeldPort(IPS[0])
    worker_port, sidecar_port = HeldPort(IPS[1], "worker"), HeldPort(IPS[1], "sidecar")
    teller = CoordinatorTeller()
    procs: list[subprocess.Popen[bytes]] = []

    def start(i: int, role: str, *flags: str) -> subprocess.Popen[bytes]:
        proc = spawn_host_process(
            [sys.executable, "-m", f"pathways_worker.{role}", "--shm-dir", str(tmp_path / f"shm-{i}"),
             "--host-name", f"late/host-{i}", *flags],
            tmp_path / f"{role}-{i}.log", env,
        )
        procs.append(proc)
        return proc

    try:
        teller.tell("ns/late", 0, coordinator.address, TOKEN, [sidecar_port.address])
        assert teller.tell_now("ns/late", 0, coordinator.address, TOKEN, [sidecar_port.address]), (
            "nothing listens there yet: telling it at once fails, saying so")
        workers = [
            start(0, "worker", "--listen", f"{IPS[0]}:0", "--host-index", "0", "--num-hosts", "2",
                  "--coordinator", coordinator.address, "--devices", "1"),
            start(1, "worker", "--listen", worker_port.address, "--host-index", "1", "--num-hosts", "2",
                  "--devices", "1"),
        ]
        start(1, "sidecar", "--listen", sidecar_port.address, "--worker", worker_port.address)
        deadline = time.monotonic() + START_TIMEOUT_S
        for i, worker in enumerate(workers):
            listening_address(worker, deadline, tmp_path / f"worker-{i}.log")
        assert teller.tell_now("ns/late", 0, coordinator.address, TOKEN, [sidecar_port.address]) == [], (
            "told once, by the background tries")
    finally:
        teller.forget("ns/late")
        for proc in procs:
            proc.kill()
            proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()
        for port in (coordinator, worker_port, sidecar_port):
            port.release()
