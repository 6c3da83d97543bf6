"""Pipeline-parallel and SPMD training of `lm` as Pathways programs.

`PipelineTrainer` puts stage 0 on a slice of one island and stage 1 on a slice
of the other; one training step is one `@pw.program` whose graph has, per
microbatch, a forward on stage 0, a forward+backward on stage 1 and a backward
on stage 0, then one update per stage. Activations and their gradients cross
islands host-to-host. The loop is written microbatch by microbatch; the island
scheduler grants each stage's computations fewest-moves-first
(`pathways_operator.core.grant_order`), so stage 0 runs every forward before the
first backward, whose gradient has to come back from stage 1, and the stages
overlap as in GPipe. `SpmdTrainer` runs the whole
model data-parallel on one slice of the same total size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax.sharding import PartitionSpec as P

import pathways as pw
from examples import lm


class PipelineTrainer:
    def __init__(self, devices_per_stage: int = 4, microbatches: int = 4) -> None:
        device_set = pw.make_virtual_device_set()
        self.stage_slices = [
            device_set.add_slice(devices=devices_per_stage, island="island-a"),
            device_set.add_slice(devices=devices_per_stage, island="island-b"),
        ]
        a, b = self.stage_slices
        batch = P("x")
        self.forward0 = pw.jit(lm.stage0_forward, slice=a, in_shardings=(None, batch), out_shardings=batch)
        self.forward_backward1 = pw.jit(
            lm.stage1_forward_backward, slice=b,
            in_shardings=(None, batch, batch), out_shardings=(None, batch, None),
        )
        self.backward0 = pw.jit(lm.stage0_backward, slice=a, in_shardings=(None, batch, batch), out_shardings=None)
        self.update0 = pw.jit(lm.apply_gradients, slice=a)
        self.update1 = pw.jit(lm.apply_gradients, slice=b)
        self.loss = pw.jit(lm.mean_loss, slice=b)
        self.microbatches = microbatches
        self.step = pw.program(self._step, name="pipeline-step")

    def _step(self, p0: Any, p1: Any, xs: list[Any], ys: list[Any]) -> Any:
        g0s, g1s, losses = [], [], []
        for x, y in zip(xs, ys):
            h = self.forward0(p0, x)
            loss, g_h, g1 = self.forward_backward1(p1, h, y)
            g0s.append(self.backward0(p0, x, g_h))
            g1s.append(g1)
            losses.append(loss)
        return self.update0(p0, *g0s), self.update1(p1, *g1s), self.loss(*losses)

    def train_step(self, p0: Any, p1: Any, x: np.ndarray, y: np.ndarray) -> Any:
        xs = np.split(x, self.microbatches)
        ys = np.split(y, self.microbatches)
        return self.step(p0, p1, xs, ys)


class SpmdTrainer:
    def __init__(self, devices: int = 8) -> None:
        self.slice = pw.make_virtual_device_set().add_slice(devices=devices)
        batch = P("x")
        self.update = pw.jit(
            lm.spmd_step, slice=self.slice,
            in_shardings=(None, None, batch, batch), out_shardings=(None, None, None),
        )
        self.step = pw.program(lambda p0, p1, x, y: self.update(p0, p1, x, y), name="spmd-step")

    def train_step(self, p0: Any, p1: Any, x: np.ndarray, y: np.ndarray) -> Any:
        return self.step(p0, p1, x, y)
