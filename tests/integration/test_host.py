"""A Pathways host (worker + sidecar processes) driven over real gRPC.

The test plays the controller: it builds `jax.export` artifacts here (no devices
needed: AbstractMesh), opens each sidecar's Control stream and sends what the
controller would — HostProgram, Launch, GrantBatch, FailCall, ReleaseCall —
puts program inputs and fetches outputs like a client. Hosts:

* host A, 127.0.0.21: a one-host slice with 2 devices, a 1 MiB sidecar store
  with a 3 s Put wait, a 256 KiB worker store and an 8 s input timeout (so
  back-pressure and timeouts show quickly);
* hosts B0/B1, 127.0.0.22/.23: a two-host slice of 4 devices each, one
  jax.distributed job (collectives over gloo).
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pathways_wire import process_tree, transfer
from pathways_wire import pathways_pb2 as pb
from pathways_wire.grant_runs import runs_of, seqs_of
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.slice_token import ENV_TOKEN, ENV_TOKEN_FILE, INSECURE_FLAG
from pathways_operator.coordinator_port import HeldPort

START_TIMEOUT_S = 90.0
RPC_TIMEOUT_S = 30.0
A_STORE_LIMIT = 1 << 20
A_WORKER_STORE_LIMIT = 256 << 10
A_INPUT_TIMEOUT_S = 8


# ---------------------------------------------------------------- processes


@dataclass
class HostProcs:
    name: str
    ip: str
    worker_address: str = ""
    address: str = ""  # the sidecar
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    coordinator: HeldPort | None = None  # host 0's, held while it lives


def spawn_host_process(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A worker or sidecar process: its stdout piped (for its address line), its stderr to ``log``."""
    with open(log, "wb") as err:
        return subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True
        )


def listening_address(proc: subprocess.Popen[bytes], deadline: float, log: Path) -> str:
    """The address a host process prints once it serves."""
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline().decode()
            if "listening on" in line:
                return line.rsplit(" ", 1)[1].strip()
    raise RuntimeError(f"{proc.args!r} did not start in time:\n{log.read_text()[-3000:]}")


def start_slice(
    slice_name: str,
    ips: Sequence[str],
    devices: int,
    log_dir: Path,
    sidecar_flags: Sequence[str] = (),
    worker_env: dict[str, str] | None = None,
) -> list[HostProcs]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    wenv = {**env, "PATHWAYS_INPUT_TIMEOUT_S": "30", **(worker_env or {})}
    hosts = [HostProcs(f"{slice_name}/host-{i} ({ip})", ip) for i, ip in enumerate(ips)]
    hosts[0].coordinator = HeldPort(ips[0])
    coordinator = hosts[0].coordinator.address
    # these loopback hosts are reached only by this test; a slice token in the
    # environment (test_host_security) is demanded instead
    unchecked = [] if env.get(ENV_TOKEN) or env.get(ENV_TOKEN_FILE) else [INSECURE_FLAG]
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else log_dir
    try:
        for i, host in enumerate(hosts):
            log = log_dir / f"{slice_name}-{i}-worker.log"
            host.logs.append(log)
            host.procs.append(spawn_host_process([
                sys.executable, "-m", "pathways_worker.worker",
                "--listen", f"{host.ip}:0", "--host-index", str(i), "--num-hosts", str(len(ips)),
                "--coordinator", coordinator, "--devices", str(devices),
                "--shm-dir", str(shm / f"pathways-test-{os.getpid()}-{slice_name}-{i}"),
                "--host-name", host.name, *unchecked,
            ], log, wenv))
        deadline = time.monotonic() + START_TIMEOUT_S
        for host in hosts:
            host.worker_address = listening_address(host.procs[0], deadline, host.logs[0])
        for i, host in enumerate(hosts):
            log = log_dir / f"{slice_name}-{i}-sidecar.log"
            host.logs.append(log)
            host.procs.append(spawn_host_process([
                sys.executable, "-m", "pathways_worker.sidecar",
                "--listen", f"{host.ip}:0", "--worker", host.worker_address,
                "--shm-dir", str(shm / f"pathways-test-{os.getpid()}-{slice_name}-{i}"),
                "--host-name", host.name, *unchecked, *sidecar_flags,
            ], log, env))
            host.address = listening_address(host.procs[1], deadline, log)
        for host in hosts:
            with grpc.insecure_channel(host.address) as channel:
                stub = pb_grpc.DataflowStub(channel)
                while not stub.Health(pb.HealthRequest(), timeout=5).worker_ready:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{host.name}: worker not ready in time")
                    time.sleep(0.1)
    except BaseException:
        stop_hosts(hosts)
        raise
    return hosts


