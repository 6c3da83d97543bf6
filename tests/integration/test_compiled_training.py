"""A compiled program with ``feeds`` trains across steps, as the operator's driver runs it.

``run_compiled`` (what ``python -m pathways.driver --compiled-program`` runs) drives
``examples/train_program.py``, with weights made larger than what travels inline
(``INLINE_BYTES``), compiled on the embedded cluster: each step's new weights
are the next step's weights, as handles, so no weight byte passes through the client;
a run stopped after a snapshot and started again continues from the snapshot's weights
and ends where an uninterrupted run of plain numpy does. The driver dispatches a step
before the one before it is done.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pathways as pw
from pathways.checkpoint import Checkpointer
from pathways.cli.program_file import load_program_file
from pathways.context import ProgramContext, SliceBinding
from pathways.driver import run_compiled
from pathways.runtime import INLINE_BYTES
from pathways_devcluster.controlplane import REPO_ROOT
from pathways_wire.compiled_program import CompiledProgram
from tests.cluster.program_files import example_module

pytestmark = pytest.mark.timeout(300)

TRAIN_PROGRAM = REPO_ROOT / "examples" / "train_program.py"
FEATURES, ROWS = 4 * INLINE_BYTES // 4 // 2, 8
"""Weights of twice INLINE_BYTES: they stay on the hosts instead of travelling inline."""
FIRST_STEPS, ALL_STEPS, EVERY = 5, 12, 5


@pytest.fixture
def program_file(tmp_path: Path) -> Path:
    text = TRAIN_PROGRAM.read_text()
    for constant in ("FEATURES = 4\n", "ROWS = 64\n"):
        assert constant in text, f"examples/train_program.py no longer has {constant!r}"
    path = tmp_path / "train_program.py"
    path.write_text(text.replace("FEATURES = 4\n", f"FEATURES = {FEATURES}\n").replace("ROWS = 64\n", f"ROWS = {ROWS}\n"))
    return path


def _compiled(path: Path) -> CompiledProgram:
    loaded = load_program_file(path)
    compiled: CompiledProgram = loaded.function.compiled(loaded.args, loaded.feeds)
    return compiled


def _context(compiled: CompiledProgram, steps: int, slice_name: str, checkpoints: Path) -> ProgramContext:
    (decl,) = compiled.program.slices
    return ProgramContext(
        args={}, steps=steps, start_step=0, slices={decl.id: SliceBinding(slice_name, decl.devices)},
        checkpointer=Checkpointer(checkpoints), every_steps=EVERY,
    )


def test_a_compiled_program_trains_with_its_weights_on_the_hosts_and_resumes_from_a_snapshot(
    runtime: pw.Runtime, program_file: Path, tmp_path: Path
) -> None:
    compiled = _compiled(program_file)
    assert compiled.inputs[0].nbytes > INLINE_BYTES
    stored = sum(compiled.inputs[i].nbytes for i in range(len(compiled.inputs)) if i != 0)
    first = _context(compiled, FIRST_STEPS, "train-first", tmp_path / "ckpt")
    before = runtime.traffic
    run_compiled(first, compiled)
    used = runtime.traffic - before
    first.close()
    assert used.sent == FIRST_STEPS * stored + compiled.inputs[0].nbytes, (
        "the weights are sent once, at the first step; after it only the stored x and y are"
    )
    assert used.received == compiled.inputs[0].nbytes, "only the snapshot at step 5 fetched the weights"
    assert first.checkpoint_stats.steps == [FIRST_STEPS]

    resumed = _context(compiled, ALL_STEPS, "train-resumed", tmp_path / "ckpt")
    assert resumed.start_step == FIRST_STEPS
    got = run_compiled(resumed, compiled)
    weights, loss = np.asarray(got["output_0"]), float(np.asarray(got["output_1"]))
    resumed.close()
    want_weights, want_loss = example_module(program_file).reference(ALL_STEPS)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-4, atol=1e-5)
    assert loss == pytest.approx(want_loss, rel=1e-3)
    first_loss = example_module(program_file).reference(1)[1]
    assert loss < first_loss / 10, "twelve steps of training, not the first step twelve times"


SLOW_PROGRAM = '''
import jax.numpy as jnp
import numpy as np
import pathways as pw

main = pw.make_virtual_device_set().add_slice(devices=1)


def slow_step(w):
    for _ in range(40):  # tens of milliseconds of matmuls: a step is never done as it is dispatched
        w = jnp.tanh(w @ w) * 0.5
    return w, w.sum()


step = pw.jit(slow_step, slice=main)


@pw.program(name="slow-steps")
def program(w):
    return step(w)


feeds = {0: 0}


def example_args():
    return (np.eye(256, dtype=np.float32),)
'''


class _CallsAtEachReport:
    """A reporter that notes how many calls the client had started when each step was reported."""

    def __init__(self, runtime: pw.Runtime) -> None:
        self.runtime = runtime
        self.seen: list[tuple[int, int]] = []

    def step(self, step: int, metrics: object) -> None:
        self.seen.append((step, self.runtime.calls))

    def outcome(self, payload: object) -> None:
        pass

    def started(self, run: object) -> None:
        pass


def test_a_compiled_programs_driver_dispatches_the_next_step_before_a_step_is_done(
    runtime: pw.Runtime, tmp_path: Path
) -> None:
    path = tmp_path / "slow_program.py"
    path.write_text(SLOW_PROGRAM)
    compiled = _compiled(path)
    (decl,) = compiled.program.slices
    reporter = _CallsAtEachReport(runtime)
    ctx = ProgramContext(args={}, steps=4, start_step=0, slices={decl.id: SliceBinding("slow", decl.devices)},
                         reporter=reporter)
    started = runtime.calls
    got = run_compiled(ctx, compiled)
    ctx.flush()
    assert [step for step, _ in reporter.seen] == [0, 1, 2, 3]
    _, calls_then = reporter.seen[0]
    assert calls_then - started >= 2, "step 1 was dispatched before step 0 was reported done"
    want = np.eye(256, dtype=np.float32)
    for _ in range(4 * 40):
        want = np.tanh(want @ want) * 0.5
    np.testing.assert_allclose(np.asarray(got["output_0"]), want, rtol=1e-4, atol=1e-5)
