"""Prometheus metrics of the operator (``--metrics-port``, the chart's ``metrics.port``).

What an operator of a shared accelerator pool wants on a dashboard:

``pathways_virtualslices{phase}``, ``pathways_programs{phase}``
    objects by phase, as their last reconcile left them;
``pathways_admission_queue_length{island}``
    slices waiting for devices, by the island they wait for (pinned, or the one
    that came closest to fitting; ``none`` when no island ever can);
``pathways_admission_wait_seconds``
    from entering the queue (creation, or the recreation of a lost gang) to
    admission;
``pathways_admission_passes_total{cluster_read}``
    admission passes (one per look of a queued slice), ``cluster_read`` ``listed``
    where the pass listed the cluster's slices, pods and Nodes and ``reused`` where it
    decided on a read another pass made a moment before (``k8s.admission_inputs``);
``pathways_computations_dispatched_total``
    computations the island scheduler has granted;
``pathways_contended_grants_total{weight}``
    those granted on a slice that another program's call was also waiting for, by
    the weight of the program that got them: on a shared slice they follow the weights;
``pathways_program_step_seconds``
    wall time per completed program step, as the drivers report them;
``pathways_reconciles_total{kind,result}``
    looks at VirtualSlices and PathwaysPrograms, ``result`` ``wrote`` when the look
    patched status and ``unchanged`` when it found nothing to write: a steady object
    keeps being looked at without being rewritten.

The reconcilers report into :class:`OperatorMetrics`; gauges are rendered at
scrape time from those reports, so a metric never disagrees with the last status
written.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client import Counter as PrometheusCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_WAIT_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_STEP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


class OperatorMetrics(Collector):
    """Everything the operator exports; thread-safe, since reconciles run in parallel."""

    def __init__(
        self,
        computations: Callable[[], int] = lambda: 0,
        contended: Callable[[], Mapping[float, int]] = dict,
    ) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._slice_phases: dict[str, str] = {}
        self._program_phases: dict[str, str] = {}
        self._queue: dict[str, int] = {}
        self._computations = computations
        self._contended = contended
        self.admission_wait = Histogram(
            "pathways_admission_wait_seconds",
            "Seconds a VirtualSlice waited in the admission queue before its gang was placed.",
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.step_seconds = Histogram(
            "pathways_program_step_seconds",
            "Wall time of one completed PathwaysProgram step.",
            buckets=_STEP_BUCKETS,
            registry=self.registry,
        )
        self.reconciles = PrometheusCounter(
            "pathways_reconciles",
            "Looks at an object, by kind and whether the look wrote its status.",
            labelnames=["kind", "result"],
            registry=self.registry,
        )
        self.admission_passes = PrometheusCounter(
            "pathways_admission_passes",
            "Admission passes, by whether the pass listed the cluster or reused a read of a moment before.",
            labelnames=["cluster_read"],
            registry=self.registry,
        )
        self.registry.register(self)

    def slice_phase(self, key: str, phase: str | None) -> None:
        self._set_phase(self._slice_phases, key, phase)

    def program_phase(self, key: str, phase: str | None) -> None:
        self._set_phase(self._program_phases, key, phase)

    def _set_phase(self, phases: dict[str, str], key: str, phase: str | None) -> None:
        """Record an object's phase; None forgets the object (it was deleted)."""
        with self._lock:
            if phase is None:
                phases.pop(key, None)
            else:
                phases[key] = phase

    def looked(self, kind: str, wrote: bool) -> None:
        self.reconciles.labels(kind=kind, result="wrote" if wrote else "unchanged").inc()

    def admission_pass(self, listed: bool) -> None:
        self.admission_passes.labels(cluster_read="listed" if listed else "reused").inc()

    def queue(self, waiting_by_island: Mapping[str, int]) -> None:
        with self._lock:
            self._queue = dict(waiting_by_island)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self._lock:
            slices = Counter(self._slice_phases.values())
            programs = Counter(self._program_phases.values())
            queue = dict(self._queue)
        family = GaugeMetricFamily("pathways_virtualslices", "VirtualSlices by phase.", labels=["phase"])
        for phase, count in sorted(slices.items()):
            family.add_metric([phase], count)
        yield family
        family = GaugeMetricFamily("pathways_programs", "PathwaysPrograms by phase.", labels=["phase"])
        for phase, count in sorted(programs.items()):
            family.add_metric([phase], count)
        yield family
        family = GaugeMetricFamily(
            "pathways_admission_queue_length", "VirtualSlices waiting for devices, by island.",
            labels=["island"],
        )
        for island, count in sorted(queue.items()):
            family.add_metric([island], count)
        yield family
        yield CounterMetricFamily(
            "pathways_computations_dispatched",
            "Computations granted by the island scheduler.",
            value=self._computations(),
        )
        shares = CounterMetricFamily(
            "pathways_contended_grants",
            "Computations granted on a slice another program's call was also waiting for, by weight.",
            labels=["weight"],
        )
        for weight, count in sorted(self._contended().items()):
            shares.add_metric([f"{weight:g}"], count)
        yield shares

    def serve(self, port: int) -> int:
        """Serve ``/metrics`` on ``port`` (all interfaces; 0: any free port) from a background
        thread; returns the port bound."""
        server, _ = start_http_server(port, registry=self.registry)
        return int(server.server_port)