@contextmanager
def slice_with_token(name: str, ip: str, token: str, log_dir: Path) -> Iterator[HostProcs]:
    """A one-host slice whose worker and sidecar demand `token` (read from the environment
    at their start), stopped on leaving."""
    saved = os.environ.get(ENV_TOKEN)
    os.environ[ENV_TOKEN] = token
    try:
        hosts = start_slice(name, [ip], 1, log_dir)
    finally:
        if saved is None:
            os.environ.pop(ENV_TOKEN, None)
        else:
            os.environ[ENV_TOKEN] = saved
    try:
        yield hosts[0]
    finally:
        stop_hosts(hosts)


def stop_hosts(hosts: Sequence[HostProcs]) -> None:
    for host in hosts:
        for proc in host.procs:
            if proc.poll() is None:
                process_tree.signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for host in hosts:
        for proc in host.procs:
            process_tree.stop_group(proc, max(0.1, deadline - time.monotonic()))
            if proc.stdout is not None:
                proc.stdout.close()
        if host.coordinator is not None:
            host.coordinator.release()


@pytest.fixture(scope="module")
def host_processes(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[dict[str, list[HostProcs]]]:
    log_dir = tmp_path_factory.mktemp("host-logs")
    slices: dict[str, list[HostProcs]] = {}
    try:
        slices["b"] = start_slice("slice-b", ["127.0.0.22", "127.0.0.23"], 4, log_dir)
        slices["a"] = start_slice(
            "slice-a", ["127.0.0.21"], 2, log_dir,
            sidecar_flags=["--store-limit-bytes", str(A_STORE_LIMIT), "--put-wait-s", "3", "--metrics-port", "0"],
            worker_env={
                "PATHWAYS_STORE_LIMIT_BYTES": str(A_WORKER_STORE_LIMIT),
                "PATHWAYS_INPUT_TIMEOUT_S": str(A_INPUT_TIMEOUT_S),
            },
        )
        yield slices
    finally:
        for hosts in slices.values():
            stop_hosts(hosts)
        if request.session.testsfailed:
            for hosts in slices.values():
                for host in hosts:
                    for log in host.logs:
                        print(f"==== {log}\n{log.read_text()[-4000:]}")


# ---------------------------------------------------------------- the controller's side


class ControlStream:
    """One Control stream to a sidecar, as the controller holds it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.DataflowStub(self.channel)
        self._out: queue.Queue[pb.HostCommand | None] = queue.Queue()
        self._cv = threading.Condition()
        self.completions: list[pb.Completion] = []
        self.hello = ""
        self._responses = self.stub.Control(self._requests())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[pb.HostCommand]:
        while True:
            command = self._out.get()
            if command is None:
                return
            yield command

    def _read(self) -> None:
        try:
            for event in self._responses:
                with self._cv:
                    if event.hello_host:
                        self.hello = event.hello_host
                    for c in event.completions:  # a run of grants stands for one completion each
                        self.completions += [c] if c.count <= 1 else [
                            pb.Completion(seq=seq, call_id=c.call_id, ok=True) for seq in seqs_of(c)
                        ]
                    self._cv.notify_all()
        except grpc.RpcError:
            pass

    def send(self, **command: Any) -> None:
        self._out.put(pb.HostCommand(**command))

    def wait(self, call_id: str, count: int, timeout_s: float = 30.0) -> list[pb.Completion]:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while True:
                done = [c for c in self.completions if c.call_id == call_id]
                if len(done) >= count:
                    return sorted(done, key=lambda c: c.seq)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.address}: {len(done)}/{count} completions of {call_id}: {done}")
                self._cv.wait(left)

    def close(self) -> None:
        self._out.put(None)
        self._responses.cancel()  # type: ignore[no-untyped-call]
        self.channel.close()


@pytest.fixture(scope="module")
def controls(host_processes: dict[str, list[HostProcs]]) -> Iterator[dict[str, ControlStream]]:
    streams = {h.address: ControlStream(h.address) for hosts in host_processes.values() for h in hosts}
    try:
        yield streams
    finally:
        for s in streams.values():
            s.close()


@dataclass(frozen=True)
class Mesh:
    shape: tuple[int, ...]
    axes: tuple[str, ...]


A_MESH = Mesh((2,), ("x",))
B_MESH = Mesh((8,), ("x",))


def computation(
    index: int,
    name: str,
    slice_id: str,
    f: Callable[..., Any],
    inputs: Sequence[tuple[int, int]],
    in_types: Sequence[tuple[tuple[int, ...], Any, P]],
    out_specs: P | tuple[P, ...],
    mesh: Mesh,
) -> pb.Computation:
    """A Computation whose artifact is `f` exported for `mesh` (no devices needed)."""
    abstract = AbstractMesh(mesh.shape, mesh.axes)
    in_sh = tuple(NamedSharding(abstract, spec) for _, _, spec in in_types)
    out_sh: Any = (
        tuple(NamedSharding(abstract, s) for s in out_specs)
        if isinstance(out_specs, tuple) else NamedSharding(abstract, out_specs)
    )
    exp = jax.export.export(jax.jit(f, in_shardings=in_sh, out_shardings=out_sh), platforms=["cpu"])(
        *[jax.ShapeDtypeStruct(shape, dtype, sharding=sh) for (shape, dtype, _), sh in zip(in_types, in_sh)]
    )
    artifact = bytes(exp.serialize())
    return pb.Computation(
        index=index, name=name, slice=slice_id, artifact=artifact,
        fingerprint=hashlib.sha256(artifact).hexdigest(),
        inputs=[pb.ValueRef(node=n, index=i) for n, i in inputs],
        outputs=[pb.TensorSpec(shape=list(a.shape), dtype=np.dtype(a.dtype).name) for a in exp.out_avals],
        mesh_shape=list(mesh.shape), mesh_axes=list(mesh.axes),
    )


def program(name: str, comps: Sequence[pb.Computation], num_inputs: int) -> pb.Program:
    return pb.Program(
        name=name, fingerprint=name, computations=comps,
        inputs=[pb.TensorSpec() for _ in range(num_inputs)],
    )


def vref(node: int, index: int = 0) -> pb.ValueRef:
    return pb.ValueRef(node=node, index=index)


def launch(
    call_id: str,
    program_id: str,
    routes: dict[tuple[int, int], list[str]] | None = None,
    expects: dict[tuple[int, int], int] | None = None,
    outputs: Sequence[tuple[int, int]] = (),
) -> pb.Launch:
    return pb.Launch(
        call_id=call_id, program_id=program_id,
        routes=[pb.Route(value=vref(*r), destinations=d) for r, d in (routes or {}).items()],
        expects=[pb.Expect(value=vref(*r), senders=n) for r, n in (expects or {}).items()],
        outputs=[vref(*o) for o in outputs],
    )


def grants(call_id: str, seq_nodes: Sequence[tuple[int, int]]) -> pb.GrantBatch:
    return pb.GrantBatch(runs=runs_of((s, call_id, n) for s, n in seq_nodes))


def stub(address: str) -> pb_grpc.DataflowStub:
    return pb_grpc.DataflowStub(grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", transfer.MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", transfer.MAX_MESSAGE_BYTES),
    ]))


def put(address: str, call_id: str, ref: tuple[int, int], array: np.ndarray) -> int:
    return transfer.put_value(stub(address), call_id, vref(*ref), array, RPC_TIMEOUT_S)


def fetch(addresses: Sequence[str], call_id: str, ref: tuple[int, int]) -> np.ndarray:
    return transfer.fetch_value([stub(a) for a in addresses], call_id, vref(*ref), RPC_TIMEOUT_S, hosts=addresses)


def health(address: str) -> pb.HealthReply:
    reply: pb.HealthReply = stub(address).Health(pb.HealthRequest(), timeout=5)
    assert reply.detailed, f"{address} told no details: these hosts run without a token, which opens them"
    return reply


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def metrics_url(host: HostProcs, timeout_s: float = 30.0) -> str:
    """The ``/metrics`` URL a sidecar started with ``--metrics-port 0`` logged once it served."""
    found: list[str] = []

    def logged() -> bool:
        found[:] = re.findall(r"metrics on (http://\S+/metrics)", host.logs[1].read_text())
        return bool(found)

    wait_for(f"{host.name}'s sidecar to log its metrics address", logged, timeout_s)
    return found[-1]


def scrape(url: str) -> dict[str, float]:
    """``name{labels}`` -> value, labels without ``host`` (sorted as the client writes them)."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[re.sub(r'host="[^"]*",?', "", key).replace("{}", "")] = float(value)
    return samples


def backpressure_waits(url: str) -> float:
    """Puts that have started waiting for store room (counted when the wait begins)."""
    return scrape(url)["pathways_sidecar_backpressure_waits_total"]


X = (16, 4)
F32 = jnp.float32


def chain_program(name: str, slice_id: str = "a") -> pb.Program:
    """x -> 2x -> sin(2x) + 2x -> column sums, on host A's 2 devices."""
    t = (X, F32, P("x"))
    return program(name, [
        computation(0, "double", slice_id, lambda x: x * 2.0, [(-1, 0)], [t], P("x"), A_MESH),
        computation(1, "wiggle", slice_id, lambda y: jnp.sin(y) + y, [(0, 0)], [t], P("x"), A_MESH),
        computation(2, "colsum", slice_id, lambda z: jnp.sum(z, axis=0), [(1, 0)], [t], P(), A_MESH),
    ], num_inputs=1)


def x_value(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(X).astype(np.float32)


# ---------------------------------------------------------------- tests


@pytest.mark.timeout(120)
def test_chain_of_three_on_one_host(host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]) -> None:
    a = host_processes["a"][0].address
    ctl = controls[a]
    wait_for("hello", lambda: ctl.hello == a)
    ctl.send(load=pb.HostProgram(program_id="chain", program=chain_program("chain"), slice="a"))
    ctl.send(launch=launch("c1", "chain", outputs=[(1, 0), (2, 0)]))
    ctl.send(grants=grants("c1", [(1, 0), (2, 1), (3, 2)]))
    x = x_value()
    assert put(a, "c1", (-1, 0), x) == 1
    done = ctl.wait("c1", 3)
    assert [c.ok for c in done] == [True] * 3, done
    z = np.sin(2 * x) + 2 * x
    np.testing.assert_allclose(fetch([a], "c1", (1, 0)), z, rtol=1e-6)
    np.testing.assert_allclose(fetch([a], "c1", (2, 0)), z.sum(axis=0), rtol=1e-5)
    ctl.send(release=pb.ReleaseCall(call_id="c1"))


@pytest.mark.timeout(120)
def test_release_frees_the_stores(host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]) -> None:
    a = host_processes["a"][0].address
    ctl = controls[a]
    ctl.send(load=pb.HostProgram(program_id="chain-r", program=chain_program("chain-r"), slice="a"))
    ctl.send(launch=launch("r1", "chain-r", outputs=[(2, 0)]))
    ctl.send(grants=grants("r1", [(1, 0), (2, 1), (3, 2)]))
    put(a, "r1", (-1, 0), x_value(1))
    assert all(c.ok for c in ctl.wait("r1", 3))
    # Intermediates are freed after their last use: only the output (4 floats) is held.
    wait_for("worker store holds the output only", lambda: health(a).worker_store_bytes == 2 * 4 * 4)
    assert health(a).store_bytes == x_value().nbytes  # the input, until the call is released
    got = transfer.fetch_value([stub(a)], "r1", vref(2), RPC_TIMEOUT_S, release=True)
    np.testing.assert_allclose(got, (np.sin(2 * x_value(1)) + 2 * x_value(1)).sum(axis=0), rtol=1e-5)
    wait_for("fetch with release frees the output", lambda: health(a).worker_store_bytes == 0)
    with pytest.raises(grpc.RpcError) as err:
        fetch([a], "r1", (2, 0))
    assert "freed" in (err.value.details() or ""), err.value.details()
    ctl.send(release=pb.ReleaseCall(call_id="r1"))
    wait_for("stores empty", lambda: (h := health(a)).worker_store_bytes == 0 and h.store_bytes == 0)
    with pytest.raises(grpc.RpcError) as err:
        fetch([a], "r1", (2, 0))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "released" in (err.value.details() or "")


@pytest.mark.timeout(120)
def test_psum_and_all_gather_on_two_hosts(host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]) -> None:
    b = [h.address for h in host_processes["b"]]

    def f(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        return jnp.sum(x, axis=0), x, x * 10.0  # psum, all-gather, stays sharded

    prog = program("collectives", [
        computation(0, "collect", "b", f, [(-1, 0)], [(X, F32, P("x"))], (P(), P(), P("x")), B_MESH),
    ], num_inputs=1)
    for addr in b:
        controls[addr].send(load=pb.HostProgram(program_id="coll", program=prog, slice="b"))
        controls[addr].send(launch=launch("k1", "coll", outputs=[(0, 0), (0, 1), (0, 2)]))
        controls[addr].send(grants=grants("k1", [(7, 0)]))
    x = np.arange(64, dtype=np.float32).reshape(X)
    for addr in b:
        put(addr, "k1", (-1, 0), x)
    for addr in b:
        assert [c.ok for c in controls[addr].wait("k1", 1)] == [True]
    np.testing.assert_array_equal(fetch(b, "k1", (0, 0)), x.sum(axis=0))
    np.testing.assert_array_equal(fetch(b, "k1", (0, 1)), x)
    np.testing.assert_array_equal(fetch(b, "k1", (0, 2)), x * 10.0)
    for addr in b:
        controls[addr].send(release=pb.ReleaseCall(call_id="k1"))


@pytest.mark.timeout(120)
def test_hosts_sent_only_their_rows_compute_on_the_global_value_and_refuse_to_serve_it(
    host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]
) -> None:
    b = [h.address for h in host_processes["b"]]
    prog = program("rows", [
        computation(0, "scale", "b", lambda x: (x * 2.0, jnp.sum(x)), [(-1, 0)], [(X, F32, P("x"))],
                    (P("x"), P()), B_MESH),
    ], num_inputs=1)
    for addr in b:
        controls[addr].send(load=pb.HostProgram(program_id="rows", program=prog, slice="b"))
        controls[addr].send(launch=launch("r1", "rows", outputs=[(0, 0), (0, 1)]))
    x = np.arange(64, dtype=np.float32).reshape(X)
    half = X[0] // 2
    for addr, (lo, hi) in zip(b, [(0, half), (half, X[0])], strict=True):
        chunks = transfer.block_chunks("r1", vref(-1, 0), x, (lo, 0), (hi, X[1]))
        assert stub(addr).Put(chunks, timeout=RPC_TIMEOUT_S).pieces == 1
    with pytest.raises(grpc.RpcError) as refused:
        fetch(b[:1], "r1", (-1, 0))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "holds only the block [0, 0]..[8, 4] of a value of shape [16, 4]" in (refused.value.details() or "")
    for addr in b:
        controls[addr].send(grants=grants("r1", [(1, 0)]))
    for addr in b:
        assert [c.ok for c in controls[addr].wait("r1", 1)] == [True]
    np.testing.assert_array_equal(fetch(b, "r1", (0, 0)), x * 2.0)
    np.testing.assert_array_equal(fetch(b, "r1", (0, 1)), x.sum())
    for addr in b:
        controls[addr].send(release=pb.ReleaseCall(call_id="r1"))


