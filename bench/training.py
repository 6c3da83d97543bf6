"""Experiment 8: data-parallel training of `bench.mlp` against JAX itself, side by side.

(a) a 1-device slice against `jax.jit` in this process, their repeats taken in turns;
(b) an 8-device slice of 2 hosts against multi-controller JAX running the same sharded
    step: 2 processes of 4 CPU devices, `jax.distributed` with gloo
    (`bench.multi_controller`);
(c) the value bytes through the client per step (`Runtime.traffic`), beside the
    batch's own size: what keeping parameters on the hosts drives down.

What stops (a) on a machine of few cores, same run: the CPU each step costs. After
the timed repeats, `PROFILE_STEPS` more steps per repeat are run with the CPU of every
process read from `/proc/<pid>/stat` before and after (`bench.floors.profile`): this
process for `jax.jit`; this client, the controller, the worker and the sidecar for
the slice. All of it divided by the machine's cores is the least time a step with
that CPU can take, however well the processes overlap: (a)'s floor on this machine.
That floor assumes the control processes' CPU fills the cores' idle moments; it does
not, as XLA's threads want every core at once. So the same CPU is then burnt without
the runtime (`bench.floors.BackgroundLoad`: the slice's CPU per step beyond `jax.jit`'s,
as a share of the cores at (a)'s step time) beside `jax.jit` alone, the two timed in
turns: what that much CPU beside the computation costs `jax.jit` itself.

What the batch's trip costs (a), same run: after each of (a)'s repeats, as many steps of
a second training from (a)'s start whose batches an identity computation left on the slice
beforehand, so no step sends one; their time against `jax.jit`'s, and the CPU each process
spends per step then, show how much of (a)'s overhead is the batch going client →
sidecar → worker every step.

Every setup trains from the same parameters on the same batches for the same number of
steps, and the note of each row gives both final losses, so a row whose computation
differs shows. Batches are made before the clock starts.
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways as pw
from bench import floors, mlp
from bench.measure import Figure, figure

EXP = "8 training"
WARM_STEPS = 2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE_TIMEOUT_S = 600.0
PROFILE_STEPS = 40
"""Steps per repeat of the CPU profile of (a): a 10 ms tick over 40 steps is 0.25 ms a step."""
SETTLE_S = 1.0
"""Quiet time before each of the baseline's repeats taken in turns (see `_JaxJit.repeat`)."""
LOAD_STEPS = 40
"""Steps per repeat of `jax.jit` alone and beside the background load."""


def load_processes(cores: float) -> int:
    """Burners for `cores` of background load: two, or one per core where it takes more
    (a 16-core machine's slice burnt 2.7 cores beyond jax.jit's)."""
    return max(2, math.ceil(cores))


def _jit_beside_load(cores: float, steps: int, repeats: int) -> tuple[list[float], list[float]]:
    """`jax.jit`'s ms per step alone and beside `cores` of background load, a repeat of each in turn."""
    jit = _JaxJit(steps, 2 * repeats, settle_s=0.0)
    for _ in range(repeats):
        jit.repeat()
        with floors.BackgroundLoad(cores, processes=load_processes(cores)):
            jit.repeat()
    return jit.times[0::2], jit.times[1::2]


