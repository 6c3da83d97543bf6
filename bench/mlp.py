"""The model every setup of experiment 8 trains: a 2-layer MLP, plain SGD, mean squared error.

About 5 MiB of float32 parameters (512 → 2048 → 128) and batches of 256 rows.
The data of step `i` is a pure function of `i`, so a process that feeds only its
own rows of a batch (multi-controller JAX) trains on exactly what one client
feeding whole batches does, and every setup reaches the same losses.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

IN, HIDDEN, OUT = 512, 2048, 128
BATCH = 256
LEARNING_RATE = 0.01

Params = dict[str, Any]


def init_params(seed: int = 0) -> Params:
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.normal(size=(IN, HIDDEN)) / np.sqrt(IN)).astype(np.float32),
        "b1": np.zeros((HIDDEN,), np.float32),
        "w2": (rng.normal(size=(HIDDEN, OUT)) / np.sqrt(HIDDEN)).astype(np.float32),
        "b2": np.zeros((OUT,), np.float32),
    }


def param_bytes(params: Params) -> int:
    return sum(int(np.asarray(v).nbytes) for v in params.values())


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """Step `step`'s inputs and regression targets (deterministic)."""
    rng = np.random.default_rng(1000 + step)
    x = rng.normal(size=(BATCH, IN)).astype(np.float32)
    y = np.tanh(x[:, :OUT] * 0.5).astype(np.float32)
    return x, y


def batch_bytes() -> int:
    x, y = batch(0)
    return int(x.nbytes + y.nbytes)


def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def sgd_step(params: Params, x: jax.Array, y: jax.Array) -> tuple[Params, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss
