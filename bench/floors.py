"""What stops a target this machine cannot reach: where the CPU goes, and what one hop costs.

A profile charges the embedded cluster's CPU to its processes (this client, the
controller, each host's worker and sidecar), read from `/proc/<pid>/stat` before
and after a run, so it counts every thread, gRPC's included. The floors are the
same hand-offs with no runtime behind them: one message between processes over
loopback gRPC, as a bidirectional stream and as a unary call, and over raw loopback
TCP read and written by one thread per process (the hosts' session and control
ports), echoed by the last of a chain of relaying processes. `BackgroundLoad` is the
CPU of a runtime's processes without the runtime: processes that burn a given share
of the cores in short bursts, beside a computation that wants all of them.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc

STREAM = "/floor.Relay/Stream"
UNARY = "/floor.Relay/Echo"
ROLES = ("client", "controller", "worker", "sidecar")
PID_FILES = {"worker": "worker.pid", "sidecar": "dataflow.pid"}
"""A host's processes as `local_hosts.host_run_dir` records them, by role."""


def stat_cpu_ticks(stat: str) -> int:
    """utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line, in clock ticks.

    The command name (field 2) is in parentheses and may hold spaces or parentheses,
    so fields are counted from the last ')'."""
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int) -> float:
    """CPU a process has used, all its threads, living and ended (a tick's resolution)."""
    return stat_cpu_ticks(Path(f"/proc/{pid}/stat").read_text()) / os.sysconf("SC_CLK_TCK")


def cluster_pids(runtime: Any) -> dict[str, list[int]]:
    """The embedded cluster's processes by role: this client, the controller it started,
    and the worker and sidecar of each host the controller has started."""
    cluster = runtime.cluster
    if cluster is None:
        raise ValueError("profile: the runtime has no embedded cluster; connect() without an address")
    pids: dict[str, list[int]] = {"client": [os.getpid()], "controller": [cluster.process.pid],
                                  "worker": [], "sidecar": []}
    for role, name in PID_FILES.items():
        for path in sorted((Path(cluster.state_dir) / "hosts").glob(f"*/{name}")):
            pids[role].append(int(path.read_text()))
    return pids


def profile(pids: dict[str, list[int]], run: Callable[[], int], repeats: int) -> dict[str, list[float]]:
    """µs of CPU per unit of work, by role, per repeat: `run()` does some work and returns
    how many units it did; each role's CPU is summed over its processes."""
    out: dict[str, list[float]] = {role: [] for role in pids}
    for _ in range(repeats):
        before = {role: sum(cpu_seconds(p) for p in ps) for role, ps in pids.items()}
        units = run()
        for role, ps in pids.items():
            out[role].append((sum(cpu_seconds(p) for p in ps) - before[role]) / units * 1e6)
    return out


def profile_ms(pids: dict[str, list[int]], run: Callable[[], int], repeats: int) -> dict[str, list[float]]:
    """`profile` in ms of CPU per unit (a training step's scale)."""
    return {role: [us / 1e3 for us in samples] for role, samples in profile(pids, run, repeats).items()}


def all_roles(cpu: dict[str, list[float]]) -> list[float]:
    """Each repeat's CPU of a `profile`, summed over every role."""
    return [sum(per_role) for per_role in zip(*cpu.values())]


def per_step_note(steps: int) -> str:
    """How a row of ms of CPU per step was read, with `steps` steps per repeat, and its resolution."""
    return (f"/proc/<pid>/stat utime+stime over {steps} steps per repeat, resolution "
            f"{1e3 / os.sysconf('SC_CLK_TCK') / steps:.2g} ms/step")


# ---------------------------------------------------------------- background load

LOAD_PERIOD_S = 0.001
"""A burner's cycle: busy, then asleep, for its share of every millisecond, as the
runtime's processes wake for each message and sleep between them."""
LOAD_LIMIT_S = 300.0
"""A burner stops by itself after this, whatever its parent does."""


def _burn(share: float, period_s: float, limit_s: float) -> None:
    """Busy for `share` of every `period_s`, asleep for the rest, for at most `limit_s`."""
    busy_s, idle_s = share * period_s, (1.0 - share) * period_s
    until = time.monotonic() + limit_s
    while time.monotonic() < until:
        start = time.perf_counter()
        while time.perf_counter() - start < busy_s:
            pass
        time.sleep(idle_s)


class BackgroundLoad:
    """`cores` of CPU burnt beside the caller while the context is open, by `processes`
    processes of at most one core each (each stops after `LOAD_LIMIT_S` at the latest)."""

    def __init__(self, cores: float, processes: int = 2) -> None:
        if not 0 < cores <= processes:
            raise ValueError(f"background load: {cores:g} cores cannot come from {processes} processes "
                             "of at most one core each")
        self.cores = cores
        self._share = cores / processes
        self._count = processes
        self._procs: list[Any] = []

    def __enter__(self) -> BackgroundLoad:
        ctx = multiprocessing.get_context("spawn")
        for _ in range(self._count):
            proc = ctx.Process(target=_burn, args=(self._share, LOAD_PERIOD_S, LOAD_LIMIT_S), daemon=True)
            proc.start()
            self._procs.append(proc)
        time.sleep(0.5)  # past the interpreters' start, so the load is on when the caller times
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.join(10)
        self._procs.clear()


# ---------------------------------------------------------------- the relay chain


