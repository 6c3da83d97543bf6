"""The operator's watch on a forming gang, against real gRPC sidecar stand-ins.

A gang's sidecars serve long before their workers have formed the JAX job; the
watch asks them until every worker is ready and then wakes the slice, once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from pathways_operator.k8s.sidecar_health import FormingWatch, unready_hosts
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)


class _FormingSidecar(pb_grpc.DataflowServicer):
    """Answers Health with worker_ready only from its ``ready_after``-th call on, and at
    once, as a sidecar that does not wait (``HealthRequest.wait_ready_s``) answers."""

    def __init__(self, ready_after: int) -> None:
        self.calls = 0
        self.ready_after = ready_after
        self._lock = threading.Lock()

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        with self._lock:
            self.calls += 1
            return pb.HealthReply(host="stand-in", worker_ready=self.calls >= self.ready_after)


@pytest.fixture
def sidecars() -> Iterator[list[tuple[str, _FormingSidecar]]]:
    """Two sidecar stand-ins whose workers are ready after 3 and 6 questions."""
    servers, found = [], []
    for ready_after in (3, 6):
        servicer = _FormingSidecar(ready_after)  # type: ignore[abstract]  # a stand-in serving Health alone
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_DataflowServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        found.append((f"127.0.0.1:{port}", servicer))
    try:
        yield found
    finally:
        for server in servers:
            server.stop(0)


def _wait_for(condition: object, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_the_watch_wakes_the_slice_once_when_every_worker_is_ready(
    sidecars: list[tuple[str, _FormingSidecar]],
) -> None:
    addresses = tuple(address for address, _ in sidecars)
    assert unready_hosts(addresses) == [f"sidecar {a} answers but its worker is not ready yet" for a in addresses]
    woken: list[str] = []
    watch = FormingWatch(woken.append, poll_s=0.02)
    watch.watch("ns/gang", addresses)
    watch.watch("ns/gang", addresses)  # watched already: no second watcher
    assert _wait_for(lambda: woken)
    assert unready_hosts(addresses) == []
    assert woken == ["ns/gang"]
    assert all(servicer.calls >= servicer.ready_after for _, servicer in sidecars)


def test_a_forgotten_gang_is_not_asked_about_any_more(sidecars: list[tuple[str, _FormingSidecar]]) -> None:
    address, servicer = sidecars[1]
    woken: list[str] = []
    watch = FormingWatch(woken.append, poll_s=0.02)
    watch.watch("ns/gang", (address,))
    assert _wait_for(lambda: servicer.calls >= 1)
    watch.forget("ns/gang")
    servicer.ready_after = 0  # a watcher still asking would now see it ready and wake the slice

    def settled() -> bool:
        """No question for ten poll periods in a row."""
        before = servicer.calls
        time.sleep(0.2)
        return servicer.calls == before

    assert _wait_for(settled, timeout_s=5.0)
    assert woken == []


class _WaitingSidecar(pb_grpc.DataflowServicer):
    """Answers Health once its worker is ready (``ready``) or the call's ``wait_ready_s`` passed."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.ready = threading.Event()
        self._lock = threading.Lock()

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        with self._lock:
            self.waits.append(request.wait_ready_s)
        self.ready.wait(request.wait_ready_s)
        return pb.HealthReply(host="stand-in", worker_ready=self.ready.is_set())


def test_the_watch_asks_a_sidecar_that_waits_once_until_its_worker_is_ready() -> None:
    servicer = _WaitingSidecar()  # type: ignore[abstract]  # a stand-in serving Health alone
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_DataflowServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        woken: list[str] = []
        watch = FormingWatch(woken.append, poll_s=0.02, ask_s=30.0)
        watch.watch("ns/gang", (address,))
        assert _wait_for(lambda: servicer.waits)
        time.sleep(0.5)  # 25 poll periods: a watch that polled would have asked again
        assert servicer.waits == [30.0] and woken == []
        servicer.ready.set()
        assert _wait_for(lambda: woken)
        assert woken == ["ns/gang"]
        assert servicer.waits == [30.0], "one question, answered when the worker was ready"
    finally:
        server.stop(0)