def _batches(count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [mlp.batch(i) for i in range(count)]


class _JaxJit:
    """`jax.jit` training in this process, a repeat at a time, so that its repeats can take
    turns with another setup's: on a machine whose speed drifts over tens of seconds, two
    setups timed one after the other differ by the drift, not only by themselves."""

    def __init__(self, steps: int, repeats: int, settle_s: float = SETTLE_S) -> None:
        self._step = jax.jit(mlp.sgd_step)
        self._steps = steps
        self._settle_s = settle_s
        self._data = _batches(WARM_STEPS + steps * repeats)
        self.params: Any = jax.device_put(mlp.init_params())
        for x, y in self._data[:WARM_STEPS]:
            self.params, loss = self._step(self.params, x, y)
        float(loss)
        self._next = WARM_STEPS
        self.times: list[float] = []
        self.last = float("nan")

    def repeat(self) -> None:
        """The next `steps` steps, timed to their last loss, once the runtime's processes
        had `settle_s` (`SETTLE_S`) to finish what the other setup's repeat left them (its
        calls' releases, their last completions): timed at once, `jax.jit` read 13.1 ms a
        step where alone it read 11.5."""
        time.sleep(self._settle_s)
        batches = self._data[self._next:self._next + self._steps]
        start = time.perf_counter()
        for x, y in batches:
            self.params, loss = self._step(self.params, x, y)
        self.last = float(loss)
        self.times.append((time.perf_counter() - start) / len(batches) * 1e3)
        self._next += self._steps

    def step_cpu(self, profile_steps: int, repeats: int) -> list[float]:
        """This process's ms of CPU per step over `profile_steps` more steps per repeat."""
        cpu = _step_cpu({"jax.jit": [os.getpid()]}, self._step, self.params, self._data, profile_steps, repeats)
        return cpu.get("jax.jit", [])


def _step_cpu(
    pids: dict[str, list[int]], step: Any, params: Any, data: list[tuple[np.ndarray, np.ndarray]],
    profile_steps: int, repeats: int,
) -> dict[str, list[float]]:
    """ms of CPU per training step of each role's processes, per repeat of `profile_steps`
    more steps from `params` (none when `profile_steps` is 0)."""
    if not profile_steps:
        return {}

    def more_steps() -> int:
        nonlocal params
        for k in range(profile_steps):
            x, y = data[k % len(data)]
            params, loss = step(params, x, y)
        float(np.asarray(loss))
        return profile_steps

    return floors.profile_ms(pids, more_steps, repeats)


LOSS_BYTES = 4
"""A float32 loss: what each repeat fetches to learn where training stands."""


@dataclass
class _Resident:
    """(a) again with each step's batch already on the slice: ms per step of each repeat,
    and each process's ms of CPU per step, by role."""

    times: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=dict)


def _pathways(
    devices: int, steps: int, repeats: int, profile_steps: int = 0,
    in_turns: Callable[[], None] | None = None, resident: _Resident | None = None,
) -> tuple[list[float], float, pw.ClientTraffic, dict[str, list[float]]]:
    """ms per step of each repeat, the final loss, the client's traffic over the timed
    steps, and (``profile_steps`` > 0) each process's ms of CPU per step, by role, over
    that many more steps per repeat. `in_turns` runs before each repeat: the baseline's
    own repeat, so the two take turns. With `resident`, each repeat is followed by as many
    steps whose batches were put on the slice beforehand (the outputs of an identity
    computation, so no step sends one), timed into `resident`, and profiled likewise."""
    vslice = pw.make_virtual_device_set().add_slice(devices=devices)
    step_fn = pw.jit(mlp.sgd_step, slice=vslice, in_shardings=(None, P("x"), P("x")),
                     out_shardings=(None, None))
    keep = pw.jit(lambda x, y: (x + 0.0, y + 0.0), slice=vslice, in_shardings=(P("x"), P("x")),
                  out_shardings=(P("x"), P("x")))

    @pw.program(name=f"mlp-step-{devices}")
    def train(params: Any, x: Any, y: Any) -> Any:
        return step_fn(params, x, y)

    @pw.program(name=f"mlp-batch-{devices}")
    def put_batch(x: Any, y: Any) -> Any:
        return keep(x, y)

    data = _batches(WARM_STEPS + steps * repeats)
    on_slice = [put_batch(x, y) for x, y in data[WARM_STEPS:WARM_STEPS + steps]] if resident else []
    params: Any = mlp.init_params()
    for x, y in data[:WARM_STEPS]:
        params, loss = train(params, x, y)
    float(np.asarray(loss))
    resident_params = params  # a training of its own, so (a)'s losses stay jax.jit's
    runtime = pw.default_runtime()
    traffic = pw.ClientTraffic()
    times, i = [], WARM_STEPS
    for _ in range(repeats):
        if in_turns is not None:
            in_turns()
        before = runtime.traffic
        start = time.perf_counter()
        for x, y in data[i:i + steps]:
            params, loss = train(params, x, y)
        last = float(np.asarray(loss))
        times.append((time.perf_counter() - start) / steps * 1e3)
        traffic += runtime.traffic - before
        i += steps
        if resident is not None:
            start = time.perf_counter()
            for x, y in on_slice:
                resident_params, resident_loss = train(resident_params, x, y)
            float(np.asarray(resident_loss))
            resident.times.append((time.perf_counter() - start) / steps * 1e3)
    pids = floors.cluster_pids(runtime)
    cpu = _step_cpu(pids, train, params, data, profile_steps, repeats)
    if resident is not None:
        resident.cpu = _step_cpu(pids, train, resident_params, on_slice, profile_steps, repeats)
    return times, last, traffic, cpu


