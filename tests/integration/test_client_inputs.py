"""A client's inputs reach the hosts, and its fetches come back, over the hosts' data
channels, or over gRPC Put and Fetch where ``PATHWAYS_CLIENT_DATA_CHANNEL=off``.

Each setting gets its own embedded cluster (the client reads the switch as it
starts), whose sidecars serve metrics: the ``in`` and ``out`` byte counters by path say
how each host received its rows of an input and sent its rows of the result, and the
results say the bytes arrived whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways as pw
from pathways_wire import pathways_pb2 as pb
from pathways_worker.shared_memory import WARM_LIMIT_BYTES
from tests.integration.test_routed_blocks import bytes_in_by_path

pytestmark = pytest.mark.timeout(300)

ROWS, COLS = 64, 1024
MIB = 1 << 20


@pytest.fixture(scope="module", params=["on", "off"])
def runtime(request: pytest.FixtureRequest) -> Iterator[tuple[pw.Runtime, str]]:
    switches = {"PATHWAYS_SIDECAR_METRICS_PORT": "0", "PATHWAYS_CLIENT_DATA_CHANNEL": request.param}
    saved = {name: os.environ.get(name) for name in switches}
    os.environ.update(switches)
    try:
        rt = pw.connect(islands={"island-a": 8}, devices_per_host=4)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    try:
        yield rt, request.param
    finally:
        pw.shutdown()


def rows_program(name: str, factor: float) -> tuple[pw.ProgramFunction, pw.VirtualSlice]:
    """A program that scales its input on a slice of two hosts, each holding half the rows."""
    vslice = pw.make_virtual_device_set().add_slice(devices=8)
    scale = pw.jit(lambda v: v * factor, slice=vslice, in_shardings=P("x"), out_shardings=P("x"))

    @pw.program(name=name)
    def prog(v: Any) -> Any:
        return scale(v)

    return prog, vslice


def test_each_host_receives_and_sends_its_rows_by_the_path_the_switch_says(
    runtime: tuple[pw.Runtime, str],
) -> None:
    rt, switch = runtime
    prog, _ = rows_program("double-rows", 2.0)
    x = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    out = prog(x)
    hosts = out.hosts
    assert len(hosts) == 2
    before = {(h, d): bytes_in_by_path(rt, h, d) for h in hosts for d in ("in", "out")}
    for step in range(3):
        np.testing.assert_array_equal(np.asarray(prog(x + step)), (x + step) * 2.0)
    used, unused = ("data-channel", "grpc") if switch == "on" else ("grpc", "data-channel")
    for h in hosts:
        for direction in ("in", "out"):
            was, now = before[h, direction], bytes_in_by_path(rt, h, direction)
            assert now[used] - was[used] == 3 * x.nbytes // 2, (h, direction, was, now)
            assert now[unused] == was[unused], (h, direction, was, now)
            assert now["handover"] == was["handover"]


def test_an_input_larger_than_a_hosts_bound_on_kept_mappings_arrives_whole(
    runtime: tuple[pw.Runtime, str],
) -> None:
    """A mapping over the bound alone is the receiver's to use, not kept: before, keeping it
    within the bound closed it under the receiver ("mmap closed or invalid")."""
    vslice = pw.make_virtual_device_set().add_slice(devices=4)
    total = pw.jit(lambda v: (v.sum(), v[-1]), slice=vslice)  # replicated: the host takes all of it

    @pw.program(name="sum-over-bound")
    def prog(v: Any) -> Any:
        return total(v)

    n = (WARM_LIMIT_BYTES + 4 * MIB) // 4
    x = np.ones(n, np.float32)
    x[-1] = 3.0
    whole, last = prog(x)
    assert float(last) == 3.0
    assert float(whole) == pytest.approx(n + 2.0, rel=1e-6)


def _connections_to(ports: set[int]) -> int:
    """This process's TCP sockets whose remote port is one of `ports` (any state),
    read from /proc: its socket inodes, matched against the kernel's TCP table."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].rsplit(":", 1)[1], 16) in ports and fields[9] in inodes:
            found += 1
    return found


def test_a_released_slice_leaves_no_data_connection_of_the_client(runtime: tuple[pw.Runtime, str]) -> None:
    rt, switch = runtime
    prog, vslice = rows_program("triple-rows", 3.0)
    x = np.ones((ROWS, COLS), np.float32)
    out = prog(x)
    np.testing.assert_array_equal(np.asarray(out), x * 3.0)
    ports = {
        int(rt.host(h).Health(pb.HealthRequest(), timeout=10).data_address.rsplit(":", 1)[1])
        for h in out.hosts
    }
    if switch == "on":
        assert _connections_to(ports) >= len(ports)  # kept for the next call, one per host at least
    else:
        assert _connections_to(ports) == 0
    del out
    vslice.release()
    assert _connections_to(ports) == 0
