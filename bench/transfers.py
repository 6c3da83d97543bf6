"""Experiment 4 (DCN stand-in): moving a sharded buffer between slices vs raw TCP and memcpy.

A buffer of S MiB is made on a 4-device slice (from a scalar, so no client
upload is timed), sharded over its devices, and consumed by a reduction on
another slice. The transfer time is that call's time minus the same call with
the reduction on the producing slice, each the fastest of a few alternating
calls; a repeat in which the move cost nothing measurable makes the figure
invalid rather than infinitely fast. Baselines, same bytes, same run: a raw
loopback TCP stream between two processes (`socket.sendall` / `recv_into`),
and `memcpy` (numpy copy) for two slices on one machine, each repeat the fastest of
`BASELINE_ROUNDS` sends or copies, as a move's repeat is the fastest of `ROUNDS` calls.

All local hosts share one machine, so "between islands" is measured with the
sidecars' file handover off (PATHWAYS_SIDECAR_FILE_HANDOVER=off): bytes then
cross the raw TCP data channel, as between real machines. "Between slices on
one island" keeps it on: pieces are handed over as files.

Floors, same run: what the machine allows the path. Writing into fresh
/dev/shm pages, into a warm file through a populated mapping, and mapping a
file populated: in sequence, what a file's first trip between two hosts on one
node costs. A file that comes back is written and read through the mappings
both hosts kept from its last trip (`shared_memory.KeptMaps`), so the least a
move on one node costs is one copy into a warm file through a kept mapping. The fixed cost of a move
between islands is the same moved-minus-stayed time for a 4 KiB value: the
hops between processes that every move pays whatever its size. Its floor is
those hand-offs with no runtime behind them: a 4 KiB message relayed along a
chain of processes and back (`bench.floors`), as many hops as a move hands its
value on, over raw loopback TCP (what a move's hops are: the worker's session port,
the data channel) and, beside it, over gRPC streams (what the hops between worker
and sidecar were before the session port). Beside them, a profile of the same
4 KiB move: the CPU each process of the embedded cluster spends on a moved call
beyond the stayed one (`bench.floors.profile`, their repeats in turns), and that
CPU over the machine's cores: the least time the move's work takes, however well
its processes overlap.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import socket
import time
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways as pw
from bench import floors
from bench.floors import RelayChain, TcpRelayChain
from bench.measure import Figure, best_of, figure, timed

EXP = "4 transfers"
MIB = 1 << 20
HANDOVER_ENV = "PATHWAYS_SIDECAR_FILE_HANDOVER"
CROSS_TARGETS = {1: 0.25}
"""Share of raw TCP a move between islands must reach, by size in MiB (else 0.5):
a small value pays the fixed cost of a move on few bytes."""
MOVE_HOPS = 8
"""Hand-offs between threads and processes of a move between islands: the producer's
finisher, worker→sidecar session, data channel, the consumer sidecar's inbox and session
writer, sidecar→worker session, the worker's executor thread, dispatch."""
RELAY_ROUNDS = 100
ROUNDS = 3
"""Moved and stayed calls per repeat, alternating; a repeat's cost of the move is the
fastest moved call less the fastest stayed one, as noise only ever adds time."""
BASELINE_ROUNDS = 10
"""Sends or copies per repeat of a baseline, whose repeat is the fastest of them: the
fastest of a few, as a move's repeat is, and more of them, as one costs far less than a
call (a 1 MiB send on loopback is either fast or about half as fast, by where the
scheduler puts its receiver)."""
PROFILE_CALLS = 200
"""Moved and stayed calls per repeat of the move's CPU profile: a 10 ms tick over 200
calls is 50 µs a call."""
NO_COST = float("inf")
"""The rate of a repeat in which the moved call was no slower than the stayed one: the
move's cost drowned in the noise. A figure with such a repeat is invalid, not met."""


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
    proc = ctx.Process(target=_receiver, args=(q, nbytes, (repeats + 1) * BASELINE_ROUNDS), daemon=True)
    proc.start()
    sock = socket.create_connection(("127.0.0.1", q.get(timeout=30)))
    data = np.ones(nbytes, np.uint8).tobytes()

    def send() -> None:
        sock.sendall(data)
        sock.recv(1)

    fastest = best_of(lambda: timed(send), BASELINE_ROUNDS)
    out = [nbytes / fastest() / 1e9 for _ in range(repeats + 1)][1:]
    sock.close()
    proc.join(10)
    return out