def _serve_relay(port_q: Any, next_q: Any) -> None:
    """A process that echoes each message, or hands it to the next process and its answer back."""
    downstream: dict[str, Any] = {}

    def stream(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        target = downstream["address"]
        if not target:
            yield from requests
            return
        pending: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        with grpc.insecure_channel(target) as channel:
            answers = cast(Iterator[bytes], channel.stream_stream(STREAM, None, None)(iter(pending.get, None)))
            for message in requests:
                pending.put(message)
                yield next(answers)
            pending.put(None)

    server = grpc.server(ThreadPoolExecutor(max_workers=4), handlers=[grpc.method_handlers_generic_handler("floor.Relay", {
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
        "Echo": grpc.unary_unary_rpc_method_handler(lambda message, context: message),
    })])
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    downstream["address"] = next_q.get()
    server.wait_for_termination()


def _start_relays(serve: Callable[[Any, Any], None], processes: int, address: Callable[[int], Any],
                  last: Any) -> tuple[list[Any], list[Any]]:
    """`processes` relay processes running `serve(port_q, next_q)`, each told the address of
    the next (`last` for the last one): the processes and their addresses, in order."""
    ctx = multiprocessing.get_context("spawn")
    procs, ports, nexts = [], [], []
    for _ in range(processes):
        port_q, next_q = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=serve, args=(port_q, next_q), daemon=True)
        proc.start()
        procs.append(proc)
        ports.append(port_q)
        nexts.append(next_q)
    addresses = [address(q.get(timeout=60)) for q in ports]
    for next_q, downstream in zip(nexts, addresses[1:] + [last]):
        next_q.put(downstream)
    return procs, addresses


class RelayChain:
    """`processes` relays on loopback, each passing a message to the next; the last echoes it.

    A round trip crosses each of the `processes` links twice (a message out, its answer
    back), so it is `2 × processes` hops."""

    def __init__(self, processes: int) -> None:
        self.procs, ports = _start_relays(_serve_relay, processes, lambda port: f"127.0.0.1:{port}", "")
        self.hops = 2 * processes
        self.channel = grpc.insecure_channel(ports[0])
        grpc.channel_ready_future(self.channel).result(timeout=60)

    def stream_round_trip_us(self, nbytes: int, rounds: int, repeats: int) -> list[float]:
        """µs per round trip of one `nbytes` message at a time over one stream, per repeat
        (the mean of `rounds`), after one repeat's warm-up."""
        message = b"x" * nbytes
        pending: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        answers = cast(Iterator[bytes], self.channel.stream_stream(STREAM, None, None)(iter(pending.get, None)))
        out = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            for _ in range(rounds):
                pending.put(message)
                next(answers)
            out.append((time.perf_counter() - start) / rounds * 1e6)
        pending.put(None)
        return out[1:]

    def unary_round_trip_us(self, nbytes: int, rounds: int, repeats: int) -> list[float]:
        """µs per unary call to the first process (which answers it itself), per repeat."""
        call = self.channel.unary_unary(UNARY, None, None)
        message = b"x" * nbytes
        out = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            for _ in range(rounds):
                call(message)
            out.append((time.perf_counter() - start) / rounds * 1e6)
        return out[1:]

    def close(self) -> None:
        self.channel.close()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join(10)

    def __enter__(self) -> RelayChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- the same over raw TCP

_LENGTH = struct.Struct("!I")


def _read_exact(stream: Any, n: int) -> bytes:
    data = stream.read(n)
    if len(data) < n:
        raise ConnectionError("closed")
    return bytes(data)


def _serve_tcp_relay(port_q: Any, next_q: Any) -> None:
    """A process that echoes each length-prefixed message, or writes it on to the next
    process and its answer back, each read and written by its one thread, as the hosts'
    session and control ports are (`pathways_wire.session_frames`)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port_q.put(listener.getsockname()[1])
    downstream = next_q.get()
    down = socket.create_connection(("127.0.0.1", downstream)) if downstream else None
    conn, _ = listener.accept()
    for sock in (conn, down):
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    up_in = conn.makefile("rb")
    down_in = down.makefile("rb") if down is not None else None
    try:
        while True:
            header = _read_exact(up_in, _LENGTH.size)
            message = header + _read_exact(up_in, _LENGTH.unpack(header)[0])
            if down is None or down_in is None:
                conn.sendall(message)
                continue
            down.sendall(message)
            header = _read_exact(down_in, _LENGTH.size)
            conn.sendall(header + _read_exact(down_in, _LENGTH.unpack(header)[0]))
    except (ConnectionError, OSError):
        return


class TcpRelayChain:
    """`RelayChain` over raw loopback TCP: `processes` relays, `2 × processes` hops a round trip."""

    def __init__(self, processes: int) -> None:
        self.procs, listening = _start_relays(_serve_tcp_relay, processes, lambda port: port, 0)
        self.hops = 2 * processes
        self.sock = socket.create_connection(("127.0.0.1", listening[0]), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._in = self.sock.makefile("rb")

    def round_trip_us(self, nbytes: int, rounds: int, repeats: int) -> list[float]:
        """µs per round trip of one `nbytes` message at a time, per repeat (the mean of
        `rounds`), after one repeat's warm-up."""
        message = _LENGTH.pack(nbytes) + b"x" * nbytes
        out = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            for _ in range(rounds):
                self.sock.sendall(message)
                _read_exact(self._in, len(message))
            out.append((time.perf_counter() - start) / rounds * 1e6)
        return out[1:]

    def close(self) -> None:
        self._in.close()
        self.sock.close()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join(10)

    def __enter__(self) -> TcpRelayChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
