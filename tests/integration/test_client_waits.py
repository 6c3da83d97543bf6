"""A client at its bound of outstanding calls leaves the controller free for the others.

Each call a client has outstanding keeps a `WaitCall` open in the controller until the
call ends, and each holds one of the controller's server threads meanwhile
(`controller.service.SERVER_THREADS`). Client A queues its bound of 32 slow calls on
its slice; client B, on a slice of its own, then makes one small call. B's call must
end while A's first is still running: with no thread left for B's `Run` and `WaitCall`,
B would wait until A's calls began to end.

Both clients append what happens to one file (one line per write, appended), which
gives the order of events across the two processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pathways.embedded import LocalCluster
from pathways_wire.driver_protocol import CLIENT_TOKEN_FILE, ENV_PROGRAM_TOKEN_FILE

pytestmark = pytest.mark.timeout(300)

OUTSTANDING = 32
"""The client's bound (`PATHWAYS_MAX_OUTSTANDING_CALLS`'s default)."""

PRELUDE = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import jax, jax.numpy as jnp
    import pathways as pw

    log = sys.argv[1]

    def say(line):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, (line + "\\n").encode())
        os.close(fd)

    def seen(line, limit_s=240.0):
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            if line in open(log).read().splitlines():
                return
            time.sleep(0.02)
        raise SystemExit(f"no {line!r} in {log} within {limit_s} s")
    """
)

CLIENT_A = PRELUDE + textwrap.dedent(
    """
    calls = int(sys.argv[2])
    vslice = pw.make_virtual_device_set().add_slice(devices=1, name="slow")
    slow = pw.jit(lambda v: jax.lax.fori_loop(0, 3000, lambda i, w: jnp.tanh(w @ w), v), slice=vslice)

    @pw.program(name="slow")
    def prog(v):
        return slow(v)

    x = np.eye(256, dtype=np.float32) * 0.5
    prog(x).block_until_ready()  # placed and compiled
    seen("B ready")
    outs = [prog(x) for _ in range(calls)]
    say(f"A issued {calls}")
    for i, out in enumerate(outs):
        out.block_until_ready()
        say(f"A ended {i}")
    """
)

CLIENT_B = PRELUDE + textwrap.dedent(
    """
    vslice = pw.make_virtual_device_set().add_slice(devices=1, name="quick")
    add = pw.jit(lambda v: v + 1.0, slice=vslice)

    @pw.program(name="quick")
    def prog(v):
        return add(v)

    prog(np.zeros(4, np.float32)).block_until_ready()  # placed and compiled
    say("B ready")
    seen(sys.argv[2])
    assert np.asarray(prog(np.zeros(4, np.float32))).tolist() == [1.0] * 4
    say("B done")
    """
)


def test_a_client_at_its_bound_of_outstanding_calls_leaves_room_for_another_clients_call(
    one_island: LocalCluster, tmp_path: Path
) -> None:
    log = tmp_path / "events"
    log.touch()
    env = dict(os.environ, PATHWAYS_CONTROLLER=one_island.address)
    env[ENV_PROGRAM_TOKEN_FILE] = str(one_island.state_dir / CLIENT_TOKEN_FILE)
    a = subprocess.Popen([sys.executable, "-c", CLIENT_A, str(log), str(OUTSTANDING)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    b = subprocess.Popen([sys.executable, "-c", CLIENT_B, str(log), f"A issued {OUTSTANDING}"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        b_out, _ = b.communicate(timeout=270)
        assert b.returncode == 0, b_out.decode(errors="replace")[-3000:]
    finally:
        a.kill()
        a_out, _ = a.communicate(timeout=30)
    events = log.read_text().splitlines()
    assert f"A issued {OUTSTANDING}" in events, a_out.decode(errors="replace")[-3000:]
    b_done = events.index("B done")
    assert "A ended 0" not in events[:b_done], (
        f"B's call waited for A's calls to end: {events}"
    )
