"""Objects a program's driver owns on its slice's hosts are freed when the driver dies.

The driver (its pod's container) is the client that owns them; killed (SIGKILL: it frees
nothing itself), it stops renewing its lease, and the controller frees its objects on every
host within the lease (10 s).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import grpc
import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.slice_token import call_metadata
from pathways_wire.kube_names import DRIVER_CONTAINER, SIDECAR_PORT
from tests.cluster.builders import program, ref_slice, virtual_slice
from tests.cluster.harness import Objects, OperatorProcess

LEASE_BOUND_S = 40.0
"""The lease (10 s), the controller's check (1 s) and the drop reaching the hosts, generously."""


def worker_store_bytes(pod_ip: str, token: str) -> int:
    with grpc.insecure_channel(f"{pod_ip}:{SIDECAR_PORT}") as channel:
        reply = pb_grpc.DataflowStub(channel).Health(pb.HealthRequest(), timeout=10, metadata=call_metadata(token))
    assert reply.detailed, f"the sidecar at {pod_ip} did not take the slice's token: its store is not told"
    return int(reply.worker_store_bytes)


@pytest.mark.timeout(400, func_only=True)
def test_a_killed_drivers_objects_leave_the_hosts_within_its_lease(
    objects: Objects, operator: OperatorProcess, tmp_path: Path
) -> None:
    objects.apply(virtual_slice("hoard", 4))
    objects.wait_slice("hoard", "Ready", 120, operator)
    (host,) = objects.slice("hoard")["status"]["hosts"]
    marker = tmp_path / "held"
    objects.apply(program("hoarder", "tests.cluster.faulty_programs:holds_objects",
                          ref_slice("main", "hoard"), steps=1, args={"marker": str(marker), "mib": 1}))
    objects.wait_steps("hoarder", 1, 240, what="the driver holds its objects")
    token = objects.slice_token("hoard")
    assert worker_store_bytes(host["podIP"], token) >= 3 << 20

    driver = objects.cluster.container_pid(objects.namespace, "hoarder-driver", DRIVER_CONTAINER)
    os.kill(driver, signal.SIGKILL)

    objects.cluster.poll(
        lambda: worker_store_bytes(host["podIP"], token) == 0, timeout=LEASE_BOUND_S, interval=0.5,
        what="the killed driver's objects freed on its slice's host",
    )
