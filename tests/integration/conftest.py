"""Fixtures for the integration tier: a real embedded cluster, real processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import pathways as pw
from pathways.embedded import LocalCluster, start_local_cluster


@pytest.fixture(scope="module")
def runtime() -> Iterator[pw.Runtime]:
    """One embedded cluster (two islands of 16 devices, 4 per host) per test module."""
    rt = pw.connect(islands={"island-a": 16, "island-b": 16}, devices_per_host=4)
    try:
        yield rt
    finally:
        pw.shutdown()


@pytest.fixture(scope="module")
def one_island() -> Iterator[LocalCluster]:
    """An embedded cluster (one island of 8 devices, 4 per host) for client processes of
    the test's own, which reach it by its address and client token, per test module."""
    c = start_local_cluster(islands={"island-a": 8}, devices_per_host=4)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(autouse=True)
def _release_unreachable_slices() -> Iterator[None]:
    """Slices a test no longer references give their devices back when collected."""
    yield
    import gc

    gc.collect()
