"""Experiment 7: what checkpointing costs — per snapshot, and in step time.

1. *Snapshot cost*: :class:`pathways.checkpoint.Checkpointer` saves a pytree of
   ``size`` MiB (float32 arrays). Reported: milliseconds per MiB the caller is held
   (``save`` returns once orbax has copied the arrays; files commit in the background)
   and per MiB until the snapshot is committed on disk.
2. *Step-time overhead*: ``pw.launch`` runs a training-like loop (a ``pw.jit`` update of
   ``state_mib`` MiB of parameters on a 4-device slice of the embedded cluster) once with
   checkpoints off and once with a snapshot every ``every`` steps; the ratio of mean step
   times is the overhead (baseline: the same loop, same run, checkpoints off).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.measure import Figure, figure


def _tree(mib: int) -> dict[str, np.ndarray]:
    n = mib * (1 << 20) // 4
    return {"w": np.random.default_rng(0).normal(size=(n // 2,)).astype(np.float32),
            "b": np.ones((n - n // 2,), np.float32)}


def snapshot_cost(sizes: tuple[int, ...], repeats: int) -> list[Figure]:
    from pathways.checkpoint import Checkpointer

    figures: list[Figure] = []
    for mib in sizes:
        tree = _tree(mib)
        held: list[float] = []
        committed: list[float] = []
        root = Path(tempfile.mkdtemp(prefix="pw-ckpt-bench-"))
        try:
            ckpt = Checkpointer(root)
            for i in range(repeats + 1):
                start = time.perf_counter()
                h = ckpt.save(i + 1, tree)
                ckpt.wait()
                total = time.perf_counter() - start
                if i:  # the first save pays orbax's start-up
                    held.append(1e3 * h / mib)
                    committed.append(1e3 * total / mib)
            ckpt.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
        figures.append(figure("7 checkpoints", f"snapshot {mib} MiB, caller held", "ms/MiB", held))
        figures.append(figure("7 checkpoints", f"snapshot {mib} MiB, committed", "ms/MiB", committed))
    return figures


def _loop(ctx: Any) -> dict[str, Any]:
    import pathways as pw

    vslice = ctx.slice("main")
    update = pw.jit(lambda w: w * 0.999 + 0.001, slice=vslice)

    @pw.program(name="ckpt-bench")
    def step(w: Any) -> Any:
        return update(w)

    n = int(ctx.args["state_mib"]) * (1 << 20) // 4
    w = ctx.restore(default={"w": np.zeros((n,), np.float32)})["w"]
    times: list[float] = []
    for i in range(ctx.start_step, ctx.steps):
        start = time.perf_counter()
        w = step(w).block_until_ready()
        ctx.step_done(i, state={"w": w})
        times.append(time.perf_counter() - start)
    return {"step_s": np.asarray(times)}


def step_overhead(state_mib: int, steps: int, every: int) -> list[Figure]:
    import pathways as pw

    pw.connect(islands={"island-a": 8}, devices_per_host=4)
    root = Path(tempfile.mkdtemp(prefix="pw-ckpt-bench-"))
    try:
        args = {"state_mib": state_mib}
        off = pw.launch(_loop, args=args, steps=steps, slices={"main": 4}, name="ckpt-off").result(600)
        on_run = pw.launch(_loop, args=args, steps=steps, slices={"main": 4}, name="ckpt-on",
                           checkpoint_dir=root, every_steps=every)
        on = on_run.result(600)
    finally:
        pw.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    warm = max(1, steps // 10)
    t_off = [1e3 * t for t in np.asarray(off["step_s"])[warm:]]
    t_on = [1e3 * t for t in np.asarray(on["step_s"])[warm:]]
    base = float(np.mean(t_off))
    mean_on = float(np.mean(t_on))
    stats = on_run.contexts[0].checkpoint_stats
    return [
        figure("7 checkpoints", f"step, {state_mib} MiB state, checkpoints off", "ms", t_off),
        figure("7 checkpoints", f"step, {state_mib} MiB state, snapshot every {every}", "ms", t_on,
               baseline="checkpoints off (same run)", ratio=mean_on / base,
               note=f"mean {mean_on:.2f} vs {base:.2f} ms; {stats.snapshots} snapshots, "
                    f"{1e3 * stats.held_s / max(1, stats.snapshots):.1f} ms held each"),
    ]


def run(sizes: tuple[int, ...], repeats: int, state_mib: int, steps: int, every: int) -> list[Figure]:
    return snapshot_cost(sizes, repeats) + step_overhead(state_mib, steps, every)
