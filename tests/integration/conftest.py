"""Fixtures for the integration tier: a real embedded cluster, real processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import pathways as pw


@pytest.fixture(scope="module")
def runtime() -> Iterator[pw.Runtime]:
    """One embedded cluster (two islands of 16 devices, 4 per host) per test module."""
    rt = pw.connect(islands={"island-a": 16, "island-b": 16}, devices_per_host=4)
    try:
        yield rt
    finally:
        pw.shutdown()


@pytest.fixture(autouse=True)
def _release_unreachable_slices() -> Iterator[None]:
    """Slices a test no longer references give their devices back when collected."""
    yield
    import gc

    gc.collect()
