"""A sidecar asked for Health that may wait: answered the moment its worker is ready,
and only a few callers wait at once (Health needs no token).

Real processes: a sidecar whose worker's port is held but not served yet, then the
worker started on it, as the embedded launcher starts a host.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from pathways_operator.coordinator_port import HeldPort
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.slice_token import INSECURE_FLAG
from pathways_worker.sidecar.dataflow import HEALTH_WAITERS
from tests.integration.test_host import listening_address, spawn_host_process

pytestmark = pytest.mark.timeout(180)

START_TIMEOUT_S = 90.0
WAIT_S = 9.5
"""What each Health call may wait: within the sidecar's own bound (10 s); the worker is
started `ANSWERED_AT_ONCE_S` into it and must be ready within the rest."""
ANSWERED_AT_ONCE_S = 2.0


def test_a_waiting_health_call_is_answered_once_the_worker_is_ready_and_only_a_few_wait(
    tmp_path: Path,
) -> None:
    ip = "127.0.0.1"
    held = HeldPort(ip, "worker")
    shm = tmp_path / "shm"
    common = ["--shm-dir", str(shm), "--host-name", "health/host-0", INSECURE_FLAG]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    sidecar = spawn_host_process([sys.executable, "-m", "pathways_worker.sidecar", "--listen", f"{ip}:0",
                                  "--worker", held.address, *common], tmp_path / "sidecar.log", env)
    worker: subprocess.Popen[bytes] | None = None
    try:
        address = listening_address(sidecar, time.monotonic() + START_TIMEOUT_S, tmp_path / "sidecar.log")
        with grpc.insecure_channel(address) as channel, futures.ThreadPoolExecutor(2 * HEALTH_WAITERS) as pool:
            stub = pb_grpc.DataflowStub(channel)
            assert not stub.Health(pb.HealthRequest(), timeout=10).worker_ready  # nothing serves the port yet
            asked = [pool.submit(stub.Health, pb.HealthRequest(wait_ready_s=WAIT_S), timeout=WAIT_S + 30)
                     for _ in range(2 * HEALTH_WAITERS)]
            done, waiting = futures.wait(asked, timeout=ANSWERED_AT_ONCE_S)
            assert len(done) == HEALTH_WAITERS and len(waiting) == HEALTH_WAITERS, (
                f"{len(done)} of {len(asked)} answered at once; those beyond the {HEALTH_WAITERS} waiters "
                "should be, and only they")
            assert not any(f.result().worker_ready for f in done)
            worker = spawn_host_process([sys.executable, "-m", "pathways_worker.worker", "--listen",
                                         held.address, "--devices", "1", *common], tmp_path / "worker.log", env)
            started = time.monotonic()
            answered = [f.result(timeout=START_TIMEOUT_S) for f in waiting]
            if not all(reply.worker_ready for reply in answered):
                pytest.fail(f"waiting calls answered without the worker ready after "
                            f"{time.monotonic() - started:.1f} s; worker log:\n"
                            f"{(tmp_path / 'worker.log').read_text()[-2000:]}")
    finally:
        for proc in (worker, sidecar):
            if proc is not None:
                proc.kill()
                proc.wait(30)
        held.release()
