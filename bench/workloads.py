"""The computations the experiments chain: a tiny add and square matmuls of chosen cost."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def tiny(x: Any) -> Any:
    return x + 1.0


def matmul(x: Any) -> Any:
    """tanh keeps a long chain bounded; the cost is one n×n matmul."""
    return jnp.tanh(x @ x)


def size_input(n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(4, np.float32)
    rng = np.random.default_rng(0)
    out: np.ndarray = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    return out


def body(n: int) -> Callable[[Any], Any]:
    return tiny if n == 0 else matmul


def label(n: int) -> str:
    return "add f32[4]" if n == 0 else f"matmul {n}×{n}"


class JaxChain:
    """Plain jax.jit in this process, compiled once: `sample()` times `chains` chains of
    `chain` computations, one after the other, in µs per computation, so its repeats can
    take turns with another's, each sample as long as the other's (as many computations).
    Each timed sample follows an untimed chain: what another setup's repeat left running
    (a call's last work) and left in the caches falls on that one, not on the baseline."""

    def __init__(self, n: int, chain: int, chains: int = 1) -> None:
        self._f = jax.jit(body(n))
        self._y = jnp.asarray(size_input(n))
        self._chain = chain
        self._chains = chains
        self._f(self._y).block_until_ready()

    def sample(self) -> float:
        self._run()
        start = time.perf_counter()
        for _ in range(self._chains):
            self._run()
        return (time.perf_counter() - start) / (self._chains * self._chain) * 1e6

    def _run(self) -> None:
        z = self._y
        for _ in range(self._chain):
            z = self._f(z)
        z.block_until_ready()


def jax_chain_us(n: int, chain: int, repeats: int) -> list[float]:
    """Plain jax.jit in this process: µs per computation over a chain, `repeats` times."""
    chain_of = JaxChain(n, chain)
    return [chain_of.sample() for _ in range(repeats)]


def size_for_ms(ms: float, candidates: tuple[int, ...] = (128, 192, 256, 320, 384, 448, 512, 576, 640, 768, 896, 1024, 1280)) -> int:
    """The smallest matmul size whose plain-JAX time reaches `ms` on this machine."""
    for n in candidates:
        if min(jax_chain_us(n, 8, 2)) >= ms * 1e3:
            return n
    return candidates[-1]
