"""Entrypoints for PathwaysPrograms: what ``spec.source.entrypoint`` names.

Each is ``fn(ctx) -> dict[str, array-like]`` (see ``pathways.context``): the operator's
driver calls it once the program's VirtualSlices are Ready, with ``ctx.slice(name)``
bound to them, and stores the returned arrays in the ConfigMap ``<program>-results``.

``examples.programs:paper_example``
    the program of the Pathways paper (section 4.1) on one slice of the program's,
    repeated ``ctx.steps`` times; returns ``y = [3, 5]`` and ``z = [2, 4]``.
``examples.programs:pipeline_training``
    the ``make demo`` workload on Kubernetes: the small language model of
    ``examples/lm.py`` trained pipeline-parallel, stage 0 on slice ``stage0`` and
    stage 1 on slice ``stage1`` (one per island), microbatched; returns the losses.
``examples.programs:train_regression``
    data-parallel training of a linear model with ``pw.jit`` over the slice's mesh
    (gradients averaged across every device of the slice, hence across hosts);
    returns the learned weights and the loss curve.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways as pw
from examples import lm
from pathways.context import ProgramContext


def _main_slice(ctx: ProgramContext) -> pw.VirtualSlice:
    """The slice named by ``args.slice``, else the program's first slice."""
    name = str(ctx.args.get("slice") or ctx.slice_names[0])
    return ctx.slice(name)


def paper_example(ctx: ProgramContext) -> dict[str, Any]:
    """``f(v) = (b(a(v)), a(c(a(v))))`` with ``a = 2x``, ``b = x + 1``, ``c = x / 2``.

    ``args.step_seconds`` (default 0) sleeps between steps, so tests can act mid-run.
    """
    devices = _main_slice(ctx).devices
    a = pw.pmap(lambda x: x * 2.0, devices=devices)
    b = pw.pmap(lambda x: x + 1.0, devices=devices)
    c = pw.pmap(lambda x: x / 2.0, devices=devices)

    @pw.program(name="paper-example", weight=ctx.weight)
    def f(v: Any) -> Any:
        x = a(v)
        y = b(x)
        z = a(c(x))
        return (y, z)

    v = np.arange(1.0, len(devices) + 1.0, dtype=np.float32)
    pause = float(ctx.args.get("step_seconds", 0.0))
    y, z = f(v)
    for step in range(ctx.start_step, ctx.steps):
        if step > ctx.start_step:
            y, z = f(v)
        ctx.step_done(step, {"y0": float(np.asarray(y)[0]), "z0": float(np.asarray(z)[0])})
        if pause:
            time.sleep(pause)
    return {"y": y, "z": z}


def _regression_data(n: int, features: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=(features,)).astype(np.float32)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = (x @ w_true + 0.01 * rng.normal(size=(n,))).astype(np.float32)
    return x, y, w_true