@pytest.mark.timeout(120)
def test_values_routed_between_slices(host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]) -> None:
    a = host_processes["a"][0].address
    b = [h.address for h in host_processes["b"]]
    prog = program("routed", [
        computation(0, "inc", "a", lambda x: x + 1.0, [(-1, 0)], [(X, F32, P("x"))], P("x"), A_MESH),
        computation(1, "triple", "b", lambda y: y * 3.0, [(0, 0)], [(X, F32, P("x"))], P("x"), B_MESH),
        computation(2, "total", "a", lambda z: jnp.sum(z, axis=1), [(1, 0)], [(X, F32, P("x"))], P("x"), A_MESH),
    ], num_inputs=1)
    controls[a].send(load=pb.HostProgram(program_id="rt", program=prog, slice="a"))
    controls[a].send(launch=launch("t1", "rt", routes={(0, 0): b}, expects={(1, 0): 2}, outputs=[(2, 0)]))
    controls[a].send(grants=grants("t1", [(1, 0), (3, 2)]))
    x = x_value(2)
    put(a, "t1", (-1, 0), x)
    assert controls[a].wait("t1", 1)[0].ok
    # A pushed y to B before B's Launch: B holds it until the Launch says how many senders.
    wait_for("y held on B", lambda: all(health(h).store_bytes == x.nbytes for h in b))
    for addr in b:
        controls[addr].send(load=pb.HostProgram(program_id="rt", program=prog, slice="b"))
        controls[addr].send(launch=launch("t1", "rt", routes={(1, 0): [a]}, expects={(0, 0): 1}, outputs=[(1, 0)]))
        controls[addr].send(grants=grants("t1", [(2, 1)]))
    assert all(c.ok for c in controls[a].wait("t1", 2))
    for addr in b:
        assert all(c.ok for c in controls[addr].wait("t1", 1))
    np.testing.assert_allclose(fetch(b, "t1", (1, 0)), (x + 1) * 3, rtol=1e-6)
    np.testing.assert_allclose(fetch([a], "t1", (2, 0)), ((x + 1) * 3).sum(axis=1), rtol=1e-5)
    for addr in [a, *b]:
        controls[addr].send(release=pb.ReleaseCall(call_id="t1"))
    wait_for("b stores empty", lambda: all(health(h).store_bytes == 0 for h in b))


