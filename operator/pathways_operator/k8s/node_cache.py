"""The Nodes a running gang is bound to, as the operator's watch of Nodes last saw them.

Every look of a slice whose pods are bound asks whether their Nodes still exist and
still report (``SliceReconciler._lost_nodes``): a Ready slice is looked at every few
seconds, and reading every Node of the cluster for it each time made the operator
LIST all Nodes that often per slice. Here kopf's watch of Nodes keeps what it saw
(:meth:`NodeCache.seen`, :meth:`NodeCache.gone`), and a look reads a Node from the
API by name only when the cache has not seen it, or saw it more than ``MAX_AGE_S``
ago: a watch that reconnects lists the Nodes again but reports no deletion it
missed meanwhile, so no entry is trusted for longer than that. A Node the API says
is gone is forgotten, and the look that asked finds its pods' Node missing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pathways_operator.k8s.cluster_api import ClusterApi, Json
from pathways_operator.k8s.inventory import admission_view

MAX_AGE_S = 30.0
"""Longest a Node seen by the watch is trusted before it is read again by name."""


class NodeCache:
    """Nodes by name, fed by a watch, read by name from the API when missing or old."""

    def __init__(self, api: ClusterApi, clock: Callable[[], float] = time.monotonic,
                 max_age_s: float = MAX_AGE_S) -> None:
        self._api = api
        self._clock = clock
        self._max_age_s = max_age_s
        self._nodes: dict[str, tuple[float, Json]] = {}
        """Name -> when it was seen or read, and the Node."""
        self._deleted: dict[str, float] = {}
        """Name -> when the watch saw it deleted, until it is seen again."""
        self._lock = threading.Lock()

    def seen(self, node: Json) -> bool:
        """The watch saw ``node`` (listed, added or changed); whether what admission reads
        of it (``inventory.admission_view``) differs from the Node held before, or none was."""
        name = str((node.get("metadata") or {}).get("name") or "")
        if not name:
            return False
        with self._lock:
            held = self._nodes.get(name)
            self._nodes[name] = (self._clock(), node)
            self._deleted.pop(name, None)
        return held is None or admission_view(held[1]) != admission_view(node)

    def gone(self, name: str) -> None:
        """The watch saw the Node ``name`` deleted."""
        now = self._clock()
        with self._lock:
            self._nodes.pop(name, None)
            for old in [n for n, at in self._deleted.items() if now - at > self._max_age_s]:
                del self._deleted[old]  # no read in flight began that long ago
            self._deleted[name] = now

    def get(self, name: str) -> Json | None:
        """The Node ``name``, or None when it does not exist."""
        with self._lock:
            entry = self._nodes.get(name)
        if entry is not None and self._clock() - entry[0] <= self._max_age_s:
            return entry[1]
        read_at = self._clock()
        node = self._api.get_node(name)
        with self._lock:
            newer = self._nodes.get(name)
            if newer is not None and newer[0] > read_at:
                return newer[1]  # the watch saw it after this read began: its view is newer
            if self._deleted.get(name, -1.0) > read_at:
                return None  # the watch saw it deleted after this read began
            if node is None:
                self._nodes.pop(name, None)
            else:
                self._nodes[name] = (read_at, node)
        return node