def memcpy_gbps(nbytes: int, repeats: int) -> list[float]:
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    fastest = best_of(lambda: timed(lambda: np.copyto(dst, src)), BASELINE_ROUNDS)
    return [nbytes / fastest() / 1e9 for _ in range(repeats + 1)][1:]


SHM = "/dev/shm"
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _shm_file(nbytes: int, warm: bool) -> tuple[str, int]:
    """A new /dev/shm file; `warm`: its pages allocated and zeroed (as a pool's are)."""
    path = os.path.join(SHM, f"bench-floor-{os.getpid()}-{time.perf_counter_ns()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    if warm:
        os.posix_fallocate(fd, 0, nbytes)
        mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | _POPULATE).close()
    return path, fd


def _floor_samples(nbytes: int, repeats: int, step: Any, written: bool = False) -> list[float]:
    """GB/s of `step(src, fd)` on a warm file made before the clock starts
    (`written`: and written once, as a file a consumer maps has been)."""
    src = np.ones(nbytes, np.uint8)
    out = []
    for _ in range(repeats + 1):
        path, fd = _shm_file(nbytes, warm=True)
        if written:
            _warm_write(src, fd)
        try:
            start = time.perf_counter()
            step(src, fd)
            out.append(nbytes / (time.perf_counter() - start) / 1e9)
        finally:
            os.close(fd)
            os.unlink(path)
    return out[1:]


def fresh_shm_gbps(nbytes: int, repeats: int) -> list[float]:
    """Writing into a new /dev/shm file: a fault and a zeroed page per 4 KiB."""
    src = np.ones(nbytes, np.uint8)
    out = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        path, fd = _shm_file(nbytes, warm=False)
        try:
            os.pwrite(fd, src.data, 0)
            out.append(nbytes / (time.perf_counter() - start) / 1e9)
        finally:
            os.close(fd)
            os.unlink(path)
    return out[1:]


def _warm_write(src: np.ndarray, fd: int) -> None:
    with mmap.mmap(fd, src.nbytes, flags=mmap.MAP_SHARED | _POPULATE) as m:
        dst = np.frombuffer(m, np.uint8)
        np.copyto(dst, src)
        del dst


def _populated_map(src: np.ndarray, fd: int) -> None:
    m = mmap.mmap(fd, src.nbytes, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    m.close()


def kept_write_gbps(nbytes: int, repeats: int) -> list[float]:
    """Writing into a warm file through a populated mapping made before the clock
    starts, as a file's writer keeps it for the file's next trip: one copy, no mapping."""
    src = np.ones(nbytes, np.uint8)
    path, fd = _shm_file(nbytes, warm=True)
    out = []
    try:
        with mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | _POPULATE) as m:
            dst = np.frombuffer(m, np.uint8)
            for _ in range(repeats + 1):
                start = time.perf_counter()
                np.copyto(dst, src)
                out.append(nbytes / (time.perf_counter() - start) / 1e9)
            del dst  # a mapping with a live export cannot be closed
    finally:
        os.close(fd)
        os.unlink(path)
    return out[1:]


def _write_then_map(src: np.ndarray, fd: int) -> None:
    _warm_write(src, fd)
    _populated_map(src, fd)


def warm_shm_gbps(nbytes: int, repeats: int) -> list[float]:
    return _floor_samples(nbytes, repeats, _warm_write)


def populated_map_gbps(nbytes: int, repeats: int) -> list[float]:
    return _floor_samples(nbytes, repeats, _populated_map, written=True)