@pytest.mark.timeout(120)
def test_failures_propagate_without_hanging(host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]) -> None:
    a = host_processes["a"][0].address
    b = [h.address for h in host_processes["b"]]
    prog = program("faulty", [
        computation(0, "first", "a", lambda x: x * 2.0, [(-1, 0)], [(X, F32, P("x"))], P("x"), A_MESH),
        computation(1, "second", "a", lambda y: y + 1.0, [(0, 0)], [(X, F32, P("x"))], P("x"), A_MESH),
        computation(2, "remote", "b", lambda y: y - 1.0, [(0, 0)], [(X, F32, P("x"))], P("x"), B_MESH),
    ], num_inputs=1)
    controls[a].send(load=pb.HostProgram(program_id="ff", program=prog, slice="a"))
    controls[a].send(launch=launch("f1", "ff", routes={(0, 0): b}, outputs=[(1, 0)]))
    for addr in b:
        controls[addr].send(load=pb.HostProgram(program_id="ff", program=prog, slice="b"))
        controls[addr].send(launch=launch("f1", "ff", expects={(0, 0): 1}, outputs=[(2, 0)]))
        controls[addr].send(grants=grants("f1", [(5, 2)]))
    controls[a].send(grants=grants("f1", [(4, 0), (6, 1)]))
    put(a, "f1", (-1, 0), np.zeros((6, 4), np.float32))  # wrong shape: the computation raises
    first, second = controls[a].wait("f1", 2)
    assert not first.ok and not second.ok
    for text in ["program 'faulty'", "computation 'first' (index 0)", "slice-a/host-0 (127.0.0.21)", "(6, 4)"]:
        assert text in first.error, first.error
    assert "input output 0 of computation 0 failed:" in second.error and "computation 'first'" in second.error
    for addr in b:
        (remote,) = controls[addr].wait("f1", 1)
        assert not remote.ok and "computation 'first'" in remote.error, remote.error
    with pytest.raises(grpc.RpcError) as err:
        fetch([a], "f1", (1, 0))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "computation 'first'" in (err.value.details() or "")
    with pytest.raises(grpc.RpcError):
        fetch(b, "f1", (2, 0))

    # A computation exported for another device count fails with both numbers.
    wrong = program("wrong", [
        computation(0, "wide", "a", lambda x: x, [(-1, 0)], [(X, F32, P("x"))], P("x"), Mesh((4,), ("x",))),
    ], num_inputs=1)
    controls[a].send(load=pb.HostProgram(program_id="wrong", program=wrong, slice="a"))
    controls[a].send(launch=launch("f2", "wrong", outputs=[(0, 0)]))
    controls[a].send(grants=grants("f2", [(7, 0)]))
    (done,) = controls[a].wait("f2", 1)
    assert not done.ok and "exported for 4 devices" in done.error and "has 2 devices" in done.error

    # FailCall interrupts a computation waiting for an input that never comes.
    controls[a].send(load=pb.HostProgram(program_id="chain-f", program=chain_program("chain-f"), slice="a"))
    controls[a].send(launch=launch("f3", "chain-f", outputs=[(2, 0)]))
    controls[a].send(grants=grants("f3", [(8, 0), (9, 1), (10, 2)]))
    controls[a].send(fail=pb.FailCall(call_id="f3", message="host 9 died"))
    done3 = controls[a].wait("f3", 3, timeout_s=A_INPUT_TIMEOUT_S + 20)
    # not the input timeout's error: FailCall ended the wait
    assert all(not c.ok and "host 9 died" in c.error for c in done3), done3
    for call in ["f1", "f2", "f3"]:
        for addr in [a, *b]:
            controls[addr].send(release=pb.ReleaseCall(call_id=call))


