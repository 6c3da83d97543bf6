"""What the admission passes of one moment read of the cluster, shared (``k8s/admission_inputs.py``)."""

from __future__ import annotations

from collections.abc import Callable

from pathways_operator.k8s.admission_inputs import MAX_AGE_S, AdmissionInputs
from pathways_operator.k8s.cluster_api import Json
from tests.unit.k8s_builders import Clock


class ClusterLists:
    """The three lists a pass reads, counting each listing; `during_read` runs inside one."""

    def __init__(self) -> None:
        self.nodes: list[Json] = [{"metadata": {"name": "m1"}}]
        self.listings: list[str] = []
        self.during_read: Callable[[], None] = lambda: None

    def list_slices(self) -> list[Json]:
        self.listings.append("slices")
        return []

    def list_pods(self, namespace: str | None = None) -> list[Json]:
        assert namespace is None, "a pass counts the pods of every namespace"
        self.listings.append("pods")
        self.during_read()
        return []

    def list_nodes(self) -> list[Json]:
        self.listings.append("nodes")
        return list(self.nodes)


def _inputs(api: ClusterLists, clock: Clock, counts: list[bool] | None = None) -> AdmissionInputs:
    counted = counts.append if counts is not None else (lambda listed: None)
    return AdmissionInputs(api, clock=clock, counted=counted)  # type: ignore[arg-type]


def test_passes_within_max_age_share_one_listing_and_the_next_pass_lists_again() -> None:
    api, clock, counts = ClusterLists(), Clock(), list[bool]()
    inputs = _inputs(api, clock, counts)
    first = inputs.read()
    assert api.listings == ["slices", "pods", "nodes"]
    clock.now += MAX_AGE_S - 0.01
    api.nodes.append({"metadata": {"name": "m2"}})
    assert inputs.read() is first and len(api.listings) == 3, "a read of a moment ago is reused"
    clock.now += 0.01
    assert [n["metadata"]["name"] for n in inputs.read().nodes] == ["m1", "m2"]
    assert len(api.listings) == 6, "a read MAX_AGE_S old is not reused"
    assert counts == [True, False, True]


def test_a_reported_change_makes_the_next_pass_list_the_cluster_again() -> None:
    api, clock = ClusterLists(), Clock()
    inputs = _inputs(api, clock)
    inputs.read()
    api.nodes.clear()
    inputs.changed()
    assert inputs.read().nodes == () and len(api.listings) == 6


def test_a_read_during_which_a_change_was_reported_is_used_once_and_not_shared() -> None:
    api, clock = ClusterLists(), Clock()
    inputs = _inputs(api, clock)
    api.during_read = inputs.changed
    inputs.read()
    api.during_read = lambda: None
    inputs.read()
    assert len(api.listings) == 6, "the read that raced a change was not kept"
    inputs.read()
    assert len(api.listings) == 6, "a read no change raced is kept"
