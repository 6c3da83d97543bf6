"""A sidecar's Prometheus metrics, scraped over HTTP from a real host (worker + sidecar).

One host on 127.0.0.25 with ``--metrics-port`` and a 1 MiB store: a call's input is
Put (bytes in over gRPC), its output fetched (bytes out over gRPC), and a second Put
that finds no room waits for a release (one back-pressure wait). Each shows on
``/metrics`` as its counter, and the store gauge follows what the sidecar holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pathways_wire import pathways_pb2 as pb
from tests.integration.test_host import (
    ControlStream,
    HostProcs,
    backpressure_waits,
    chain_program,
    fetch,
    grants,
    health,
    launch,
    metrics_url,
    put,
    scrape,
    start_slice,
    stop_hosts,
    wait_for,
    x_value,
)

IP = "127.0.0.25"
STORE_LIMIT = 1 << 20


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HostProcs, str]]:
    hosts = start_slice(
        "metrics", [IP], 2, tmp_path_factory.mktemp("metrics-host"),
        sidecar_flags=["--metrics-port", "0", "--store-limit-bytes", str(STORE_LIMIT), "--put-wait-s", "5"],
    )
    try:
        yield hosts[0], metrics_url(hosts[0])
    finally:
        stop_hosts(hosts)


def transferred(samples: dict[str, float], direction: str, path: str) -> float:
    return samples[f'pathways_sidecar_transfer_bytes_total{{direction="{direction}",path="{path}"}}']


@pytest.mark.timeout(120)
def test_transfers_store_and_back_pressure_are_scraped(host: tuple[HostProcs, str]) -> None:
    proc, url = host
    a = proc.address
    before = scrape(url)
    for direction in ("in", "out"):
        for path in ("grpc", "data-channel", "handover"):
            assert transferred(before, direction, path) == 0
    assert before["pathways_sidecar_store_limit_bytes"] == STORE_LIMIT
    assert before["pathways_sidecar_backpressure_waits_total"] == 0

    ctl = ControlStream(a)
    try:
        wait_for("hello", lambda: ctl.hello == a)
        ctl.send(load=pb.HostProgram(program_id="m", program=chain_program("m"), slice="a"))
        ctl.send(launch=launch("m1", "m", outputs=[(1, 0)]))
        ctl.send(grants=grants("m1", [(1, 0), (2, 1), (3, 2)]))
        x = x_value()
        put(a, "m1", (-1, 0), x)
        assert all(c.ok for c in ctl.wait("m1", 3))
        out = fetch([a], "m1", (1, 0))
        after = scrape(url)
        assert transferred(after, "in", "grpc") == x.nbytes
        assert transferred(after, "out", "grpc") == out.nbytes
        assert after["pathways_sidecar_store_bytes"] == health(a).store_bytes == x.nbytes
        ctl.send(release=pb.ReleaseCall(call_id="m1"))

        big = np.ones(600 << 10, np.uint8)
        wait_for("empty store", lambda: health(a).store_bytes == 0)
        put(a, "bp1", (-1, 0), big)
        waiter = threading.Thread(target=put, args=(a, "bp2", (-1, 0), big))
        waiter.start()
        wait_for("the second Put waiting for room", lambda: backpressure_waits(url) == 1)
        ctl.send(release=pb.ReleaseCall(call_id="bp1"))
        waiter.join(10)
        pressed = scrape(url)
        assert pressed["pathways_sidecar_backpressure_waits_total"] == 1
        assert pressed["pathways_sidecar_backpressure_wait_seconds_total"] > 0
        assert transferred(pressed, "in", "grpc") == x.nbytes + 2 * big.nbytes
        ctl.send(release=pb.ReleaseCall(call_id="bp2"))
    finally:
        ctl.close()


def test_no_metrics_port_means_no_endpoint(tmp_path: Path) -> None:
    from pathways_worker.settings import parse_sidecar_args

    base = ["--listen", f"{IP}:0", "--worker", f"{IP}:1", "--insecure-no-token"]
    assert parse_sidecar_args(base, env={}).metrics_port is None
    assert parse_sidecar_args(base, env={"PATHWAYS_SIDECAR_METRICS_PORT": "9100"}).metrics_port == 9100
    with pytest.raises(SystemExit, match="PATHWAYS_SIDECAR_METRICS_PORT"):
        parse_sidecar_args([*base, "--metrics-port", "http"], env={})