@pytest.mark.timeout(120)
def test_put_waits_for_space_until_a_release(host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]) -> None:
    a = host_processes["a"][0].address
    big = np.ones(600 << 10, np.uint8)  # 60% of host A's 1 MiB sidecar store
    wait_for("empty store", lambda: health(a).store_bytes == 0)
    put(a, "bp1", (-1, 0), big)
    assert health(a).store_bytes == big.nbytes
    url = metrics_url(host_processes["a"][0])
    waits = backpressure_waits(url)
    result: list[Any] = []
    waiter = threading.Thread(target=lambda: result.append(put(a, "bp2", (-1, 0), big)))
    waiter.start()
    wait_for("the Put waiting for room", lambda: backpressure_waits(url) == waits + 1)
    assert waiter.is_alive() and not result  # held back: no room
    controls[a].send(release=pb.ReleaseCall(call_id="bp1"))
    waiter.join(10)
    assert result == [1]
    assert health(a).store_bytes == big.nbytes

    with pytest.raises(grpc.RpcError) as err:
        put(a, "bp3", (-1, 0), big)  # nobody releases: bounded wait (3 s), then an error
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = err.value.details() or ""
    assert "after waiting 3 s" in details, details
    assert f"needs {big.nbytes} B" in details and f"limit {A_STORE_LIMIT} B" in details, details

    with pytest.raises(grpc.RpcError) as err:
        put(a, "bp4", (-1, 0), np.ones(2 << 20, np.uint8))  # could never fit: at once
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "more than the whole store limit" in (err.value.details() or "")
    for call in ["bp2", "bp3", "bp4"]:
        controls[a].send(release=pb.ReleaseCall(call_id=call))
    wait_for("empty stores", lambda: (h := health(a)).store_bytes == 0 and h.worker_store_bytes == 0)


