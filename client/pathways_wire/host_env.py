"""The environment a host's containers are started with: the operator's pod spec and the
embedded runtime set these variables, and ``pathways_worker.settings`` reads them.

Each name is declared once here, so the side that writes a variable and the side that
reads it cannot drift apart. The slice token's variables are in :mod:`pathways_wire.slice_token`.
"""

from __future__ import annotations

SHM_DIR = "PATHWAYS_SHM_DIR"
"""Where the host's shared-memory segments live (both containers mount it)."""

HOST_NAME = "PATHWAYS_HOST_NAME"
"""The host's name in logs, errors and metrics."""

SLICE = "PATHWAYS_SLICE"
"""The VirtualSlice the host belongs to."""

NAMESPACE = "PATHWAYS_NAMESPACE"
"""The slice's namespace."""

WORKER_LISTEN = "PATHWAYS_WORKER_LISTEN"
"""Worker: the address its executor service binds."""

HOST_INDEX = "PATHWAYS_HOST_INDEX"
"""Worker: the host's index in the gang (its jax.distributed process id)."""

NUM_HOSTS = "PATHWAYS_NUM_HOSTS"
"""Worker: hosts in the gang."""

COORDINATOR = "PATHWAYS_COORDINATOR"
"""Worker: host 0's jax.distributed coordinator address."""

DEVICES = "PATHWAYS_DEVICES"
"""Worker: devices on this host."""

SIDECAR_LISTEN = "PATHWAYS_SIDECAR_LISTEN"
"""Sidecar: the address its dataflow service binds."""

WORKER_ADDRESS = "PATHWAYS_WORKER_ADDRESS"
"""Sidecar: its worker's executor address."""

SIDECAR_METRICS_PORT = "PATHWAYS_SIDECAR_METRICS_PORT"
"""Sidecar: the port of its Prometheus /metrics."""
