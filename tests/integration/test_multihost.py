"""Slices larger than one host: one JAX multi-process job per slice, real collectives."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways as pw
from tests.integration.two_islands import cross_island_move

pytestmark = pytest.mark.timeout(300)


def test_two_host_slice_psum_and_all_gather(runtime: pw.Runtime) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=8)
    x = np.arange(16, dtype=np.float32).reshape(8, 2)

    def stats(v: jax.Array) -> tuple[jax.Array, jax.Array]:
        # a sum over the sharded axis is a cross-host psum; replicating the
        # sharded input is an all-gather across both hosts
        return jnp.sum(v, axis=0), v * 1.0

    fn = pw.jit(stats, slice=vslice, in_shardings=P("x"), out_shardings=(P(), P()))

    @pw.program
    def program(v):  # type: ignore[no-untyped-def]
        return fn(v)

    total, gathered = program(x)
    np.testing.assert_allclose(total, x.sum(axis=0))
    np.testing.assert_allclose(gathered, x)
    hosts = {h.address for s in runtime.describe().slices for h in s.hosts if s.devices == 8}
    assert len(hosts) == 2, f"an 8-device slice on 4-device hosts must span 2 hosts, got {hosts}"


def test_pmap_psum_across_two_hosts(runtime: pw.Runtime) -> None:
    devices = pw.make_virtual_device_set().add_slice(devices=8).devices
    norm = pw.pmap(lambda v: v / jax.lax.psum(v, "d"), devices=devices, axis_name="d")
    out = norm(np.arange(1, 9, dtype=np.float32))
    np.testing.assert_allclose(out, np.arange(1, 9) / 36.0, rtol=1e-6)


def test_cross_island_transfer(runtime: pw.Runtime) -> None:
    left, right, move = cross_island_move(8, 4)

    x = np.arange(64, dtype=np.float32).reshape(16, 4)
    np.testing.assert_allclose(move(x), x * 3.0 + 1.0)
    islands = {s.name: s.island for s in runtime.describe().slices}
    assert islands[left.name] == "island-a" and islands[right.name] == "island-b"