def _header(**fields: Any) -> pb.BufferHeader:
    h = pb.BufferHeader(call_id="bad", value=vref(-1, 0), spec=pb.TensorSpec(shape=[4, 4], dtype="float32"),
                        start=[0, 0], stop=[4, 4], nbytes=64, last_from_sender=True, sender="t")
    for k, v in fields.items():
        if k in ("start", "stop"):
            getattr(h, k)[:] = v
        elif k == "spec":
            h.spec.CopyFrom(v)
        else:
            setattr(h, k, v)
    return h


@pytest.mark.timeout(60)
def test_malformed_puts_are_rejected_and_the_sidecar_keeps_serving(host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]) -> None:
    a = host_processes["a"][0].address
    cases: list[tuple[list[pb.BufferChunk], str]] = [
        ([pb.BufferChunk(header=_header(spec=pb.TensorSpec(shape=[4, 4], dtype="object")), data=b"x" * 64)], "spec.dtype"),
        ([pb.BufferChunk(header=_header(stop=[5, 4], nbytes=80), data=b"x" * 80)], "start/stop[0]"),
        ([pb.BufferChunk(header=_header(nbytes=63), data=b"x" * 63)], "header.nbytes"),
        ([pb.BufferChunk(header=_header(), data=b"x" * 65)], "data"),
        ([pb.BufferChunk(data=b"x" * 8)], "data"),
        ([pb.BufferChunk(header=_header(), data=b"x" * ((4 << 20) + 1))], "exceeds"),
    ]
    for chunks, field_name in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub(a).Put(iter(chunks), timeout=RPC_TIMEOUT_S)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
        assert field_name in (err.value.details() or ""), err.value.details()
    assert health(a).worker_ready
    assert put(a, "ok-after-bad", (-1, 0), np.ones(4, np.float32)) == 1
    for call in ["bad", "ok-after-bad"]:
        controls[a].send(release=pb.ReleaseCall(call_id=call))
    wait_for("empty stores", lambda: (h := health(a)).store_bytes == 0 and h.worker_store_bytes == 0)


