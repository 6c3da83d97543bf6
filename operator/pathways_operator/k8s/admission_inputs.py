"""What an admission pass reads of the cluster, shared by the passes of one moment.

A pass (``AdmissionQueue.admit``) needs every VirtualSlice, every pod of every
namespace (any pod holds CPU and memory on its Node) and every Node. Each queued
slice looks once a second (``core.slice_machine.QUEUED``) and every look runs a
pass, and a deleted slice wakes every queued one at once: reading the cluster
afresh for each pass listed all of it once per queued slice per second. The passes
of one moment share one read instead. It is reused until something a pass reads
changes as far as the operator can tell (:meth:`AdmissionInputs.changed`: its
watches of VirtualSlices, of gang and driver pods and of Nodes report every event,
and a deleted slice is forgotten), and never once it is ``MAX_AGE_S`` old, which
bounds how late a pass sees what no watch reports: a pod of another workload.
A driver placed on its own (``AdmissionQueue.driver_node``) reads the same.

What a stale read can do is bounded. Placements a pass made are counted from the
admission ledger (kept in memory, never read from here) until the pass's read lists
their pods, so a read from before those pods existed frees none of their devices;
a read that still lists pods that are gone keeps their devices counted a moment
longer, which delays an admission and never doubles one.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from pathways_operator.k8s.cluster_api import ClusterApi, Json
from pathways_operator.k8s.gang_pods import PodView
from pathways_operator.k8s.virtual_slice import VirtualSliceObject

MAX_AGE_S = 1.0
"""Longest a read is shared: a queued slice's look interval, so the slices waiting
together share about one read a second, whatever their number."""


@dataclasses.dataclass(frozen=True)
class ClusterRead:
    """One read of what an admission pass decides on."""

    slices: tuple[VirtualSliceObject, ...]
    pods: tuple[PodView, ...]
    nodes: tuple[Json, ...]


class AdmissionInputs:
    """The last read of the cluster, reused until a change is reported or it is too old."""

    def __init__(self, api: ClusterApi, clock: Callable[[], float] = time.monotonic,
                 max_age_s: float = MAX_AGE_S, counted: Callable[[bool], None] = lambda listed: None) -> None:
        self._api = api
        self._clock = clock
        self._max_age_s = max_age_s
        self._counted = counted
        """Told of each read given out: True when it listed the cluster, False when it was reused."""
        self._lock = threading.Lock()
        self._read: ClusterRead | None = None
        self._read_at = 0.0
        self._changes = 0
        """Changes reported so far: a read begun before the last one is not kept."""

    def changed(self) -> None:
        """Something a pass reads changed (or may have): the next pass lists the cluster again."""
        with self._lock:
            self._changes += 1
            self._read = None

    def read(self) -> ClusterRead:
        """The cluster as a pass decides on it: the last read while it is reusable, else a new one."""
        with self._lock:
            if self._read is not None and self._clock() - self._read_at < self._max_age_s:
                self._counted(False)
                return self._read
            changes, read_at = self._changes, self._clock()
        read = ClusterRead(
            slices=tuple(VirtualSliceObject.from_manifest(s) for s in self._api.list_slices()),
            pods=tuple(PodView.from_manifest(p) for p in self._api.list_pods(None)),
            nodes=tuple(self._api.list_nodes()),
        )
        with self._lock:
            if self._changes == changes:  # nothing was reported while it was read: it may be shared
                self._read, self._read_at = read, read_at
        self._counted(True)
        return read