def _coordinator() -> str:
    """An address for the baseline's JAX coordinator.

    jax.distributed's coordination service takes a fixed port and cannot report one
    it chose, so the port is found by binding 0; the address is a random one of
    127.0.0.0/8, where nothing else of this machine's binds, to keep the gap harmless.
    """
    ip = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}.{random.randint(2, 250)}"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return f"{ip}:{s.getsockname()[1]}"


def _multi_controller(processes: int, devices: int, steps: int, repeats: int) -> tuple[list[float], float]:
    coordinator = _coordinator()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.multi_controller", "--process-id", str(i),
             "--processes", str(processes), "--coordinator", coordinator, "--devices", str(devices),
             "--steps", str(steps), "--repeats", str(repeats)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(processes)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=BASELINE_TIMEOUT_S)
            if proc.returncode != 0:
                raise RuntimeError(f"multi-controller process exited {proc.returncode}: {err[-2000:]}")
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result = json.loads(outputs[0].strip().splitlines()[-1])
    return [float(t) for t in result["ms_per_step"]], float(result["loss"])


def _against(name: str, samples: list[float], baseline: Figure, short: str, limit: float,
             target: str, note: str) -> Figure:
    f = figure(EXP, name, "ms/step", samples, baseline=short, baseline_samples=baseline.samples)
    f.ratio = f.median / baseline.median
    f.target, f.met, f.note = target, f.ratio <= limit, note
    return f


def _cpu_figures(jit_cpu: list[float], cpu: dict[str, list[float]], base: Figure, a: Figure) -> list[Figure]:
    """(a)'s CPU per step, `jax.jit`'s and each process's of the slice, and the floor it sets."""
    cores = os.cpu_count() or 1
    how = floors.per_step_note(PROFILE_STEPS)
    out = [figure(EXP, "(a) CPU per step: jax.jit's process", "ms CPU/step", jit_cpu, note=how)]
    for role, samples in cpu.items():
        out.append(figure(EXP, f"(a) CPU per step: the 1-device slice's {role}", "ms CPU/step", samples,
                          note=how))
    total = floors.all_roles(cpu)
    out.append(figure(EXP, "(a) CPU per step: all processes of the 1-device slice", "ms CPU/step", total,
                      baseline="jax.jit's process", baseline_samples=jit_cpu,
                      ratio=statistics.median(total) / statistics.median(jit_cpu)))
    floor = [t / cores for t in total]
    out.append(figure(EXP, f"(a) floor: the slice's CPU per step over {cores} cores", "ms/step", floor,
                      baseline="jax.jit", baseline_samples=base.samples,
                      ratio=statistics.median(floor) / base.median,
                      note=f"the least step time this CPU allows, however well the processes "
                           f"overlap; (a) takes {a.median:.1f} ms/step"))
    extra_ms = statistics.median(total) - statistics.median(jit_cpu)
    load = min(extra_ms / a.median, float(cores))
    if load > 0:
        alone, loaded = _jit_beside_load(load, LOAD_STEPS, len(a.samples))
        out.append(figure(EXP, "(a) jax.jit alone, timed in turns with the row below", "ms/step", alone))
        out.append(figure(
            EXP, f"(a) floor: jax.jit beside {load:.2f} cores of background load", "ms/step", loaded,
            baseline="jax.jit alone, in turns", baseline_samples=alone,
            ratio=statistics.median(loaded) / statistics.median(alone),
            note=f"the slice's CPU per step beyond jax.jit's ({extra_ms:.1f} ms) over (a)'s step time, "
                 f"burnt in 1 ms cycles by {load_processes(load)} processes (bench.floors.BackgroundLoad); (a) reads "
                 f"{a.ratio:.2f}× jax.jit",
        ))
    return out


