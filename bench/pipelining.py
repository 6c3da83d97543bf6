"""Experiment 3 (paper Table 2): the demo model pipelined over two islands vs SPMD.

`examples/pipeline.py`: stage 0 on a 4-device slice of island-a, stage 1 on a
4-device slice of island-b, M microbatches per step; SPMD runs the whole model
data-parallel on 8 devices of one island. The figure is tokens/s ratio.
The demo model has two stages, so S=4 needs a deeper model and is not run.

After its timed repeats each setup trains `PROFILE_STEPS` more steps per repeat
with every process's CPU read from /proc/<pid>/stat: the client, the controller,
and the workers and sidecars of every host. On a machine of few cores that CPU
sets a floor: a step cannot take less than its CPU over the cores, however well
the processes overlap, and the floor's tokens/s is the most the setup can reach
here. Where a pipeline's floor is below SPMD's measured rate, the SPMD target is
out of this machine's reach: every microbatch crosses between the islands twice
a step, and each crossing costs a hand-off in four processes.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import pathways as pw
from bench import floors
from bench.measure import Figure, figure
from examples import lm
from examples.pipeline import PipelineTrainer, SpmdTrainer

EXP = "3 pipelining"
BATCH = 64
PROFILE_STEPS = 10
"""Steps per repeat of each setup's CPU profile, after its timed repeats."""


def _tokens_per_s(
    trainer: Any, steps: int, repeats: int, profile_steps: int = 0
) -> tuple[list[float], dict[str, list[float]]]:
    """tokens/s of each repeat, and (``profile_steps`` > 0) each role's ms of CPU per
    step over that many more steps per repeat."""
    p0, p1 = lm.init_params(seed=0)
    xs, ys = lm.make_data(steps + 1, BATCH, seed=1)
    # Placed, compiled and run before the first timed repeat, both ways a timed step runs:
    # on values the client has, and naming the outputs of a step that still runs.
    for i in (0, 1):
        p0, p1, warm = trainer.train_step(p0, p1, xs[i], ys[i])
    float(warm)
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            p0, p1, loss = trainer.train_step(p0, p1, xs[1 + i], ys[1 + i])
        float(loss)
        out.append(steps * BATCH * lm.CONTEXT / (time.perf_counter() - start))
    if not profile_steps:
        return out, {}

    def more_steps() -> int:
        nonlocal p0, p1
        for k in range(profile_steps):
            i = 1 + k % steps
            p0, p1, loss = trainer.train_step(p0, p1, xs[i], ys[i])
        float(loss)
        return profile_steps

    return out, floors.profile_ms(floors.cluster_pids(pw.default_runtime()), more_steps, repeats)


def _cpu_figures(label: str, cpu: dict[str, list[float]], tokens_per_step: int,
                 spmd: Figure, spmd_cpu: dict[str, list[float]] | None) -> list[Figure]:
    """A setup's CPU per step by role and in all (against SPMD's, by role in `spmd_cpu`),
    and the tokens/s floor it sets."""
    cores = os.cpu_count() or 1
    how = floors.per_step_note(PROFILE_STEPS)
    out = [figure(EXP, f"{label}: CPU per step, {role}s", "ms CPU/step", samples, note=how)
           for role, samples in cpu.items()]
    total = floors.all_roles(cpu)
    if spmd_cpu is None:
        out.append(figure(EXP, f"{label}: CPU per step, all processes", "ms CPU/step", total))
    else:
        spmd_total = floors.all_roles(spmd_cpu)
        out.append(figure(EXP, f"{label}: CPU per step, all processes", "ms CPU/step", total,
                          baseline="SPMD's", baseline_samples=spmd_total,
                          ratio=statistics.median(total) / statistics.median(spmd_total)))
    floor = [tokens_per_step / (t / cores / 1e3) for t in total]
    out.append(figure(EXP, f"{label}: floor, the most tokens/s its CPU per step allows on {cores} cores",
                      "tokens/s", floor, baseline="SPMD", baseline_samples=spmd.samples,
                      ratio=statistics.median(floor) / spmd.median,
                      note="a step takes at least its CPU over the cores, however well the processes overlap"))
    return out


def run(microbatches: tuple[int, ...], steps: int, repeats: int) -> list[Figure]:
    tokens_per_step = BATCH * lm.CONTEXT
    pw.connect(islands={"island-a": 8, "island-b": 8}, devices_per_host=4)
    rates, spmd_cpu = _tokens_per_s(SpmdTrainer(devices=8), steps, repeats, PROFILE_STEPS)
    spmd = figure(EXP, "SPMD, 8 devices, one island", "tokens/s", rates)
    figures = [spmd]
    profiles = [_cpu_figures("SPMD", spmd_cpu, tokens_per_step, spmd, None)]
    for m in microbatches:
        pw.connect(islands={"island-a": 8, "island-b": 8}, devices_per_host=4)
        rates, cpu = _tokens_per_s(PipelineTrainer(devices_per_stage=4, microbatches=m), steps, repeats,
                                   PROFILE_STEPS)
        f = figure(EXP, f"pipeline S=2 M={m}, two islands", "tokens/s", rates,
                   baseline="SPMD", baseline_samples=spmd.samples)
        f.ratio = f.median / spmd.median
        f.target = "≥ 1.0× SPMD (paper: 1.06×)"
        f.met = f.ratio >= 1.0
        figures.append(f)
        profiles.append(_cpu_figures(f"pipeline S=2 M={m}", cpu, tokens_per_step, spmd, spmd_cpu))
    figures.append(Figure(EXP, "pipeline S=4", "", float("nan"), float("nan"), float("nan"), 0,
                          note="not run: the demo model (examples/lm.py) has two stages"))
    pw.shutdown()
    return figures + [row for rows in profiles for row in rows]
