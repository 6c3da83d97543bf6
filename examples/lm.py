"""A small MLP language model, its synthetic data, and its training steps.

Shared by the demo and the benchmarks. Tokens follow a fixed rule with noise
(next = t[-1] + 1 mod V, 10% random), so the loss falls quickly from
ln(V) toward the noise floor and a run shows visibly that training works.
The model splits into two pipeline stages at its hidden layer.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

VOCAB = 32
CONTEXT = 8
EMBED = 16
HIDDEN = 128
LEARNING_RATE = 0.5

Params = dict[str, Any]


def make_data(batches: int, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = batches * batch
    seqs = np.zeros((n, CONTEXT + 1), np.int32)
    seqs[:, :2] = rng.integers(0, VOCAB, (n, 2))
    for t in range(2, CONTEXT + 1):
        rule = (seqs[:, t - 1] + 1) % VOCAB
        noise = rng.integers(0, VOCAB, n)
        seqs[:, t] = np.where(rng.random(n) < 0.9, rule, noise)
    x = seqs[:, :CONTEXT].reshape(batches, batch, CONTEXT)
    y = seqs[:, CONTEXT].reshape(batches, batch)
    return x, y


def init_params(seed: int = 0) -> tuple[Params, Params]:
    """Parameters of stage 0 (embedding, first layer) and stage 1 (second layer, head)."""
    rng = np.random.default_rng(seed)

    def dense(fan_in: int, fan_out: int) -> np.ndarray:
        weights: np.ndarray = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        return weights

    stage0 = {
        "embed": (rng.standard_normal((VOCAB, EMBED)) * 0.5).astype(np.float32),
        "w1": dense(CONTEXT * EMBED, HIDDEN),
        "b1": np.zeros(HIDDEN, np.float32),
    }
    stage1 = {
        "w2": dense(HIDDEN, HIDDEN),
        "b2": np.zeros(HIDDEN, np.float32),
        "w3": dense(HIDDEN, VOCAB),
        "b3": np.zeros(VOCAB, np.float32),
    }
    return stage0, stage1


def stage0_forward(p: Params, x: jax.Array) -> jax.Array:
    emb = p["embed"][x].reshape(x.shape[0], CONTEXT * EMBED)
    return jax.nn.relu(emb @ p["w1"] + p["b1"])


def stage1_loss(p: Params, h: jax.Array, y: jax.Array) -> jax.Array:
    h2 = jax.nn.relu(h @ p["w2"] + p["b2"])
    logits = h2 @ p["w3"] + p["b3"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def full_loss(p0: Params, p1: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    return stage1_loss(p1, stage0_forward(p0, x), y)


# ---- pipeline pieces (one computation each) ----

def stage1_forward_backward(p: Params, h: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array, Params]:
    loss, (g_p, g_h) = jax.value_and_grad(stage1_loss, argnums=(0, 1))(p, h, y)
    return loss, g_h, g_p


def stage0_backward(p: Params, x: jax.Array, g_h: jax.Array) -> Params:
    _, vjp = jax.vjp(lambda q: stage0_forward(q, x), p)
    grads: tuple[Params] = vjp(g_h)
    return grads[0]


def apply_gradients(p: Params, *grads: Params) -> Params:
    """SGD with the mean of the microbatches' gradients."""
    total = jax.tree_util.tree_map(lambda *g: sum(g) / len(g), *grads)
    stepped: Params = jax.tree_util.tree_map(lambda w, g: w - LEARNING_RATE * g, p, total)
    return stepped


def mean_loss(*losses: jax.Array) -> jax.Array:
    total = losses[0]
    for loss in losses[1:]:
        total = total + loss
    return total / len(losses)


# ---- SPMD step (one computation) ----

def spmd_step(p0: Params, p1: Params, x: jax.Array, y: jax.Array) -> tuple[Params, Params, jax.Array]:
    loss, (g0, g1) = jax.value_and_grad(full_loss, argnums=(0, 1))(p0, p1, x, y)
    p0 = jax.tree_util.tree_map(lambda w, g: w - LEARNING_RATE * g, p0, g0)
    p1 = jax.tree_util.tree_map(lambda w, g: w - LEARNING_RATE * g, p1, g1)
    return p0, p1, loss