def train_regression(ctx: ProgramContext) -> dict[str, Any]:
    """Least squares by gradient descent, batch sharded over the slice, weights replicated.

    ``args``: ``features`` (8), ``batch_per_device`` (16), ``learning_rate`` (0.1), ``seed`` (0),
    ``step_seconds`` (0: a pause after each step, so tests can act mid-run).
    The weights and the loss curve are the program's persistent state (``ctx.restore``,
    ``step_done(state=...)``): with ``spec.checkpoint`` a suspended, preempted or recovered
    run continues from its last snapshot and ends with the same weights and losses as an
    uninterrupted one.
    """
    vslice = _main_slice(ctx)
    features = int(ctx.args.get("features", 8))
    per_device = int(ctx.args.get("batch_per_device", 16))
    lr = float(ctx.args.get("learning_rate", 0.1))
    seed = int(ctx.args.get("seed", 0))
    x, y, w_true = _regression_data(per_device * vslice.devices_count, features, seed)

    def sgd_step(w: jax.Array, xb: jax.Array, yb: jax.Array) -> tuple[jax.Array, jax.Array]:
        def loss_fn(w: jax.Array) -> jax.Array:
            return jnp.mean((xb @ w - yb) ** 2)

        loss, grad = jax.value_and_grad(loss_fn)(w)
        return w - lr * grad, loss

    step_fn = pw.jit(
        sgd_step, slice=vslice, in_shardings=(None, P("x"), P("x")), out_shardings=(None, None)
    )

    @pw.program(name="train-regression", weight=ctx.weight)
    def train(w: Any, xb: Any, yb: Any) -> Any:
        return step_fn(w, xb, yb)

    pause = float(ctx.args.get("step_seconds", 0.0))
    state = ctx.restore(
        default={"w": np.zeros((features,), np.float32), "losses": np.zeros((0,), np.float32)}
    )
    w, losses = state["w"], list(np.asarray(state["losses"], np.float32))
    for step in range(ctx.start_step, ctx.steps):
        w, loss = train(w, x, y)
        losses.append(np.float32(np.asarray(loss)))
        ctx.step_done(step, {"loss": float(losses[-1])},
                      state={"w": w, "losses": np.asarray(losses, np.float32)})
        if pause:
            time.sleep(pause)
    error = float(np.linalg.norm(np.asarray(w) - w_true))
    return {"weights": w, "losses": np.asarray(losses), "weight_error": np.asarray(error)}


def pipeline_training(ctx: ProgramContext) -> dict[str, Any]:
    """Two pipeline stages on two slices; activations and their gradients cross host-to-host.

    ``args``: ``batch`` (64), ``microbatches`` (4), ``seed`` (0). One program step is one
    training step: per microbatch a forward on stage 0, forward+backward on stage 1 and a
    backward on stage 0, then one update per stage. Like ``train_regression`` it keeps no
    checkpoint: a restarted run trains the remaining steps from the initial parameters.
    """
    a, b = ctx.slice("stage0"), ctx.slice("stage1")
    batch = int(ctx.args.get("batch", 64))
    microbatches = int(ctx.args.get("microbatches", 4))
    seed = int(ctx.args.get("seed", 0))
    rows = P("x")
    forward0 = pw.jit(lm.stage0_forward, slice=a, in_shardings=(None, rows), out_shardings=rows)
    forward_backward1 = pw.jit(
        lm.stage1_forward_backward, slice=b,
        in_shardings=(None, rows, rows), out_shardings=(None, rows, None),
    )
    backward0 = pw.jit(lm.stage0_backward, slice=a, in_shardings=(None, rows, rows), out_shardings=None)
    update0 = pw.jit(lm.apply_gradients, slice=a)
    update1 = pw.jit(lm.apply_gradients, slice=b)
    mean_loss = pw.jit(lm.mean_loss, slice=b)

    @pw.program(name="pipeline-step", weight=ctx.weight)
    def train_step(p0: Any, p1: Any, xs: list[Any], ys: list[Any]) -> Any:
        g0s, g1s, losses = [], [], []
        for x, y in zip(xs, ys):
            h = forward0(p0, x)
            loss, g_h, g1 = forward_backward1(p1, h, y)
            g0s.append(backward0(p0, x, g_h))
            g1s.append(g1)
            losses.append(loss)
        return update0(p0, *g0s), update1(p1, *g1s), mean_loss(*losses)

    p0, p1 = lm.init_params(seed=seed)
    xs, ys = lm.make_data(ctx.steps, batch, seed=seed + 1)
    losses: list[Any] = []
    for step in range(ctx.start_step, ctx.steps):
        xm = np.split(xs[step], microbatches)
        ym = np.split(ys[step], microbatches)
        p0, p1, loss = train_step(p0, p1, xm, ym)
        losses.append(loss)  # a handle: the next step is dispatched before this one ends
        ctx.step_done(step, {"loss": loss})  # reported once the loss exists
    return {"losses": np.asarray(pw.fetch(losses), np.float32)}
