"""Slices larger than one host: one JAX multi-process job per slice, real collectives."""

from __future__ import annotations

import time
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways as pw
from tests.integration.two_islands import cross_island_move

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runtime() -> Iterator[pw.Runtime]:
    """The integration tier's cluster, its hosts logging at debug level: some tests here
    read the line each host writes when a call is released (`host_calls.release`)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PATHWAYS_LOG_LEVEL", "DEBUG")
        rt = pw.connect(islands={"island-a": 16, "island-b": 16}, devices_per_host=4)
    try:
        yield rt
    finally:
        pw.shutdown()


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


def test_two_host_slice_returns_small_outputs_whole_or_split_across_its_hosts(runtime: pw.Runtime) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=8)
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    # the sum is replicated (host 0 sends it with its completion); the product stays split
    fn = pw.jit(lambda v: (jnp.sum(v, axis=0), v * 2.0), slice=vslice, in_shardings=P("x"),
                out_shardings=(P(), P("x")))

    @pw.program
    def program(v):  # type: ignore[no-untyped-def]
        return fn(v)

    for i in range(3):
        total, doubled = program(x + i)
        np.testing.assert_allclose(total, (x + i).sum(axis=0))
        np.testing.assert_allclose(doubled, (x + i) * 2.0)


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


def sum_of_squares(v: jax.Array) -> jax.Array:
    return jnp.sum(v * v, axis=0)


def _released_lines(runtime: pw.Runtime, call_id: str) -> list[str]:
    """The release line of the call in the log of each host that ran it, once both wrote it."""
    assert runtime.cluster is not None
    deadline = time.monotonic() + 60
    while True:
        lines = [
            found[-1]
            for path in sorted((runtime.cluster.state_dir / "hosts").glob("*/worker.log"))
            if (found := [ln for ln in path.read_text(errors="replace").splitlines()
                          if f"call {call_id} released:" in ln])
        ]
        if len(lines) >= 2:
            return lines
        if time.monotonic() > deadline:
            raise AssertionError(f"2 hosts did not log the release of call {call_id} in 60 s: {lines}")
        time.sleep(0.1)


def test_two_host_slice_dispatches_a_computation_before_the_one_it_reads_finished(
    runtime: pw.Runtime,
) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=8)
    w = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32) / 32

    def long(v: jax.Array) -> jax.Array:
        # long enough that the next computation is dispatched while this one runs,
        # with a cross-host mean at the end
        v = jax.lax.fori_loop(0, 20, lambda _, a: jnp.tanh(a @ w), v)
        return v - jnp.mean(v, axis=0)

    first = pw.jit(long, slice=vslice, in_shardings=P("x"), out_shardings=P("x"))
    second = pw.jit(sum_of_squares, slice=vslice, in_shardings=P("x"), out_shardings=P())
    other = pw.jit(lambda v: jnp.sum(v, axis=0), slice=vslice, in_shardings=P("x"), out_shardings=P())

    @pw.program
    def chained(v):  # type: ignore[no-untyped-def]
        return second(first(v))

    @pw.program
    def independent(v):  # type: ignore[no-untyped-def]
        return first(v), other(v)

    x = np.random.default_rng(1).standard_normal((2048, 512)).astype(np.float32)
    chained(x).block_until_ready()  # compiles both
    out = chained(x)
    want = np.asarray(jax.jit(lambda v: sum_of_squares(long(v)))(x))
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-4)
    for line in _released_lines(runtime, out.call.call_id):
        assert "2 computations" in line and "1 dispatched while the one before still ran" in line, line

    _, b = independent(x)
    np.testing.assert_allclose(np.asarray(b), x.sum(axis=0), rtol=1e-4, atol=1e-3)
    for line in _released_lines(runtime, b.call.call_id):
        assert "2 computations" in line and "0 dispatched while the one before still ran" in line, line



def test_two_host_slice_runs_a_long_chain_of_collective_computations(runtime: pw.Runtime) -> None:
    # each computation reads the one before, so the hosts dispatch it while that one
    # may still run (at most 2 in flight: host_state.IN_FLIGHT_LIMIT)
    vslice = pw.make_virtual_device_set().add_slice(devices=8)

    def center(v: jax.Array) -> jax.Array:
        return jnp.tanh(v) - jnp.mean(v, axis=0)

    step = pw.jit(center, slice=vslice, in_shardings=P("x"), out_shardings=P("x"))

    @pw.program
    def chain(v):  # type: ignore[no-untyped-def]
        for _ in range(40):
            v = step(v)
        return v

    x = np.random.default_rng(2).standard_normal((64, 16)).astype(np.float32)
    want = x
    for _ in range(40):
        want = np.asarray(center(jnp.asarray(want)))
    np.testing.assert_allclose(np.asarray(chain(x)), want, rtol=1e-5, atol=1e-5)