def one_node_floor_gbps(nbytes: int, repeats: int) -> list[float]:
    return _floor_samples(nbytes, repeats, _write_then_map)


def _programs(mib: int, producer: Any, consumer: Any, rows: int = 0) -> tuple[Any, Any]:
    rows = rows or mib * MIB // 4 // 256

    def make(seed: Any) -> Any:
        return jnp.full((rows, 256), 1.0, jnp.float32) * seed

    def reduce(v: Any) -> Any:
        return jnp.sum(v, axis=0)

    make_a = pw.jit(make, slice=producer, out_shardings=P("x"))
    reduce_a = pw.jit(reduce, slice=producer, in_shardings=P("x"), out_shardings=P())
    reduce_b = pw.jit(reduce, slice=consumer, in_shardings=P("x"), out_shardings=P())

    @pw.program(name=f"move-{mib}-{rows}-{id(consumer)}")
    def moved(seed: Any) -> Any:
        return reduce_b(make_a(seed))

    @pw.program(name=f"stay-{mib}-{rows}-{id(consumer)}")
    def stayed(seed: Any) -> Any:
        return reduce_a(make_a(seed))

    return moved, stayed


def _move_seconds(moved: Any, stayed: Any, repeats: int) -> list[float]:
    """Per repeat, the fastest of `ROUNDS` moved calls less the fastest of as many stayed
    calls, alternating (zero or below: the noise hid the move's cost)."""
    seed = np.float32(2.0)
    moved(seed).block_until_ready(), stayed(seed).block_until_ready()
    out = []
    for _ in range(repeats):
        moves, stays = [], []
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            stayed(seed).block_until_ready()
            t1 = time.perf_counter()
            moved(seed).block_until_ready()
            t2 = time.perf_counter()
            stays.append(t1 - t0)
            moves.append(t2 - t1)
        out.append(min(moves) - min(stays))
    return out


def _slice_gbps(mib: int, moved: Any, stayed: Any, repeats: int) -> list[float]:
    return [mib * MIB / s / 1e9 if s > 0 else NO_COST for s in _move_seconds(moved, stayed, repeats)]


def move_cpu(moved: Any, stayed: Any, repeats: int) -> list[Figure]:
    """The CPU of each role of the embedded cluster per moved call beyond the stayed one
    (a repeat of each in turn, `PROFILE_CALLS` calls), and all of it over the cores."""
    seed = np.float32(2.0)
    pids = floors.cluster_pids(pw.default_runtime())  # after the calls that started the hosts

    def calls(program: Any) -> Any:
        def run() -> int:
            for _ in range(PROFILE_CALLS):
                program(seed).block_until_ready()
            return PROFILE_CALLS
        return run

    extra: dict[str, list[float]] = {role: [] for role in pids}
    for _ in range(repeats):
        stays = floors.profile(pids, calls(stayed), 1)
        moves = floors.profile(pids, calls(moved), 1)
        for role in pids:
            extra[role].append(moves[role][0] - stays[role][0])
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK") / PROFILE_CALLS
    out = []
    for role, samples in extra.items():
        f = figure(EXP, f"CPU of a 4 KiB move between islands beyond the same call without it, {role}", "µs",
                   samples)
        f.note = (f"{len(pids[role])} process(es), /proc/<pid>/stat utime+stime over {PROFILE_CALLS} calls "
                  f"per repeat, resolution {tick_us:.0f} µs")
        out.append(f)
    total = floors.all_roles(extra)
    out.append(figure(EXP, "CPU of a 4 KiB move between islands beyond the same call without it, all processes",
                      "µs", total))
    cores = os.cpu_count() or 1
    out.append(figure(
        EXP, f"floor of a move's fixed cost: its CPU over the machine's {cores} cores", "ms",
        [t / cores / 1e3 for t in total],
        note="the least time the move's work takes, however well its processes overlap",
    ))
    return out


