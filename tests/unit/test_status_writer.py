"""Every look ends in the StatusWriter: status patched only when it changed, and counted."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from pathways_operator.k8s.metrics import OperatorMetrics
from pathways_operator.k8s.status_writer import StatusWriter


class _NoEvents:
    def post_event(self, *args: Any) -> None:
        raise AssertionError(f"no Event expected: {args}")


def test_each_look_is_counted_by_whether_it_wrote_status() -> None:
    metrics = OperatorMetrics()
    patched: list[tuple[str, str, Any]] = []
    writer = StatusWriter(
        _NoEvents(),  # type: ignore[arg-type]
        lambda ns, name, status: patched.append((ns, name, status)),
        metrics.slice_phase,
        lambda wrote: metrics.looked("VirtualSlice", wrote),
    )
    writer.write("team/train", {}, {"phase": "Ready"}, "Ready", [])
    writer.write("team/train", {}, None, "Ready", [])
    writer.write("team/train", {}, None, "Ready", [])
    assert patched == [("team", "train", {"phase": "Ready"})]
    exposition = generate_latest(metrics.registry).decode()
    assert 'pathways_reconciles_total{kind="VirtualSlice",result="wrote"} 1.0' in exposition
    assert 'pathways_reconciles_total{kind="VirtualSlice",result="unchanged"} 2.0' in exposition
    assert 'pathways_virtualslices{phase="Ready"} 1.0' in exposition
