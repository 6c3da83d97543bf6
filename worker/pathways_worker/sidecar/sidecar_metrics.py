"""Prometheus metrics of a host's dataflow sidecar (``--metrics-port``, ``PATHWAYS_SIDECAR_METRICS_PORT``).

What someone watching transfers between hosts and islands wants to see, each
labelled with the sidecar's ``host``:

``pathways_sidecar_transfer_bytes_total{direction, path}``
    bytes of values moved, ``direction`` ``in`` or ``out``, by ``path``: ``grpc``
    (``Dataflow.Put`` streams in, Put to peers and ``Fetch`` to clients out),
    ``data-channel`` (raw TCP between sidecars), ``handover`` (piece files handed to a
    peer on the same machine: bytes that never crossed a socket);
``pathways_sidecar_store_bytes`` / ``pathways_sidecar_store_limit_bytes``
    bytes of incoming values the sidecar holds for its worker, and their bound;
``pathways_sidecar_worker_store_bytes``
    the worker's object store, as it last reported it;
``pathways_sidecar_backpressure_waits_total`` / ``..._wait_seconds_total``
    incoming values that had to wait for store room, and how long they waited.

The transfer paths count into one ``transfer_stats.TransferStats``; everything else is
read from the sidecar's own state at scrape time, so a scrape never disagrees with it.
Only a sidecar that serves metrics imports this module (and ``prometheus_client``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from pathways_worker.sidecar.byte_budget import ByteBudget
from pathways_worker.sidecar.transfer_stats import TransferStats


class SidecarMetrics(Collector):
    """The sidecar's exposition, rendered from its state at each scrape."""

    def __init__(
        self,
        host: str,
        transfers: TransferStats,
        budget: ByteBudget,
        worker_store_bytes: Callable[[], int] = lambda: 0,
    ) -> None:
        self.host = host
        self.transfers = transfers
        self.budget = budget
        self.worker_store_bytes = worker_store_bytes
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        host = self.host
        moved = CounterMetricFamily(
            "pathways_sidecar_transfer_bytes", "Bytes of values moved, by direction and path",
            labels=["host", "direction", "path"],
        )
        for (direction, path), nbytes in sorted(self.transfers.snapshot().items()):
            moved.add_metric([host, direction, path], nbytes)
        yield moved
        for name, doc, value in (
            ("pathways_sidecar_store_bytes", "Bytes of incoming values held for the worker", self.budget.used),
            ("pathways_sidecar_store_limit_bytes", "Bound on pathways_sidecar_store_bytes", self.budget.limit),
            ("pathways_sidecar_worker_store_bytes", "The worker's object store as last reported",
             self.worker_store_bytes()),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(name, doc, labels=["host"])
            gauge.add_metric([host], value)
            yield gauge
        waits = CounterMetricFamily(
            "pathways_sidecar_backpressure_waits", "Incoming values that waited for store room",
            labels=["host"],
        )
        waits.add_metric([host], self.budget.waits)
        yield waits
        seconds = CounterMetricFamily(
            "pathways_sidecar_backpressure_wait_seconds", "Time incoming values waited for store room",
            labels=["host"],
        )
        seconds.add_metric([host], self.budget.wait_seconds)
        yield seconds

    def serve(self, port: int, address: str = "0.0.0.0") -> int:
        """Serves ``/metrics`` from a background thread; returns the bound port (0 picks one)."""
        server, _thread = start_http_server(port, addr=address, registry=self.registry)
        return int(server.server_address[1])