def judged_move(f: Figure) -> Figure:
    """A move's rate is finite in every repeat that measured its cost (see `NO_COST`)."""
    f.limit = float(np.finfo(np.float64).max)
    f.limit_reason = "a repeat's moved call was no slower than its stayed call: the move's cost was lost in the noise"
    return f


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
    floors: list[Figure] = []
    big = max(sizes_mib) * MIB
    for name, fn in (
        ("written into fresh /dev/shm pages", fresh_shm_gbps),
        ("written into a warm /dev/shm file through a populated mapping", warm_shm_gbps),
        ("mapped populated from /dev/shm", populated_map_gbps),
        ("first trip of a file between two hosts on one node: warm write, then populated map",
         one_node_floor_gbps),
        ("floor of a move on one node: written into a warm file through a kept mapping", kept_write_gbps),
    ):
        floors.append(figure(EXP, f"{max(sizes_mib)} MiB {name}", "GB/s", fn(big, repeats)))
    with RelayChain(MOVE_HOPS // 2) as chain:
        trip = chain.stream_round_trip_us(4096, RELAY_ROUNDS, repeats)
        hops = chain.hops
    with TcpRelayChain(MOVE_HOPS // 2) as tcp_chain:
        tcp_trip = tcp_chain.round_trip_us(4096, RELAY_ROUNDS, repeats)
    a, b = _slices(handover=False)
    small = _programs(0, a, b, rows=4)
    fixed = figure(EXP, "fixed cost of a move between islands (4 KiB value)", "ms",
                   [s * 1e3 for s in _move_seconds(*small, repeats)])
    floors.append(fixed)
    floors += move_cpu(*small, repeats)
    for how, trips in (("raw TCP", tcp_trip), ("gRPC", trip)):
        hop = figure(EXP, f"floor: one hop of a 4 KiB message between processes over loopback {how}", "µs",
                     [t / hops for t in trips])
        hop.note = (f"relayed through {hops // 2} processes and back, mean of {RELAY_ROUNDS} per repeat; "
                    f"{MOVE_HOPS} hops: {hop.median * MOVE_HOPS / 1e3:.2f} ms, the move's fixed cost "
                    f"{fixed.median:.2f} ms")
        floors.append(hop)
    for mib in sizes_mib:
        tcp[mib] = figure(EXP, f"{mib} MiB raw loopback TCP", "GB/s", tcp_gbps(mib * MIB, repeats),
                          note=f"a repeat: the fastest of {BASELINE_ROUNDS} sends (a move's: of {ROUNDS} calls)")
        mem[mib] = figure(EXP, f"{mib} MiB memcpy", "GB/s", memcpy_gbps(mib * MIB, repeats),
                          note=f"a repeat: the fastest of {BASELINE_ROUNDS} copies (a move's: of {ROUNDS} calls)")
        f = cross[mib] = judged_move(figure(
            EXP, f"{mib} MiB between islands (data channel)", "GB/s",
            _slice_gbps(mib, *_programs(mib, a, b), repeats), baseline="raw TCP",
            baseline_samples=tcp[mib].samples))
        f.ratio = f.median / tcp[mib].median
        share = CROSS_TARGETS.get(mib, 0.5)
        f.target, f.met = f"≥ {share:g}× raw TCP", f.ratio >= share
    pw.shutdown()
    a, a2 = _slices(handover=True)
    for mib in sizes_mib:
        f = same[mib] = judged_move(figure(
            EXP, f"{mib} MiB between slices on one island (file handover)", "GB/s",
            _slice_gbps(mib, *_programs(mib, a, a2), repeats), baseline="memcpy",
            baseline_samples=mem[mib].samples))
        f.ratio = f.median / mem[mib].median
        f.target, f.met = "≥ 0.5× memcpy", f.ratio >= 0.5
    pw.shutdown()
    return [f for mib in sizes_mib for f in (tcp[mib], mem[mib], cross[mib], same[mib])] + floors
