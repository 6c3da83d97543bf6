"""The multi-controller JAX baseline of experiment 8: one process of a `jax.distributed` job.

`python -m bench.multi_controller --process-id I --processes N --coordinator ADDR
--devices D --steps S --repeats R`: every process of the job runs this, as a
multi-controller JAX program does (the same program on every host, each feeding
its own rows of the batch). The step is `bench.mlp.sgd_step` jitted over a mesh of
all N x D CPU devices, parameters replicated and the batch split over `x`, as the
Pathways slice runs it; collectives go through gloo. Process 0 prints one JSON
line: milliseconds per step for each repeat and the last loss.

A step is dispatched while at most `IN_FLIGHT` - 1 earlier ones still run. With
gloo's CPU collectives a long enough queue of dispatched steps never ends: on jax
0.10.2 with 2 processes x 4 devices, a repeat of 60 steps dispatched without waiting
hung in each of 3 tries (30 have not), as a Pathways multi-host slice's own chains
did (`pathways_worker.worker.host_state`, which keeps 2 in flight). With 8 in flight,
15 repeats of 60 steps ended; in 3 rounds of 5 repeats of 30 steps, taken in turns,
the plain loop and 8 in flight differed by less than their repeats did, so the
bound costs the baseline nothing its noise shows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque

IN_FLIGHT = 8
"""Steps dispatched and not yet done, at most: the step being dispatched included."""


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.multi_controller")
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--processes", type=int, required=True)
    p.add_argument("--coordinator", required=True)
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--repeats", type=int, required=True)
    p.add_argument("--in-flight", type=int, default=IN_FLIGHT)
    a = p.parse_args()
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={a.devices}"
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from bench import mlp

    jax.distributed.initialize(
        coordinator_address=a.coordinator, num_processes=a.processes, process_id=a.process_id,
        coordinator_bind_address=a.coordinator if a.process_id == 0 else None,
    )
    mesh = Mesh(np.array(jax.devices()), ("x",))
    replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("x"))
    step = jax.jit(mlp.sgd_step, in_shardings=(replicated, rows, rows),
                   out_shardings=(replicated, replicated))
    per_process = mlp.BATCH // a.processes
    mine = slice(a.process_id * per_process, (a.process_id + 1) * per_process)

    def global_batch(i: int) -> tuple[jax.Array, jax.Array]:
        x, y = mlp.batch(i)
        return (jax.make_array_from_process_local_data(rows, x[mine], x.shape),
                jax.make_array_from_process_local_data(rows, y[mine], y.shape))

    def replicate(v: np.ndarray) -> jax.Array:
        return jax.make_array_from_callback(v.shape, replicated, lambda idx: v[idx])

    params = {k: replicate(v) for k, v in mlp.init_params().items()}
    i = 0
    for _ in range(2):  # compile and warm
        params, loss = step(params, *global_batch(i))
        i += 1
    float(loss)
    times = []
    for _ in range(a.repeats):
        start = time.perf_counter()
        running: deque[jax.Array] = deque()
        for _ in range(a.steps):
            if len(running) >= a.in_flight:
                running.popleft().block_until_ready()
            params, loss = step(params, *global_batch(i))
            running.append(loss)
            i += 1
        last = float(loss)
        times.append((time.perf_counter() - start) / a.steps * 1e3)
    if a.process_id == 0:
        print(json.dumps({"ms_per_step": times, "loss": last, "steps": i}), flush=True)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
