"""The Nodes a gang is bound to, as a watch saw them (``k8s/node_cache.py``)."""

from __future__ import annotations

from collections.abc import Callable

from pathways_operator.k8s.cluster_api import Json
from pathways_operator.k8s.node_cache import MAX_AGE_S, NodeCache
from tests.unit.k8s_builders import Clock


def _node(name: str, version: str = "1") -> Json:
    return {"metadata": {"name": name, "resourceVersion": version}}


class NodeApi:
    """`get_node` on a dict of Nodes, counting reads; `during_read` runs inside each."""

    def __init__(self, *nodes: Json) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.reads: list[str] = []
        self.during_read: Callable[[], None] = lambda: None

    def get_node(self, name: str) -> Json | None:
        self.reads.append(name)
        found = self.nodes.get(name)
        self.during_read()
        return found


def _cache(api: NodeApi, clock: Clock) -> NodeCache:
    return NodeCache(api, clock=clock)  # type: ignore[arg-type]


def test_a_node_the_watch_saw_is_served_without_a_read_until_it_is_too_old_to_trust() -> None:
    api, clock = NodeApi(_node("m1", "2")), Clock()
    cache = _cache(api, clock)
    cache.seen(_node("m1", "1"))
    clock.now += MAX_AGE_S
    assert cache.get("m1") == _node("m1", "1") and api.reads == []
    clock.now += 0.1
    assert cache.get("m1") == _node("m1", "2") and api.reads == ["m1"], "an old entry is read again by name"
    assert cache.get("m1") == _node("m1", "2") and api.reads == ["m1"], "and the read is kept"


def test_a_node_the_watch_has_not_seen_is_read_by_name_and_a_missing_one_is_none() -> None:
    api, clock = NodeApi(_node("m1")), Clock()
    cache = _cache(api, clock)
    assert cache.get("m1") == _node("m1") and cache.get("m1") == _node("m1")
    assert cache.get("gone") is None and cache.get("gone") is None
    assert api.reads == ["m1", "gone", "gone"], "a missing Node is asked for again at each look"


def test_a_node_the_watch_saw_deleted_is_read_again_and_found_missing() -> None:
    api, clock = NodeApi(_node("m1")), Clock()
    cache = _cache(api, clock)
    cache.seen(_node("m1"))
    del api.nodes["m1"]
    cache.gone("m1")
    assert cache.get("m1") is None and api.reads == ["m1"]


def test_a_deletion_the_watch_saw_during_a_read_wins_over_the_read() -> None:
    api, clock = NodeApi(_node("m1")), Clock()
    cache = _cache(api, clock)

    def deleted_meanwhile() -> None:
        clock.now += 0.01
        cache.gone("m1")

    api.during_read = deleted_meanwhile
    assert cache.get("m1") is None, "the read began before the deletion the watch reported"


def test_a_change_the_watch_saw_during_a_read_wins_over_the_read() -> None:
    api, clock = NodeApi(_node("m1", "1")), Clock()
    cache = _cache(api, clock)

    def changed_meanwhile() -> None:
        clock.now += 0.01
        cache.seen(_node("m1", "2"))

    api.during_read = changed_meanwhile
    assert cache.get("m1") == _node("m1", "2")


def test_a_node_seen_again_after_its_deletion_is_served() -> None:
    api, clock = NodeApi(), Clock()
    cache = _cache(api, clock)
    cache.gone("m1")
    clock.now += 1
    cache.seen(_node("m1", "3"))
    assert cache.get("m1") == _node("m1", "3") and api.reads == []


def _machine(name: str, *, ready: str = "True", unschedulable: bool = False, devices: str = "4",
             heartbeat: str = "t0", labels: dict[str, str] | None = None) -> Json:
    return {
        "metadata": {"name": name, "resourceVersion": heartbeat,
                     "labels": {"pathways.dev/island": "island-a", **(labels or {})}},
        "spec": {"unschedulable": unschedulable},
        "status": {
            "allocatable": {"pathways.dev/device": devices, "cpu": "4", "memory": "8Gi"},
            "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat}],
        },
    }


def test_seeing_a_node_says_whether_admission_may_read_it_differently_now() -> None:
    cache = _cache(NodeApi(), Clock())
    assert cache.seen(_machine("m1", ready="False")), "a Node not held before"
    assert not cache.seen(_machine("m1", ready="False", heartbeat="t1")), "a heartbeat changes nothing admission reads"
    assert cache.seen(_machine("m1", heartbeat="t2")), "it turned Ready"
    assert cache.seen(_machine("m1", unschedulable=True)), "it was cordoned"
    assert cache.seen(_machine("m1")), "and uncordoned"
    assert cache.seen(_machine("m1", devices="8")), "its devices grew"
    assert cache.seen(_machine("m1", devices="8", labels={"pool": "b"})), "a label a driver may select changed"
    assert not cache.seen(_machine("m1", devices="8", labels={"pool": "b"}, heartbeat="t3"))
    assert not cache.seen({"metadata": {}}), "a Node without a name is not held"


def test_a_node_read_by_name_is_the_one_a_later_sighting_is_compared_with() -> None:
    api, clock = NodeApi(_machine("m1")), Clock()
    cache = _cache(api, clock)
    assert cache.get("m1") == _machine("m1")
    assert not cache.seen(_machine("m1", heartbeat="t1")), "the read saw this Node as it is"
    cache.gone("m1")
    assert cache.seen(_machine("m1")), "a Node deleted and seen again is new"
