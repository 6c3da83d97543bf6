"""``pathways run prog.py`` and ``PATHWAYS_LOCAL_ISLANDS``: the embedded runtime from the shell.

Each test runs a fresh process, as a user would, so the embedded cluster it starts is
configured only by the command line and the environment: ``pathways run`` traces the
file's ``program`` and calls it on a local cluster that goes away with the command, and
``PATHWAYS_LOCAL_ISLANDS`` / ``PATHWAYS_DEVICES_PER_HOST`` shape that cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pathways_devcluster.controlplane import REPO_ROOT
from tests.cluster.program_files import double_inc_program, example_module

pytestmark = pytest.mark.timeout(300)

PATHWAYS = Path(sys.executable).parent / "pathways"
COMMAND_TIMEOUT_S = 240
BIG_ELEMENTS = 100_000
"""float32 elements of an output too large to come back inline (`runtime.INLINE_BYTES`)."""


def _env(**variables: str) -> dict[str, str]:
    """This environment without a controller or islands of its own, plus ``variables``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PATHWAYS_CONTROLLER", "PATHWAYS_LOCAL_ISLANDS", "PATHWAYS_DEVICES_PER_HOST")}
    return {**env, **variables}


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)


def test_pathways_run_calls_the_program_on_the_embedded_runtime(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(double_inc_program())
    done = _run([str(PATHWAYS), "run", str(prog), "--steps", "2", "-o", "json"], _env(), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == [3.0, 5.0]
    assert "running 'double-inc' on the embedded local runtime (2 steps)" in done.stderr
    assert "step 2/2 done" in done.stderr


def test_pathways_run_prints_an_output_too_large_to_come_back_inline(tmp_path: Path) -> None:
    """The output stays on its hosts until it is fetched: before the runtime shuts down."""
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(
        f"""
        import numpy as np
        import pathways as pw

        pool = pw.make_virtual_device_set().add_slice(devices=2)
        double = pw.jit(lambda x: x * 2.0, slice=pool)

        @pw.program(name="double-big")
        def program(v):
            return double(v)

        def example_args():
            return (np.arange({BIG_ELEMENTS}, dtype=np.float32),)
        """
    ))
    done = _run([str(PATHWAYS), "run", str(prog), "-o", "json"], _env(), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_array_equal(json.loads(done.stdout), np.arange(BIG_ELEMENTS, dtype=np.float32) * 2.0)


def test_pathways_run_feeds_each_steps_weights_into_the_next(tmp_path: Path) -> None:
    example = REPO_ROOT / "examples" / "train_program.py"
    done = _run([str(PATHWAYS), "run", str(example), "--steps", "20", "-o", "json"], _env(), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    weights, loss = json.loads(done.stdout)
    want_weights, want_loss = example_module(example).reference(20)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-4, atol=1e-5)
    assert loss == pytest.approx(want_loss, rel=1e-3)


def test_pathways_run_of_a_program_that_fits_no_island_names_the_islands(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(double_inc_program())
    env = _env(PATHWAYS_LOCAL_ISLANDS="tiny:1", PATHWAYS_DEVICES_PER_HOST="1")
    done = _run([str(PATHWAYS), "run", str(prog)], env, tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "tiny" in done.stderr and "2 devices" in done.stderr, done.stderr[-3000:]


ISLANDS_FROM_THE_ENVIRONMENT = textwrap.dedent(
    """
    import json
    import numpy as np
    import pathways as pw

    runtime = pw.connect()
    pool = pw.make_virtual_device_set().add_slice(devices=6)
    double = pw.pmap(lambda x: x * 2.0, devices=pool.devices)
    out = pw.program(lambda v: double(v))(np.arange(6, dtype=np.float32))
    info = runtime.describe()
    print(json.dumps({
        "islands": sorted((i.name, i.devices, i.devices_per_host) for i in info.islands),
        "slices": [(s.island, len(s.hosts)) for s in info.slices],
        "out": np.asarray(out).tolist(),
    }))
    pw.shutdown()
    """
)


def test_local_islands_and_host_size_come_from_the_environment(tmp_path: Path) -> None:
    env = _env(PATHWAYS_LOCAL_ISLANDS="north:6,south:2", PATHWAYS_DEVICES_PER_HOST="2")
    done = _run([sys.executable, "-c", ISLANDS_FROM_THE_ENVIRONMENT], env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["islands"] == [["north", 6, 2], ["south", 2, 2]]
    assert seen["slices"] == [["north", 3]], "6 devices fit only north, as 3 hosts of 2"
    assert seen["out"] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_a_bad_islands_variable_is_named_before_anything_starts(tmp_path: Path) -> None:
    env = _env(PATHWAYS_LOCAL_ISLANDS="north:six")
    done = _run([sys.executable, "-c", "import pathways as pw; pw.connect()"], env, tmp_path)
    assert done.returncode != 0
    assert "PATHWAYS_LOCAL_ISLANDS" in done.stderr and "north:six" in done.stderr, done.stderr[-3000:]


def test_a_controller_that_exits_at_start_is_reported_as_exited_with_its_error(tmp_path: Path) -> None:
    env = _env(PATHWAYS_WINDOW="0")
    done = _run([sys.executable, "-c", "import pathways as pw; pw.connect()"], env, tmp_path)
    assert done.returncode != 0
    assert "the local Pathways controller exited with status 2 before it was ready" in done.stderr, done.stderr
    assert "PATHWAYS_WINDOW='0' is not valid" in done.stderr, done.stderr[-3000:]
