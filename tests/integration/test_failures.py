"""Bad input and faults: clear errors, nothing hangs, the runtime recovers."""

from __future__ import annotations

import os
import signal
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways as pw
from tests.integration.broken_programs import first_computation_corrupt
from tests.integration.host_pids import host_pid

pytestmark = pytest.mark.timeout(300)


def test_slice_larger_than_any_island(runtime: pw.Runtime) -> None:
    big = pw.make_virtual_device_set().add_slice(devices=64)
    fn = pw.pmap(lambda x: x, devices=big.devices)
    with pytest.raises(pw.PlacementError) as info:
        fn(np.zeros(64, np.float32))
    text = str(info.value)
    assert "64" in text and "16" in text, text


def test_computation_failing_on_a_worker_names_program_computation_and_host(
    runtime: pw.Runtime,
) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=4)
    good = pw.jit(lambda x: x + 1.0, slice=vslice)
    after = pw.jit(lambda x: x * 2.0, slice=vslice)

    @pw.program(name="broken")
    def broken(x):  # type: ignore[no-untyped-def]
        return after(good(x))

    program, first = first_computation_corrupt(broken.trace(np.ones(4, np.float32)).ir)
    (out,) = runtime.run(program, [np.ones(4, np.float32)])  # written: the failure shows at first use
    with pytest.raises(pw.ExecutionError) as info:
        np.asarray(out)
    text = str(info.value)
    assert "broken" in text, text
    assert first.name in text, text
    assert "host-0" in text, text
    # the runtime still works afterwards
    np.testing.assert_allclose(broken(np.ones(4, np.float32)), [4.0] * 4)


def test_host_killed_mid_call_fails_fast_and_slice_relaunches(runtime: pw.Runtime) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=8)

    def slow(x: jax.Array) -> jax.Array:
        def body(_: int, m: jax.Array) -> jax.Array:
            stepped: jax.Array = jnp.tanh(m @ m.T) / 64.0 + m
            return stepped

        out: jax.Array = jax.lax.fori_loop(0, 4000, body, x)
        return out

    fn = pw.jit(slow, slice=vslice, in_shardings=P("x"), out_shardings=P("x"))

    @pw.program(name="long")
    def long(x):  # type: ignore[no-untyped-def]
        return fn(x)

    x = np.eye(256, dtype=np.float32)[:, :256]
    info = [s for s in runtime.describe().slices]
    before = {s.slice_id for s in info}
    errors: list[BaseException] = []

    def call() -> None:
        try:
            np.asarray(long(x))  # the call's error surfaces where its output is first used
        except BaseException as err:  # noqa: BLE001 - recorded for the assertion
            errors.append(err)

    calls_before = runtime.calls
    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 120
    victim: int | None = None
    while time.monotonic() < deadline and (victim is None or runtime.calls == calls_before):
        slices = [s for s in runtime.describe().slices if s.slice_id not in before and s.devices == 8]
        if slices and len(slices[0].hosts) == 2:
            victim = host_pid(runtime, slices[0], 1, "worker")
        time.sleep(0.2)
    assert victim is not None, "the 2-host slice never came up"
    assert runtime.calls > calls_before, "the controller never accepted the call"
    os.kill(victim, signal.SIGKILL)
    caller.join(timeout=90)  # a hang guard
    assert not caller.is_alive(), "the call did not fail within 90 s of its host dying"
    assert errors and isinstance(errors[0], pw.PathwaysError), errors
    assert "host-1" in str(errors[0]), str(errors[0])
    # the slice is relaunched and the program runs again
    small = np.eye(256, dtype=np.float32)
    fast = pw.jit(lambda v: v * 2.0, slice=vslice, in_shardings=P("x"), out_shardings=P("x"))
    np.testing.assert_allclose(pw.program(lambda v: fast(v))(small), small * 2.0)
