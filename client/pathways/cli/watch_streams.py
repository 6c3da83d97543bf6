"""Following VirtualSlices and PathwaysPrograms with Kubernetes watch streams.

Each kind gets one thread running :func:`follow`: list, then watch from the list's
resourceVersion in requests of at most ``window_s`` seconds (the server ends each
one; the next starts from the last version seen, bookmarks included). A version
the server no longer keeps (HTTP 410 Gone) means listing again; a dropped
connection means watching again after ``retry_s``, at most ``MAX_INTERRUPTIONS``
times in a row; anything else (no access, no CRDs) ends the stream with a
:class:`~pathways.cli.watch_state.StreamFailed` saying so. The threads put updates on
one queue, which :class:`ObjectStreams` hands to the command in batches.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

from pathways.cli.errors import CliError
from pathways.cli.watch_state import (
    WATCHED,
    Changed,
    EventType,
    Listed,
    Manifest,
    Plural,
    StreamFailed,
    Update,
    WatchedObjects,
    resume_version,
)
from pathways.kube import Kube, KubeError, ResourceVersionGone, WatchInterrupted

WINDOW_S = 60
"""Longest single watch request; the server closes it and the stream resumes."""
MAX_INTERRUPTIONS = 5
"""Dropped connections in a row (no event between them) before the stream gives up."""

ListFn = Callable[[], tuple[list[Manifest], str]]
WatchFn = Callable[[str], Iterable[tuple[str, Manifest]]]


def follow(
    plural: Plural, list_objects: ListFn, watch_from: WatchFn, stopped: threading.Event, retry_s: float
) -> Iterator[Update]:
    """Updates for one kind until ``stopped`` is set or the stream fails (its last update)."""
    version: str | None = None
    interruptions = 0
    while not stopped.is_set():
        try:
            if version is None:
                items, version = list_objects()
                yield Listed(plural, items)
            for event_type, obj in watch_from(version):
                interruptions = 0
                version = resume_version(version, event_type, obj)
                if event_type in ("ADDED", "MODIFIED", "DELETED"):
                    kind: EventType = event_type  # type: ignore[assignment]
                    yield Changed(plural, kind, obj)
                if stopped.is_set():
                    return
        except ResourceVersionGone:
            version = None
        except WatchInterrupted as err:
            interruptions += 1
            if interruptions > MAX_INTERRUPTIONS:
                yield StreamFailed(plural, f"{err} ({MAX_INTERRUPTIONS} times in a row); is the API server up?")
                return
            stopped.wait(retry_s)
        except KubeError as err:
            yield StreamFailed(plural, str(err))
            return


class ObjectStreams:
    """``kinds`` of one namespace (None: all; ``name``'s only, when given), each followed on
    its own thread until :meth:`close`."""

    def __init__(
        self, kube: Kube, namespace: str | None, *, retry_s: float, kinds: tuple[Plural, ...] = WATCHED,
        name: str | None = None, window_s: int = WINDOW_S,
    ) -> None:  # fmt: skip
        self._kube = kube
        self._namespace = namespace
        self._kinds = kinds
        self._name = name
        self._retry_s = retry_s
        self._window_s = window_s
        self._updates: queue.Queue[Update] = queue.Queue()
        self._stopped = threading.Event()
        self._watchers: list[Any] = []
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> ObjectStreams:
        for plural in self._kinds:
            thread = threading.Thread(target=self._run, args=(plural,), name=f"watch-{plural}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stops both streams: their open requests are cut, not waited for."""
        self._stopped.set()
        for watcher in list(self._watchers):
            watcher.stop()
        for thread in self._threads:
            thread.join(timeout=self._retry_s + 1.0)

    def next_batch(self, timeout_s: float | None) -> list[Update]:
        """The updates that have arrived, waiting up to ``timeout_s`` (None: no limit) for the first."""
        try:
            batch = [self._updates.get(timeout=timeout_s)]
        except queue.Empty:
            return []
        while True:
            try:
                batch.append(self._updates.get_nowait())
            except queue.Empty:
                return batch

    def catch_up(self, seen: WatchedObjects, deadline: float | None) -> None:
        """Applies to ``seen`` the updates that arrive before ``deadline`` (``time.monotonic``;
        None: waits for the first); a stream that failed raises :class:`CliError` with its words."""
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        for update in self.next_batch(left):
            if isinstance(update, StreamFailed):
                raise CliError(update.message)
            seen.apply(update)

    def _run(self, plural: Plural) -> None:
        from kubernetes import watch

        def list_objects() -> tuple[list[Manifest], str]:
            return self._kube.list_custom(plural, self._namespace, self._name)

        def watch_from(version: str) -> Iterator[tuple[str, Manifest]]:
            watcher = watch.Watch()  # type: ignore[no-untyped-call]
            self._watchers.append(watcher)
            try:
                yield from self._kube.watch_custom(
                    plural, self._namespace, version, self._window_s, watcher, self._name
                )
            finally:
                self._watchers.remove(watcher)

        try:
            for update in follow(plural, list_objects, watch_from, self._stopped, self._retry_s):
                self._updates.put(update)
        except Exception as err:  # the command must hear of it rather than wait for updates forever
            self._updates.put(StreamFailed(plural, f"following {plural}: {type(err).__name__}: {err}"))
