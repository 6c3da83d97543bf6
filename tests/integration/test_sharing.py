"""Several client processes share one multi-host slice; collectives never deadlock.

Each client runs a program with a cross-host psum on the same named slice, many
times, concurrently. The island scheduler numbers every computation and every
host runs them in that order, so both hosts of the slice always enter the same
collective together.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from pathways_wire.driver_protocol import CLIENT_TOKEN_FILE, ENV_PROGRAM_TOKEN_FILE
from pathways.embedded import LocalCluster

pytestmark = pytest.mark.timeout(300)

CLIENT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    import pathways as pw

    weight, calls, scale = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    shared = pw.make_virtual_device_set().add_slice(devices=8, name="shared")
    step = pw.jit(lambda v: jnp.sum(v * scale, axis=0) + 0 * v[0], slice=shared,
                  in_shardings=P("x"), out_shardings=P())
    twice = pw.jit(lambda s: s * 2.0, slice=shared, out_shardings=P())

    @pw.program(weight=weight)
    def prog(v):
        return twice(step(v))

    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    expected = (x * scale).sum(axis=0) * 2.0
    for i in range(calls):
        out = prog(x + i)
        want = ((x + i) * scale).sum(axis=0) * 2.0
        assert np.allclose(out, want), (i, out, want)
    print("OK", calls)
    """
)


def test_two_clients_share_a_slice_with_collectives(one_island: LocalCluster, tmp_path: object) -> None:
    env = dict(os.environ, PATHWAYS_CONTROLLER=one_island.address)
    env[ENV_PROGRAM_TOKEN_FILE] = str(one_island.state_dir / CLIENT_TOKEN_FILE)  # clients present it
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, weight, "25", scale],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        for weight, scale in (("1", "1.0"), ("3", "-0.5"))
    ]
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("clients sharing a slice did not finish in 240 s (deadlock?)")
        outputs.append(out.decode(errors="replace"))
        assert proc.returncode == 0, outputs[-1][-3000:]
    assert all("OK 25" in o for o in outputs)
