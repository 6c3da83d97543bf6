"""Faults on the embedded runtime, repeated: a hung host is named, killed hosts are survived.

* A host whose worker is frozen (SIGSTOP) does not hang its caller: the call times out
  with an error naming that host (the controller knows which hosts have not reported
  each outstanding grant), and once the host thaws the slice serves again.
* A loop of fault injections on a 2-host slice running a step-by-step "training" loop:
  each injection SIGKILLs the worker or the sidecar of one host (alternating) at a random
  moment inside a step. The step fails, the gang is relaunched, and the step is retried
  until it succeeds; recovery time is from the kill to the next successful step. Each
  step's result is recorded exactly once and the final state equals a fault-free run.
  ``PATHWAYS_FAULT_LOOPS`` injections (3 in ``make test``, 20 in ``make fault-loop``);
  the median and max recovery times are printed.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways as pw
import pathways.runtime as pw_runtime
from tests.integration.host_pids import host_pid, process_state

LOOPS = int(os.environ.get("PATHWAYS_FAULT_LOOPS", "3"))
RECOVERY_LIMIT_S = 90.0

pytestmark = pytest.mark.timeout(120 + 60 * LOOPS)


def _stopped_within(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process_state(pid) == "T":
            return True
        time.sleep(0.01)
    return False


def test_a_hung_host_times_out_naming_it(runtime: pw.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=4)
    double = pw.jit(lambda v: v * 2.0, slice=vslice)

    @pw.program(name="frozen")
    def frozen(v):  # type: ignore[no-untyped-def]
        return double(v)

    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(frozen(x), x * 2.0)
    info = runtime.bind(vslice.decl())
    host = info.hosts[0]
    worker = host_pid(runtime, info, 0, "worker")
    assert worker is not None, f"no worker PID recorded for {info.name}/host-0"
    monkeypatch.setattr(pw_runtime, "CALL_TIMEOUT_S", 4.0)
    os.kill(worker, signal.SIGSTOP)
    try:
        assert _stopped_within(worker, 10.0), f"worker {worker} not stopped: state {process_state(worker)}"
        got = frozen(x)  # written: the host's silence shows where the value is first used
        try:
            value = np.asarray(got)
        except pw.ExecutionError as err:
            text = str(err)
        else:
            pytest.fail(f"the call returned {value} while worker {worker} of "
                        f"{info.name}/host-0 was stopped (state {process_state(worker)} after the call)")
    finally:
        os.kill(worker, signal.SIGCONT)
    assert "did not finish within 4 s" in text and f"host {info.name}/host-0" in text, text
    assert host.address in text, text
    monkeypatch.setattr(pw_runtime, "CALL_TIMEOUT_S", 120.0)
    np.testing.assert_allclose(frozen(x + 1), (x + 1) * 2.0)


def test_repeated_host_kills_recover_each_step_recorded_once(runtime: pw.Runtime) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=8)

    def step_fn(w: jax.Array) -> jax.Array:
        def body(_: int, m: jax.Array) -> jax.Array:
            stepped: jax.Array = m + jnp.tanh(m) * 1e-3
            return stepped

        out: jax.Array = jax.lax.fori_loop(0, 3000, body, w) * 0.5 + 1.0
        return out

    step = pw.jit(step_fn, slice=vslice, in_shardings=P("x"), out_shardings=P("x"))

    @pw.program(name="trainer")
    def train_step(w):  # type: ignore[no-untyped-def]
        return step(w)

    w0 = np.linspace(0.0, 1.0, 64 * 8, dtype=np.float32).reshape(64, 8)
    rng = random.Random(7)
    recorded: list[int] = []
    recoveries: list[float] = []
    pending: list[float] = []  # when the kill not yet recovered from landed
    kills = 0
    failures_seen = 0
    w = w0

    def inject(role: str) -> None:
        time.sleep(rng.uniform(0.0, 0.2))
        deadline = time.monotonic() + RECOVERY_LIMIT_S
        while time.monotonic() < deadline:
            found = [s for s in runtime.describe().slices if s.name == vslice.name]
            pid = host_pid(runtime, found[0], 1, role) if found and len(found[0].hosts) == 2 else None
            if pid is not None:
                pending.append(time.monotonic())
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.1)

    i = 0
    killer: threading.Thread | None = None
    step_deadline = time.monotonic() + RECOVERY_LIMIT_S
    while kills < LOOPS or killer is not None or i < 2:
        if killer is None and i % 2 == 1 and kills < LOOPS:
            killer = threading.Thread(target=inject, args=("worker" if kills % 2 == 0 else "dataflow",))
            kills += 1
            killer.start()
        began = time.monotonic()
        try:
            out = np.asarray(train_step(w))
        except pw.PathwaysError as err:
            failures_seen += 1
            assert kills, f"step {i} failed with no fault injected: {err}"
            assert time.monotonic() < step_deadline, (
                f"step {i} did not recover within {RECOVERY_LIMIT_S:.0f} s: {err}"
            )
            time.sleep(0.2)
            continue
        if pending and began > pending[0]:
            recoveries.append(time.monotonic() - pending.pop())
        recorded.append(i)
        w, i = out, i + 1
        step_deadline = time.monotonic() + RECOVERY_LIMIT_S
        if killer is not None and not killer.is_alive() and not pending:
            killer.join()
            killer = None
    expected = w0
    for _ in range(i):
        expected = np.asarray(jax.jit(step_fn)(expected))
    assert recorded == list(range(i)), "each step recorded exactly once, in order"
    np.testing.assert_allclose(w, expected, rtol=1e-5)
    assert len(recoveries) == LOOPS, f"only {len(recoveries)} of {LOOPS} kills landed"
    print(
        f"\nfault loop: {LOOPS} host kills ({failures_seen} failed attempts), recovery "
        f"median {statistics.median(recoveries):.2f} s, max {max(recoveries):.2f} s"
    )
