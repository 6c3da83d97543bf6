"""The pods bound to one Node, listed and then watched, as the node agent sees them.

The agent is a stand-in for the kubelet, not a kubelet; like one, it learns of its
pods from a list+watch on ``spec.nodeName=<node>``. The list gives the full set
(``PodEvents.sync``: pods missing from it have vanished) and a ``resourceVersion``;
``kubernetes.watch.Watch`` then streams what changed after it. Each watch request lasts
at most ``WATCH_SECONDS`` on the server (plus a client-side read timeout), then resumes
from the last ``resourceVersion`` seen, bookmarks included, so nothing is re-listed
while the stream stays current. A ``410 Gone`` (the version was compacted away) or any
other error starts over with a fresh list, after a bounded back-off for errors, which is
how the agent rides out an API server restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from kubernetes import watch

from pathways_devcluster.node_agent.api import KubeApi
from pathways_devcluster.node_agent.pod_env import Pod

log = logging.getLogger(__name__)

WATCH_SECONDS = 30
"""How long one watch request lasts on the server before it is resumed."""
GONE = 410
MAX_BACKOFF_SECONDS = 5.0


class PodEvents(Protocol):
    """What the agent does with what the watch sees."""

    def sync(self, node: str, pods: Sequence[Pod]) -> None: ...

    def handle(self, pod: Pod) -> None: ...

    def handle_deleted(self, pod: Pod) -> None: ...


class PodWatch:
    """List+watch of the pods on ``node``, until ``stop`` is set."""

    def __init__(
        self, api: KubeApi, node: str, events: PodEvents, stop: threading.Event
    ) -> None:
        self.api = api
        self.node = node
        self.events = events
        self.stop = stop
        self._selector = f"spec.nodeName={node}"
        # return_type "object": events carry the pods as dicts, not models
        self._watch = watch.Watch(return_type="object")  # type: ignore[no-untyped-call]

    def run(self) -> None:
        version: str | None = None
        backoff = 0.5
        while not self.stop.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._follow(version)
                backoff = 0.5
            except Exception as e:  # noqa: BLE001 - re-list, after a bounded backoff on errors
                if self.stop.is_set():
                    return
                version = None
                if getattr(e, "status", None) == GONE:
                    log.info("watch of pods on %s expired (%s): re-listing", self.node, e)
                    continue
                log.warning(
                    "watch of pods on %s failed (re-listing in %.1f s): %s", self.node, backoff, e
                )
                self.stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    def _list(self) -> str:
        core = self.api.core
        listing = self.api.call(core.list_pod_for_all_namespaces, field_selector=self._selector)
        self.events.sync(self.node, listing["items"])
        return str(listing["metadata"]["resourceVersion"])

    def _follow(self, version: str) -> str:
        """One watch request from ``version``; returns the last version it saw."""
        stream = self._watch.stream(  # type: ignore[no-untyped-call]
            self.api.core.list_pod_for_all_namespaces,
            field_selector=self._selector,
            resource_version=version,
            timeout_seconds=WATCH_SECONDS,
            allow_watch_bookmarks=True,
            _request_timeout=(5.0, WATCH_SECONDS + 15.0),
        )
        try:
            for event in stream:
                if self.stop.is_set():
                    break
                version = self._dispatch(event) or version
        finally:
            stream.close()
        return version

    def _dispatch(self, event: dict[str, Any]) -> str | None:
        kind, pod = event.get("type"), event.get("raw_object") or {}
        if kind in ("ADDED", "MODIFIED"):
            self.events.handle(pod)
        elif kind == "DELETED":
            self.events.handle_deleted(pod)
        version = (pod.get("metadata") or {}).get("resourceVersion")
        return str(version) if version else None
