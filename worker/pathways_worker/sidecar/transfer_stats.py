"""Bytes of values a host's sidecar moved, by direction and path.

Every transfer path counts into one :class:`TransferStats`; the sidecar's Prometheus
exposition (``sidecar_metrics``, only where ``--metrics-port`` is given) reads it at
each scrape. Kept apart from that module so a sidecar that serves no metrics does not
import ``prometheus_client`` as its host starts.
"""

from __future__ import annotations

import threading
from typing import Literal

Direction = Literal["in", "out"]
TransferPath = Literal["grpc", "data-channel", "handover"]
DIRECTIONS: tuple[Direction, ...] = ("in", "out")
PATHS: tuple[TransferPath, ...] = ("grpc", "data-channel", "handover")


class TransferStats:
    """Bytes moved by direction and path; thread-safe, cheap enough for every piece."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = {(d, p): 0 for d in DIRECTIONS for p in PATHS}

    def add(self, direction: Direction, path: TransferPath, nbytes: int) -> None:
        with self._lock:
            self._bytes[(direction, path)] += nbytes

    def snapshot(self) -> dict[tuple[Direction, TransferPath], int]:
        with self._lock:
            return dict(self._bytes)
