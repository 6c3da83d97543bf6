"""A value moving between multi-host slices reaches each consumer host as only its block.

Two islands of 8 devices, 4 per host: a value made row-sharded on the two hosts of a
slice of island-a and read sharded by the two hosts of a slice of island-b goes, host
to host, only as the block each reading host's devices hold (its rows, or its columns
cut from the producers' rows), whether a program routes it between its computations
or a handle is passed to a later call; and since every host is on this machine, it goes
as piece files handed over, not over a socket. Each
sidecar serves its metrics (``PATHWAYS_SIDECAR_METRICS_PORT=0``), whose ``in`` byte
counters say what each host received.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways as pw
from pathways_wire import pathways_pb2 as pb
from tests.integration.test_host import scrape

pytestmark = pytest.mark.timeout(300)

ROWS, COLS = 64, 1024
"""A float32 value of 256 KiB: large enough to move through shared-memory files."""


@pytest.fixture(scope="module")
def runtime() -> Iterator[pw.Runtime]:
    """Its own embedded cluster, whose sidecars serve metrics."""
    saved = os.environ.get("PATHWAYS_SIDECAR_METRICS_PORT")
    os.environ["PATHWAYS_SIDECAR_METRICS_PORT"] = "0"
    try:
        rt = pw.connect(islands={"island-a": 8, "island-b": 8}, devices_per_host=4)
    finally:
        if saved is None:
            del os.environ["PATHWAYS_SIDECAR_METRICS_PORT"]
        else:
            os.environ["PATHWAYS_SIDECAR_METRICS_PORT"] = saved
    try:
        yield rt
    finally:
        pw.shutdown()


def bytes_in(runtime: pw.Runtime, address: str) -> float:
    """What the sidecar at `address` has received, by every path together."""
    return sum(bytes_in_by_path(runtime, address).values())


def bytes_in_by_path(runtime: pw.Runtime, address: str, direction: str = "in") -> dict[str, float]:
    """What the sidecar at `address` has received (or with `direction="out"` sent), by
    path: grpc, data-channel, handover."""
    name = runtime.host(address).Health(pb.HealthRequest(), timeout=10).host
    assert runtime.cluster is not None
    urls = [
        found.group(1)
        for log in sorted((runtime.cluster.state_dir / "hosts").glob("*/*.log"))
        for found in re.finditer(rf"sidecar {re.escape(name)} metrics on (http://\S+/metrics)", log.read_text())
    ]
    assert urls, f"host {name} ({address}) logged no metrics address"
    samples = scrape(urls[-1])
    return {
        path: samples[f'pathways_sidecar_transfer_bytes_total{{direction="{direction}",path="{path}"}}']
        for path in ("grpc", "data-channel", "handover")
    }


def received(runtime: pw.Runtime, hosts: tuple[str, ...], before: dict[str, float]) -> list[float]:
    return [bytes_in(runtime, h) - before[h] for h in hosts]


def row_steps(read_as: P = P("x")) -> tuple[pw.SliceFunction, pw.SliceFunction]:
    """`3v` on 8 devices (two hosts) of island-a, making its value split by rows, and
    `v + 1` on 8 of island-b, reading it split as `read_as`."""
    ds = pw.make_virtual_device_set()
    left, right = ds.add_slice(devices=8, island="island-a"), ds.add_slice(devices=8, island="island-b")
    return (
        pw.jit(lambda v: v * 3.0, slice=left, in_shardings=P("x"), out_shardings=P("x")),
        pw.jit(lambda v: v + 1.0, slice=right, in_shardings=read_as, out_shardings=P("x")),
    )


def value() -> np.ndarray:
    return np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)


def moved_again(read_as: P, name: str, measure: Callable[[str], Any]) -> tuple[np.ndarray, list[Any], list[Any]]:
    """A value routed from `row_steps`' producer to its consumer, a second time (the first
    loads the program): the output, fetched while its slices are held here, and `measure`
    of each consumer host before and after."""
    produce, consume = row_steps(read_as)

    @pw.program(name=name)
    def move(v: Any) -> Any:
        return consume(produce(v))

    first = move(value())
    first.block_until_ready()
    hosts = first.hosts
    assert len(hosts) == 2
    before = [measure(h) for h in hosts]
    out = move(value())
    out.block_until_ready()
    return np.asarray(out), before, [measure(h) for h in hosts]


@pytest.mark.parametrize("read_as", [P("x"), P(None, "x")], ids=["rows", "columns"])
def test_a_routed_value_reaches_each_consumer_host_as_its_block(runtime: pw.Runtime, read_as: P) -> None:
    """Read by columns, each producer host's rows are cut to the columns of each reader."""
    x = value()
    out, before, after = moved_again(read_as, f"route-{read_as}", lambda h: bytes_in(runtime, h))
    assert [a - b for a, b in zip(after, before)] == [x.nbytes / 2, x.nbytes / 2], "each host only its block"
    np.testing.assert_array_equal(out, x * 3.0 + 1.0)


def test_a_handle_read_by_another_slice_reaches_each_host_as_its_rows(runtime: pw.Runtime) -> None:
    made, plus = row_steps()

    @pw.program(name="rows-make")
    def make(v: Any) -> Any:
        return made(v)

    @pw.program(name="rows-read")
    def read(v: Any) -> Any:
        return plus(v)

    x = value()
    held = make(x)
    first = read(held)
    first.block_until_ready()
    hosts = first.hosts
    before = {h: bytes_in(runtime, h) for h in hosts}
    out = read(held)
    out.block_until_ready()
    assert received(runtime, hosts, before) == [x.nbytes / 2, x.nbytes / 2], "each host only its rows"
    np.testing.assert_array_equal(np.asarray(out), x * 3.0 + 1.0)
    np.testing.assert_array_equal(np.asarray(held), x * 3.0)


def test_a_routed_value_between_slices_on_one_machine_is_handed_over_as_files(runtime: pw.Runtime) -> None:
    """Every host of this embedded cluster shares the machine: the producer hosts name their
    piece files, and no byte of the value crosses a socket (`inbox.handover_refusal` takes a
    file of another host's directory beside the receiver's)."""
    x = value()
    out, before, after = moved_again(P("x"), "route-handover", lambda h: bytes_in_by_path(runtime, h))
    assert [a["handover"] - b["handover"] for a, b in zip(after, before)] == [x.nbytes / 2] * 2
    assert [a["data-channel"] - b["data-channel"] for a, b in zip(after, before)] == [0, 0]
    np.testing.assert_array_equal(out, x * 3.0 + 1.0)