def _resident_figures(resident: _Resident, cpu: dict[str, list[float]], base: Figure, a: Figure) -> list[Figure]:
    """What the batch's trip from the client costs (a): the same steps with each batch
    already on the slice, timed in turns with (a) and jax.jit, and the CPU per step each
    process of the slice spends then."""
    f = figure(EXP, "(a) floor: the 1-device slice with each step's batch already on it", "ms/step",
               resident.times, baseline="jax.jit", baseline_samples=base.samples,
               ratio=statistics.median(resident.times) / base.median,
               note=f"each repeat right after (a)'s, on batches an identity computation left on the slice "
                    f"beforehand, training parameters of its own from (a)'s start; (a) reads "
                    f"{a.ratio:.2f}× jax.jit: the rest is the batch's trip, "
                    f"{a.median - statistics.median(resident.times):.2f} ms/step")
    out = [f]
    how = floors.per_step_note(PROFILE_STEPS)
    for role, samples in resident.cpu.items():
        beyond = statistics.median(cpu[role]) - statistics.median(samples) if role in cpu else float("nan")
        out.append(figure(EXP, f"(a) CPU per step with the batch already on the slice: its {role}",
                          "ms CPU/step", samples, note=f"{how}; (a)'s {role} spends {beyond:.2f} ms more"))
    return out


def run(steps: int, repeats: int) -> list[Figure]:
    batch_kib = mlp.batch_bytes() / 1024
    params_mib = mlp.param_bytes(mlp.init_params()) / 2**20

    jit = _JaxJit(steps, repeats)
    pw.connect(islands={"island-a": 8}, devices_per_host=4)
    resident = _Resident()
    one_ms, one_loss, one_traffic, one_cpu = _pathways(
        1, steps, repeats, PROFILE_STEPS, in_turns=jit.repeat, resident=resident,
    )
    jit_ms, jit_loss, jit_cpu = jit.times, jit.last, jit.step_cpu(PROFILE_STEPS, repeats)
    base_a = figure(EXP, "jax.jit, one process, 1 device (repeats in turns with (a)'s)", "ms/step", jit_ms)
    a = _against("(a) 1-device slice", one_ms, base_a, "jax.jit", 1.2, "≤ 1.2× jax.jit",
                 f"final loss {one_loss:.6f} (jax.jit {jit_loss:.6f}); {params_mib:.1f} MiB of parameters")
    profile_a = _cpu_figures(jit_cpu, one_cpu, base_a, a) + _resident_figures(resident, one_cpu, base_a, a)

    mc_ms, mc_loss = _multi_controller(2, 4, steps, repeats)
    base_b = figure(EXP, "multi-controller JAX, 2 processes x 4 devices (gloo)", "ms/step", mc_ms)
    pw.connect(islands={"island-a": 8}, devices_per_host=4)
    eight_ms, eight_loss, eight_traffic, _ = _pathways(8, steps, repeats)
    b = _against("(b) 8-device slice, 2 hosts x 4", eight_ms, base_b, "multi-controller", 1.1,
                 "≤ 1.1× multi-controller (paper: parity)",
                 f"final loss {eight_loss:.6f} (multi-controller {mc_loss:.6f})")
    pw.shutdown()

    figures = [base_a, a, *profile_a, base_b, b]
    timed_steps = steps * repeats
    fetched = LOSS_BYTES * repeats  # each repeat ends by fetching its loss, as a user would
    for label, traffic in (("1-device", one_traffic), ("8-device", eight_traffic)):
        per_step_kib = (traffic.total - fetched) / timed_steps / 1024
        c = Figure(EXP, f"(c) bytes through the client per step, {label} slice", "KiB/step",
                   per_step_kib, per_step_kib, per_step_kib, 1, baseline="the batch",
                   ratio=per_step_kib / batch_kib, target="only the batch (1.0×)",
                   met=traffic.total - fetched <= mlp.batch_bytes() * timed_steps,
                   counted=True, baseline_exact=True)
        c.note = (f"sent {traffic.sent / timed_steps / 1024:.0f} KiB per step; received "
                  f"{traffic.received} B in all, of which {fetched} B are the {repeats} losses the "
                  f"bench fetched (not counted); the batch is {batch_kib:.0f} KiB; counted over "
                  f"{timed_steps} steps")
        figures.append(c)
    return figures
