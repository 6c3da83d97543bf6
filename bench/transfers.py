"""Experiment 4 (DCN stand-in): moving a sharded buffer between slices vs raw TCP and memcpy.

A buffer of S MiB is made on a 4-device slice (from a scalar, so no client
upload is timed), sharded over its devices, and consumed by a reduction on
another slice. The transfer time is that call's time minus the same call with
the reduction on the producing slice. Baselines, same bytes, same run: a raw
loopback TCP stream between two processes (`socket.sendall` / `recv_into`),
and `memcpy` (numpy copy) for two slices on one machine.

All local hosts share one machine, so "between islands" is measured with the
sidecars' file handover off (PATHWAYS_SIDECAR_FILE_HANDOVER=off): bytes then
cross the raw TCP data channel, as between real machines. "Between slices on
one island" keeps it on: pieces are handed over as files.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways as pw
from bench.measure import Figure, figure

EXP = "4 transfers"
MIB = 1 << 20
HANDOVER_ENV = "PATHWAYS_SIDECAR_FILE_HANDOVER"


def _receiver(port_q: Any, nbytes: int, rounds: int) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    buf = bytearray(nbytes)
    view = memoryview(buf)
    for _ in range(rounds):
        got = 0
        while got < nbytes:
            n = conn.recv_into(view[got:], min(nbytes - got, 4 * MIB))
            if not n:
                return
            got += n
        conn.sendall(b"k")
    conn.close()


def tcp_gbps(nbytes: int, repeats: int) -> list[float]:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(q, nbytes, repeats + 1), daemon=True)
    proc.start()
    sock = socket.create_connection(("127.0.0.1", q.get(timeout=30)))
    data = np.ones(nbytes, np.uint8).tobytes()
    out = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        sock.sendall(data)
        sock.recv(1)
        if i:
            out.append(nbytes / (time.perf_counter() - start) / 1e9)
    sock.close()
    proc.join(10)
    return out


def memcpy_gbps(nbytes: int, repeats: int) -> list[float]:
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    out = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        np.copyto(dst, src)
        out.append(nbytes / (time.perf_counter() - start) / 1e9)
    return out[1:]


def _programs(mib: int, producer: Any, consumer: Any) -> tuple[Any, Any]:
    rows = mib * MIB // 4 // 256

    def make(seed: Any) -> Any:
        return jnp.full((rows, 256), 1.0, jnp.float32) * seed

    def reduce(v: Any) -> Any:
        return jnp.sum(v, axis=0)

    make_a = pw.jit(make, slice=producer, out_shardings=P("x"))
    reduce_a = pw.jit(reduce, slice=producer, in_shardings=P("x"), out_shardings=P())
    reduce_b = pw.jit(reduce, slice=consumer, in_shardings=P("x"), out_shardings=P())

    @pw.program(name=f"move-{mib}-{id(consumer)}")
    def moved(seed: Any) -> Any:
        return reduce_b(make_a(seed))

    @pw.program(name=f"stay-{mib}-{id(consumer)}")
    def stayed(seed: Any) -> Any:
        return reduce_a(make_a(seed))

    return moved, stayed


def _slice_gbps(mib: int, moved: Any, stayed: Any, repeats: int) -> list[float]:
    seed = np.float32(2.0)
    moved(seed), stayed(seed)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        stayed(seed)
        t1 = time.perf_counter()
        moved(seed)
        t2 = time.perf_counter()
        out.append(mib * MIB / max((t2 - t1) - (t1 - t0), 1e-6) / 1e9)
    return out


def _slices(handover: bool) -> tuple[Any, Any]:
    """Connects a fresh local cluster; two slices, on two islands or on one."""
    saved = os.environ.get(HANDOVER_ENV)
    os.environ[HANDOVER_ENV] = "on" if handover else "off"
    try:
        pw.connect(islands={"island-a": 8, "island-b": 8}, devices_per_host=4)
    finally:
        if saved is None:
            del os.environ[HANDOVER_ENV]
        else:
            os.environ[HANDOVER_ENV] = saved
    device_set = pw.make_virtual_device_set()
    a = device_set.add_slice(devices=4, island="island-a")
    b = device_set.add_slice(devices=4, island="island-a" if handover else "island-b")
    return a, b


def run(sizes_mib: tuple[int, ...], repeats: int) -> list[Figure]:
    tcp: dict[int, Figure] = {}
    mem: dict[int, Figure] = {}
    cross: dict[int, Figure] = {}
    same: dict[int, Figure] = {}
    a, b = _slices(handover=False)
    for mib in sizes_mib:
        tcp[mib] = figure(EXP, f"{mib} MiB raw loopback TCP", "GB/s", tcp_gbps(mib * MIB, repeats))
        mem[mib] = figure(EXP, f"{mib} MiB memcpy", "GB/s", memcpy_gbps(mib * MIB, repeats))
        f = cross[mib] = figure(EXP, f"{mib} MiB between islands (data channel)", "GB/s",
                                _slice_gbps(mib, *_programs(mib, a, b), repeats), baseline="raw TCP",
                                baseline_samples=tcp[mib].samples)
        f.ratio = f.median / tcp[mib].median
        f.target, f.met = "≥ 0.5× raw TCP", f.ratio >= 0.5
    pw.shutdown()
    a, a2 = _slices(handover=True)
    for mib in sizes_mib:
        f = same[mib] = figure(EXP, f"{mib} MiB between slices on one island (file handover)", "GB/s",
                               _slice_gbps(mib, *_programs(mib, a, a2), repeats), baseline="memcpy",
                               baseline_samples=mem[mib].samples)
        f.ratio = f.median / mem[mib].median
        f.target, f.met = "≥ 0.5× memcpy", f.ratio >= 0.5
    pw.shutdown()
    return [f for mib in sizes_mib for f in (tcp[mib], mem[mib], cross[mib], same[mib])]