@pytest.mark.timeout(120)
def test_a_chain_of_200_computations_runs_in_grant_order(host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]) -> None:
    """A long chain of one cached executable, each step feeding the next (its per-computation
    cost is a figure for bench/, not something this test asserts)."""
    a = host_processes["a"][0].address
    n = 200
    t = ((64,), F32, P())
    comps = [computation(0, "step", "a", lambda v: v * 0.5 + 1.0, [(-1, 0)], [t], P(), A_MESH)]
    step = comps[0]
    for i in range(1, n):
        c = pb.Computation()
        c.CopyFrom(step)
        c.index = i
        del c.inputs[:]
        c.inputs.append(vref(i - 1))
        comps.append(c)
    prog = program("long-chain", comps, num_inputs=1)
    ctl = controls[a]
    ctl.send(load=pb.HostProgram(program_id="long", program=prog, slice="a"))
    ctl.send(launch=launch("warm", "long", outputs=[(n - 1, 0)]))
    ctl.send(grants=grants("warm", [(1000 + i, i) for i in range(n)]))
    put(a, "warm", (-1, 0), np.zeros(64, np.float32))
    assert all(c.ok for c in ctl.wait("warm", n))
    ctl.send(launch=launch("timed", "long", outputs=[(n - 1, 0)]))
    put(a, "timed", (-1, 0), np.zeros(64, np.float32))
    ctl.send(grants=grants("timed", [(2000 + i, i) for i in range(n)]))
    assert all(c.ok for c in ctl.wait("timed", n))
    expected = np.zeros(64, np.float32)
    for _ in range(n):
        expected = expected * 0.5 + 1.0
    np.testing.assert_allclose(fetch([a], "timed", (n - 1, 0)), expected, rtol=1e-6)
    for call in ["warm", "timed"]:
        ctl.send(release=pb.ReleaseCall(call_id=call))


