"""Experiment 3 (paper Table 2): the demo model pipelined over two islands vs SPMD.

`examples/pipeline.py`: stage 0 on a 4-device slice of island-a, stage 1 on a
4-device slice of island-b, M microbatches per step; SPMD runs the whole model
data-parallel on 8 devices of one island. The figure is tokens/s ratio.
The demo model has two stages, so S=4 needs a deeper model and is not run.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import pathways as pw
from bench.measure import Figure, figure

EXP = "3 pipelining"
BATCH = 64
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _tokens_per_s(trainer: Any, steps: int, repeats: int) -> list[float]:
    import lm

    p0, p1 = lm.init_params(seed=0)
    xs, ys = lm.make_data(steps + 1, BATCH, seed=1)
    p0, p1, _ = trainer.train_step(p0, p1, xs[0], ys[0])  # places, compiles
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            p0, p1, loss = trainer.train_step(p0, p1, xs[1 + i], ys[1 + i])
        float(loss)
        out.append(steps * BATCH * lm.CONTEXT / (time.perf_counter() - start))
    return out


def run(microbatches: tuple[int, ...], steps: int, repeats: int) -> list[Figure]:
    sys.path.insert(0, EXAMPLES)
    from pipeline import PipelineTrainer, SpmdTrainer

    pw.connect(islands={"island-a": 8, "island-b": 8}, devices_per_host=4)
    spmd = figure(EXP, "SPMD, 8 devices, one island", "tokens/s",
                  _tokens_per_s(SpmdTrainer(devices=8), steps, repeats))
    figures = [spmd]
    for m in microbatches:
        pw.connect(islands={"island-a": 8, "island-b": 8}, devices_per_host=4)
        f = figure(EXP, f"pipeline S=2 M={m}, two islands", "tokens/s",
                   _tokens_per_s(PipelineTrainer(devices_per_stage=4, microbatches=m), steps, repeats),
                   baseline="SPMD", baseline_samples=spmd.samples)
        f.ratio = f.median / spmd.median
        f.target = "≥ 1.0× SPMD (paper: 1.06×)"
        f.met = f.ratio >= 1.0
        figures.append(f)
    figures.append(Figure(EXP, "pipeline S=4", "", float("nan"), float("nan"), float("nan"), 0,
                          note="not run: the demo model (examples/lm.py) has two stages"))
    pw.shutdown()
    return figures
