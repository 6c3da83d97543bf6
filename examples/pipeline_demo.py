"""`make demo`: pipeline-parallel training over two islands, then SPMD for comparison.

Runs on the embedded local runtime (no cluster): each slice's hosts are local
processes, stage 0 on island-a and stage 1 on island-b, activations crossing
between them host-to-host.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

import pathways as pw  # noqa: E402
from examples import lm  # noqa: E402
from examples.pipeline import PipelineTrainer, SpmdTrainer  # noqa: E402

STEPS = int(os.environ.get("DEMO_STEPS", "40"))
BATCH = 64
MICROBATCHES = 4


def train(name: str, trainer: PipelineTrainer | SpmdTrainer) -> tuple[float, float, float]:
    p0, p1 = lm.init_params(seed=0)
    xs, ys = lm.make_data(STEPS, BATCH, seed=1)
    first = last = float("nan")
    bar = tqdm(range(STEPS), desc=name, unit="step", file=sys.stdout, mininterval=1.0)
    start = time.perf_counter()
    for step in bar:
        p0, p1, loss = trainer.train_step(p0, p1, xs[step], ys[step])
        last = float(loss)
        if step == 0:
            first = last
            start = time.perf_counter()  # the first step includes placement and compiles
        bar.set_postfix(loss=f"{last:.3f}", refresh=False)
        if step % 10 == 0 or step == STEPS - 1:
            tqdm.write(f"  {name} step {step:3d}  loss {last:.4f}", file=sys.stdout)
    elapsed = time.perf_counter() - start
    tokens_per_s = (STEPS - 1) * BATCH / elapsed if STEPS > 1 else float("nan")
    return first, last, tokens_per_s


def main() -> None:
    runtime = pw.connect()
    info = runtime.describe()
    print("embedded Pathways cluster:", ", ".join(
        f"{i.name} ({i.devices} devices, {i.devices_per_host}/host)" for i in info.islands))
    print(f"\n== pipeline: 2 stages on island-a / island-b, {MICROBATCHES} microbatches ==")
    pipe = train("pipeline", PipelineTrainer(devices_per_stage=4, microbatches=MICROBATCHES))
    print(f"\n== SPMD: whole model data-parallel on one slice of 8 devices (2 hosts) ==")
    spmd = train("spmd", SpmdTrainer(devices=8))
    print("\nresult        first loss  final loss  examples/s")
    for label, (first, last, rate) in (("pipeline", pipe), ("spmd", spmd)):
        print(f"{label:12s} {first:10.4f} {last:11.4f} {rate:11.1f}")
    assert np.isfinite(pipe[1]) and pipe[1] < pipe[0], "pipeline training did not reduce the loss"
    assert abs(pipe[1] - spmd[1]) < 0.05, "pipeline and SPMD disagree on the final loss"
    pw.shutdown()


if __name__ == "__main__":
    main()