@pytest.mark.timeout(120)
def test_worker_store_back_pressure(host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]) -> None:
    """Host A's worker store holds 256 KiB: a computation whose output does not fit
    waits (it does not fail, nothing is dropped) until a release makes room."""
    a = host_processes["a"][0].address
    ctl = controls[a]
    n = 25 << 10  # 100 KiB of float32
    prog = program("blob", [
        computation(0, "scale", "a", lambda v: v * 2.0, [(-1, 0)], [((n,), F32, P("x"))], P("x"), A_MESH),
    ], num_inputs=1)
    ctl.send(load=pb.HostProgram(program_id="blob", program=prog, slice="a"))
    x = np.arange(n, dtype=np.float32)
    ctl.send(launch=launch("h1", "blob", outputs=[(0, 0)]))
    ctl.send(grants=grants("h1", [(1, 0)]))
    put(a, "h1", (-1, 0), x)
    assert ctl.wait("h1", 1)[0].ok
    wait_for("h1 holds its output", lambda: health(a).worker_store_bytes == x.nbytes)
    ctl.send(launch=launch("h2", "blob", outputs=[(0, 0)]))
    ctl.send(grants=grants("h2", [(2, 0)]))
    put(a, "h2", (-1, 0), x)  # input 100 KiB + h1's 100 KiB held: no room for 100 KiB more
    wait_for("h2's input in the worker store", lambda: health(a).worker_store_bytes == 2 * x.nbytes)
    assert not [c for c in ctl.completions if c.call_id == "h2"]  # held until h1's release
    ctl.send(release=pb.ReleaseCall(call_id="h1"))
    assert ctl.wait("h2", 1)[0].ok
    np.testing.assert_array_equal(fetch([a], "h2", (0, 0)), x * 2.0)
    ctl.send(release=pb.ReleaseCall(call_id="h2"))
    wait_for("empty stores", lambda: (h := health(a)).store_bytes == 0 and h.worker_store_bytes == 0)


@pytest.mark.timeout(120)
def test_missing_input_times_out_naming_its_source(host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]) -> None:
    a = host_processes["a"][0].address
    prog = program("orphan", [
        computation(0, "consume", "a", lambda y: y + 1.0, [(5, 0)], [(X, F32, P("x"))], P("x"), A_MESH),
        computation(5, "produce", "b", lambda x: x, [(-1, 0)], [(X, F32, P("x"))], P("x"), B_MESH),
    ], num_inputs=1)
    ctl = controls[a]
    ctl.send(load=pb.HostProgram(program_id="orphan", program=prog, slice="a"))
    ctl.send(launch=launch("o1", "orphan", expects={(5, 0): 2}, outputs=[(0, 0)]))
    ctl.send(grants=grants("o1", [(1, 0)]))
    (done,) = ctl.wait("o1", 1, timeout_s=A_INPUT_TIMEOUT_S + 20)
    assert not done.ok
    for text in ["computation 'consume' (index 0)", "call o1", f"timed out after {A_INPUT_TIMEOUT_S} s",
                 "output 0 of computation 5", "slice 'b' (2 sender host(s))"]:
        assert text in done.error, done.error
    ctl.send(release=pb.ReleaseCall(call_id="o1"))


@pytest.mark.timeout(60)
def test_a_new_control_stream_replaces_the_old(host_processes: dict[str, list[HostProcs]], controls: dict[str, ControlStream]) -> None:
    a = host_processes["a"][0].address
    old = controls[a]
    new = controls[a] = ControlStream(a)
    try:
        wait_for("hello on the new stream", lambda: new.hello == a)
        new.send(load=pb.HostProgram(program_id="chain-n", program=chain_program("chain-n"), slice="a"))
        new.send(launch=launch("n1", "chain-n", outputs=[(2, 0)]))
        new.send(grants=grants("n1", [(1, 0), (2, 1), (3, 2)]))
        put(a, "n1", (-1, 0), x_value(3))
        assert all(c.ok for c in new.wait("n1", 3))
        assert not [c for c in old.completions if c.call_id == "n1"]
        new.send(release=pb.ReleaseCall(call_id="n1"))
    finally:
        old.close()
