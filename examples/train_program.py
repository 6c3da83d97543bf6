"""Data-parallel linear regression as a program file that trains across steps.

``feeds = {0: 0}`` says that the step's first returned value (the new weights) is the
next step's first argument, so ``pathways run examples/train_program.py --steps 20``
and a PathwaysProgram from ``pathways compile``/``submit`` with ``--steps 20`` train for
20 steps. The weights stay on the hosts between steps: each step reads the one before's
output where it is, and only the snapshots ``spec.checkpoint`` asks for fetch them.

Results: ``output_0`` the learned weights (they approach ``TRUE_W``), ``output_1`` the
last step's loss.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways as pw

FEATURES = 4
ROWS = 64
LEARNING_RATE = 0.5 / FEATURES
TRUE_W = np.linspace(-2.0, 3.0, FEATURES, dtype=np.float32)

main = pw.make_virtual_device_set().add_slice(devices=2)


def sgd(w: Any, x: Any, y: Any) -> tuple[Any, Any]:
    def loss_fn(w: Any) -> Any:
        return jnp.mean((x @ w - y) ** 2)

    loss, grad = jax.value_and_grad(loss_fn)(w)
    return w - LEARNING_RATE * grad, loss


step = pw.jit(sgd, slice=main, in_shardings=(P(), P("x"), P("x")), out_shardings=(P(), P()))


@pw.program(name="train-program")
def program(w: Any, x: Any, y: Any) -> Any:
    return step(w, x, y)


feeds = {0: 0}


def example_args() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).normal(size=(ROWS, FEATURES)).astype(np.float32)
    return np.zeros_like(TRUE_W), x, x @ TRUE_W


def reference(steps: int) -> tuple[np.ndarray, float]:
    """The weights after ``steps`` steps and the last step's loss, in plain numpy."""
    w, x, y = example_args()
    loss = 0.0
    for _ in range(steps):
        err = x @ w - y
        loss = float(np.mean(err**2))
        w = w - LEARNING_RATE * (2.0 / ROWS) * (x.T @ err)
    return w, loss
