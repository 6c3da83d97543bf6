"""``pathways status -w`` without a cluster: how lists and watch events become the printed
objects, and how a stream resumes after a bookmark, a dropped connection or a 410 Gone."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from collections.abc import Iterable, Iterator
from typing import Any

from pathways.cli.render import status_text
from pathways.cli.watch_state import (
    PROGRAMS,
    SLICES,
    Changed,
    Listed,
    StreamFailed,
    WatchedObjects,
    resume_version,
    until_done,
)
from pathways.cli.watch_streams import MAX_INTERRUPTIONS, follow
from pathways.kube import KubeError, ResourceVersionGone, WatchInterrupted
from pathways.kube_views import ProgramView, SliceView

Manifest = dict[str, Any]


def obj(name: str, version: str, namespace: str = "ns", **status: Any) -> Manifest:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": version},
        "spec": {"devices": 4},
        "status": status,
    }


def program(name: str, phase: str) -> ProgramView:
    raw = {"metadata": {"name": name, "namespace": "ns"}, "spec": {}, "status": {"phase": phase}}
    return ProgramView.from_object(raw)


def test_nothing_is_printed_until_both_kinds_are_listed() -> None:
    seen = WatchedObjects()
    seen.apply(Listed(SLICES, [obj("a", "1")]))
    assert not seen.complete
    seen.apply(Listed(PROGRAMS, []))
    assert seen.complete


def test_events_put_and_remove_objects_and_change_the_snapshot() -> None:
    seen = WatchedObjects()
    seen.apply(Listed(SLICES, [obj("b", "1"), obj("a", "2")]))
    seen.apply(Listed(PROGRAMS, []))
    before = seen.snapshot()
    assert [o["metadata"]["name"] for o in seen.objects(SLICES)] == ["a", "b"]
    seen.apply(Changed(SLICES, "MODIFIED", obj("a", "3", phase="Ready", island="island-b")))
    seen.apply(Changed(SLICES, "ADDED", obj("c", "4")))
    seen.apply(Changed(SLICES, "DELETED", obj("b", "5")))
    assert seen.snapshot() != before
    assert seen.snapshot() == (("uid-a", "3"), ("uid-c", "4"))
    views = [SliceView.from_object(o) for o in seen.objects(SLICES)]
    table = status_text(views, [], datetime(2026, 11, 23, tzinfo=timezone.utc), namespace="ns")
    assert table.splitlines()[1].split()[:4] == ["a", "4", "island-b", "Ready"]


def test_a_repeated_version_leaves_the_snapshot_alone() -> None:
    seen = WatchedObjects()
    seen.apply(Listed(SLICES, [obj("a", "1")]))
    seen.apply(Listed(PROGRAMS, []))
    before = seen.snapshot()
    seen.apply(Changed(SLICES, "MODIFIED", obj("a", "1")))
    assert seen.snapshot() == before


def test_a_list_replaces_what_was_known_of_its_kind_only() -> None:
    seen = WatchedObjects()
    seen.apply(Listed(SLICES, [obj("old", "1")]))
    seen.apply(Listed(PROGRAMS, [obj("p", "2")]))
    seen.apply(Listed(SLICES, [obj("new", "9")]))
    assert [o["metadata"]["name"] for o in seen.objects(SLICES)] == ["new"]
    assert [o["metadata"]["name"] for o in seen.objects(PROGRAMS)] == ["p"]


def test_objects_of_all_namespaces_are_ordered_by_namespace_then_name() -> None:
    seen = WatchedObjects()
    seen.apply(Listed(SLICES, [obj("a", "1", "z"), obj("b", "2", "a"), obj("a", "3", "a")]))
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in seen.objects(SLICES)] == [
        ("a", "a"), ("a", "b"), ("z", "a"),
    ]  # fmt: skip


def test_bookmarks_and_events_move_the_resume_version_on() -> None:
    assert resume_version("5", "BOOKMARK", {"metadata": {"resourceVersion": "9"}}) == "9"
    assert resume_version("5", "MODIFIED", obj("a", "7")) == "7"
    assert resume_version("5", "ERROR", {"code": 410}) == "5"
    assert resume_version("5", "ADDED", {"metadata": {}}) == "5"


def test_until_done_needs_programs_and_names_failed_and_pending_ones() -> None:
    assert not until_done([]).done
    assert until_done([program("a", "Running"), program("b", "Failed")]).pending == ("a",)
    outcome = until_done([program("a", "Succeeded"), program("b", "Failed")])
    assert outcome.done and outcome.failed == ("b",)


class FakeApi:
    """Lists and watch requests answered from scripts: each watch request is a list of
    events, or an exception to raise after them."""

    def __init__(self, lists: list[tuple[list[Manifest], str]], watches: list[list[Any]]) -> None:
        self.lists, self.watches = lists, watches
        self.watched_from: list[str] = []

    def list_objects(self) -> tuple[list[Manifest], str]:
        return self.lists.pop(0)

    def watch_from(self, version: str) -> Iterable[tuple[str, Manifest]]:
        self.watched_from.append(version)
        return self._events(self.watches.pop(0))

    def _events(self, script: list[Any]) -> Iterator[tuple[str, Manifest]]:
        for step in script:
            if isinstance(step, Exception):
                raise step
            yield step


def run(api: FakeApi, stop_after: int) -> list[Any]:
    stopped = threading.Event()
    updates = []
    for update in follow(SLICES, api.list_objects, api.watch_from, stopped, retry_s=0.0):
        updates.append(update)
        if len(updates) == stop_after:
            stopped.set()
    return updates


def test_follow_lists_then_watches_from_the_last_version_across_requests() -> None:
    api = FakeApi(
        lists=[([obj("a", "1")], "10")],
        watches=[
            [("MODIFIED", obj("a", "11")), ("BOOKMARK", {"metadata": {"resourceVersion": "15"}})],
            [("ADDED", obj("b", "16"))],
        ],
    )
    updates = run(api, stop_after=3)
    assert updates == [
        Listed(SLICES, [obj("a", "1")]),
        Changed(SLICES, "MODIFIED", obj("a", "11")),
        Changed(SLICES, "ADDED", obj("b", "16")),
    ]
    assert api.watched_from == ["10", "15"]


def test_follow_lists_again_when_the_version_is_gone() -> None:
    api = FakeApi(
        lists=[([obj("a", "1")], "10"), ([obj("a", "30")], "31")],
        watches=[[ResourceVersionGone("watching: resourceVersion 10 is gone")], [("DELETED", obj("a", "32"))]],
    )
    updates = run(api, stop_after=3)
    assert updates[1] == Listed(SLICES, [obj("a", "30")])
    assert api.watched_from == ["10", "31"]


def test_follow_watches_again_after_a_dropped_connection() -> None:
    api = FakeApi(
        lists=[([], "10")],
        watches=[[("ADDED", obj("a", "11")), WatchInterrupted("dropped")], [("MODIFIED", obj("a", "12"))]],
    )
    run(api, stop_after=3)
    assert api.watched_from == ["10", "11"]


def test_follow_gives_up_after_too_many_dropped_connections_in_a_row() -> None:
    api = FakeApi(lists=[([], "10")], watches=[[WatchInterrupted("dropped")]] * (MAX_INTERRUPTIONS + 1))
    updates = run(api, stop_after=100)
    assert isinstance(updates[-1], StreamFailed) and "is the API server up?" in updates[-1].message
    assert len(api.watched_from) == MAX_INTERRUPTIONS + 1


def test_follow_ends_with_the_servers_words_when_it_refuses() -> None:
    api = FakeApi(lists=[([], "10")], watches=[[KubeError("watching: forbidden; ask your cluster admin")]])
    assert run(api, stop_after=100)[-1] == StreamFailed(SLICES, "watching: forbidden; ask your cluster admin")


def test_a_watch_of_programs_alone_is_complete_once_they_are_listed() -> None:
    seen = WatchedObjects(kinds=(PROGRAMS,))
    assert not seen.complete
    seen.apply(Listed(PROGRAMS, [obj("p", "1")]))
    assert seen.complete and seen.snapshot() == (("uid-p", "1"),)
