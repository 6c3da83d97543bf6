"""Experiment 2: the same chain as Ray tasks and as Ray actor calls (Ray local, from PyPI).

Each step calls the same jitted function as experiment 1's tiny computation.
The figure is the overhead per computation (µs per step minus plain jax.jit's)
of Ray over Pathways Chained, both measured in this run. Each repeat is the fastest of
`dispatch.BEST_OF` chains back to back, as each of Chained's is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench import workloads
from bench.dispatch import BEST_OF
from bench.measure import Figure, best_of, figure, repeat

EXP = "2 vs Ray"


def _ray_chain_us(chain: int, repeats: int) -> tuple[list[float], list[float]]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        @ray.remote  # type: ignore[untyped-decorator, unused-ignore]  # typed where the bench extra is
        def step(x: np.ndarray) -> np.ndarray:
            import jax

            global _STEP
            try:
                f = _STEP  # type: ignore[name-defined]
            except NameError:
                f = _STEP = jax.jit(workloads.tiny)  # type: ignore[name-defined]
            return np.asarray(f(x))

        @ray.remote
        class Stepper:
            def __init__(self) -> None:
                import jax

                self.f = jax.jit(workloads.tiny)

            def step(self, x: np.ndarray) -> np.ndarray:
                return np.asarray(self.f(x))

        x = workloads.size_input(0)
        actor = Stepper.remote()  # type: ignore[attr-defined]

        def chain_tasks() -> float:
            ref: Any = x
            start = time.perf_counter()
            for _ in range(chain):
                ref = step.remote(ref)
            ray.get(ref)
            return (time.perf_counter() - start) / chain * 1e6

        def chain_actor() -> float:
            ref: Any = x
            start = time.perf_counter()
            for _ in range(chain):
                ref = actor.step.remote(ref)
            ray.get(ref)
            return (time.perf_counter() - start) / chain * 1e6

        chain_tasks(), chain_actor()  # warm workers and their jit caches
        return repeat(best_of(chain_tasks, BEST_OF), repeats), repeat(best_of(chain_actor, BEST_OF), repeats)
    finally:
        ray.shutdown()


def run(pathways_overhead_us: float, jax_us: float, chain: int, repeats: int,
        chained_samples: Sequence[float] = ()) -> list[Figure]:
    """Ray against Pathways Chained's overhead per computation (experiment 1's figure);
    ``chained_samples`` are Chained's repeats, for the verdict."""
    try:
        tasks, actors = _ray_chain_us(chain, repeats)
    except ImportError as err:
        return [Figure(EXP, "Ray", "", float("nan"), float("nan"), float("nan"), 0,
                       note=f"not run: {err} (pip install -e '.[bench]')")]
    pw_overhead = max(pathways_overhead_us, 1e-9)
    figures = []
    for name, samples, want in (("Ray actor calls", actors, 17.0), ("Ray tasks", tasks, 35.0)):
        f = figure(EXP, f"{name}: chain of tiny adds", "µs/comp", samples, baseline="Pathways Chained overhead",
                   baseline_samples=[s - jax_us for s in chained_samples])
        f.ratio = (f.median - jax_us) / pw_overhead
        f.target = f"overhead ≥ {want:g}× Pathways'"
        f.met = f.ratio >= want
        f.note = f"Pathways overhead {pw_overhead:.0f} µs/comp"
        figures.append(f)
    return figures
