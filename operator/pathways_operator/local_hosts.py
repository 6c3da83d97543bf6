"""Hosts of the embedded cluster: a worker and a sidecar process per host.

Each host gets its own loopback address (127.0.0.N), as each pod gets its own
IP on Kubernetes, and runs exactly the processes a pod's `worker` and
`dataflow` containers run. The slice's token reaches both processes as a
file only this user can read (`--slice-token-file`), as a mounted Secret
does on Kubernetes, never on a command line others can see. A monitor thread notices a host process that dies
and reports it, so the controller can fail the calls on its slice and relaunch
the whole gang.

A sidecar binds port 0 on its host's address and prints the address it got as its
first line (``pathways-sidecar listening on HOST:PORT``); the launcher reads it from
the process's log, within the start-up bound. The worker's port and the coordination
service's port of a multi-host slice are held for them instead
(`pathways_operator.coordinator_port`): JAX cannot report the coordinator's, and the
sidecar must be told its worker's address when it starts. With both known up front,
every process of every host of a gang starts at once, and the sidecars come up while
the workers import jax and form their JAX job.

No host outlives its controller: each process gets the controller's parent
link (`pathways_wire.process_tree`) and exits when the controller is gone, even
after a SIGKILL. A host's shared-memory directory (`/dev/shm/pathways-<controller
pid>-<ip>`) and its slice-token file go when the host is stopped; directories
whose controller is gone (one that was SIGKILLed along with its hosts) are
removed when the next controller starts (the controller holds a lock on each
directory while it lives, so a directory in use is never taken for stale, even
one of another pid namespace sharing /dev/shm).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from pathways_wire.env_flags import env_number
from pathways_wire import process_tree
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.port_probe import accepts
from pathways_wire.slice_token import ENV_TOKEN, ENV_TOKEN_FILE
from pathways_operator.controller import Host, HostRequest
from pathways_operator.coordinator_port import HeldPort

log = logging.getLogger(__name__)

READY_POLL_S = 0.02
HOST_START_TIMEOUT_S = env_number(os.environ, "PATHWAYS_HOST_START_TIMEOUT_S", 120.0, positive=True)
STOP_GRACE_S = 5.0
SHM_ROOT = Path("/dev/shm")
_SHM_NAME = re.compile(r"pathways-(\d+)-127\.0\.0\.\d+")
_LISTENING = {  # a whole line: a port cut short by a read mid-write is never taken
    "dataflow": re.compile(rb"pathways-sidecar listening on (\S+)\n"),
}


def shm_dir_name(ip: str) -> str:
    """This controller's directory for the host on ``ip`` (see `remove_stale_shm_dirs`)."""
    return f"pathways-{os.getpid()}-{ip}"


def remove_stale_shm_dirs(root: Path = SHM_ROOT) -> list[Path]:
    """Remove this user's host shared-memory directories whose controller is gone and holds no lock."""
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _SHM_NAME.fullmatch(entry.name)
        if match is None or process_tree.pid_alive(int(match.group(1))):
            continue
        if process_tree.remove_if_abandoned(entry):
            removed.append(entry)
    return removed


def host_run_dir(state_dir: Path, slice_id: str, index: int, ip: str) -> Path:
    """Where a host's logs go, and, while it runs, ``worker.pid`` and ``dataflow.pid``: the
    PIDs of its processes as started, which fault tests signal (never a search by name)."""
    return state_dir / "hosts" / f"{slice_id}-h{index}-{ip}"


@dataclass
class LocalHost:
    request: HostRequest
    ip: str
    sidecar_address: str = ""
    worker_address: str = ""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stopping: bool = False
    run_dir: Path | None = None
    shm_dir: Path | None = None
    shm_hold: int = -1
    """The controller's lock on ``shm_dir``."""
    coordinator: HeldPort | None = None
    """Host 0's coordination service port, held while the host lives."""
    worker_port: HeldPort | None = None
    """The worker's port, held while the host lives."""
    log_offsets: dict[str, int] = field(default_factory=dict)
    """Where each process's log stood when it was started: its address line comes after."""

    @property
    def name(self) -> str:
        return f"{self.request.slice_name}/host-{self.request.index}"


class LocalHostLauncher:
    """Starts, watches and stops host processes on loopback addresses."""

    def __init__(
        self, state_dir: Path, on_host_died: Callable[[LocalHost, str], None]
    ) -> None:
        self.state_dir = state_dir
        self._on_host_died = on_host_died
        self._lock = threading.Lock()
        self._ips_in_use: set[int] = set()
        self._hosts: list[LocalHost] = []
        self._stop = threading.Event()
        for stale in remove_stale_shm_dirs():
            log.info("removed %s, left by a controller that is gone", stale)
        self._monitor = threading.Thread(target=self._watch, name="host-monitor", daemon=True)
        self._monitor.start()

    def _allocate_ip(self) -> str:
        with self._lock:
            for n in range(10, 250):
                if n not in self._ips_in_use:
                    self._ips_in_use.add(n)
                    return f"127.0.0.{n}"
        raise RuntimeError("no free loopback address left in 127.0.0.10-249")

    def launch(self, requests: Sequence[HostRequest]) -> Sequence[Host]:
        """Start every host of one gang and wait until all are ready (or fail all)."""
        hosts = [LocalHost(request=req, ip=self._allocate_ip()) for req in requests]
        try:
            coordinator = ""
            if len(hosts) > 1:
                hosts[0].coordinator = HeldPort(hosts[0].ip)
                coordinator = hosts[0].coordinator.address
            deadline = time.monotonic() + HOST_START_TIMEOUT_S
            for host in hosts:
                self._prepare(host)
                host.worker_port = HeldPort(host.ip, "worker")
                host.worker_address = host.worker_port.address
                self._spawn(host, "worker", self._worker_command(host, coordinator))
                self._spawn(host, "dataflow", self._sidecar_command(host))
            with self._lock:
                self._hosts.extend(hosts)
            for host in hosts:
                host.sidecar_address = self._listening(host, "dataflow", deadline, hosts)
            self._wait_ready(hosts, deadline)
        except Exception:
            self.stop(hosts)
            raise
        return hosts

    def _prepare(self, host: LocalHost) -> None:
        req = host.request
        run_dir = host_run_dir(self.state_dir, req.slice_id, req.index, host.ip)
        run_dir.mkdir(parents=True, exist_ok=True)
        shm = SHM_ROOT if SHM_ROOT.is_dir() else run_dir
        shm_dir = shm / shm_dir_name(host.ip)
        shm_dir.mkdir(parents=True, exist_ok=True)
        host.run_dir, host.shm_dir = run_dir, shm_dir
        host.shm_hold = process_tree.hold_dir(shm_dir)
        if req.token:
            fd = os.open(run_dir / "slice-token", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(req.token)

    def _common_flags(self, host: LocalHost) -> list[str]:
        assert host.run_dir is not None and host.shm_dir is not None
        flags = ["--shm-dir", str(host.shm_dir), "--host-name", f"{host.name} ({host.ip})"]
        if host.request.token:
            flags += ["--slice-token-file", str(host.run_dir / "slice-token")]
        return flags

    def _worker_command(self, host: LocalHost, coordinator: str) -> list[str]:
        req = host.request
        return [
            sys.executable, "-m", "pathways_worker.worker",
            "--listen", host.worker_address,
            "--host-index", str(req.index),
            "--num-hosts", str(req.num_hosts),
            "--coordinator", coordinator,
            "--devices", str(req.devices),
            *self._common_flags(host),
        ]

    def _sidecar_command(self, host: LocalHost) -> list[str]:
        return [
            sys.executable, "-m", "pathways_worker.sidecar",
            "--listen", f"{host.ip}:0",
            "--worker", host.worker_address,
            *self._common_flags(host),
        ]

    def _spawn(self, host: LocalHost, role: str, cmd: list[str]) -> None:
        assert host.run_dir is not None
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)
        env.pop(ENV_TOKEN, None)
        env.pop(ENV_TOKEN_FILE, None)
        link_env, link_fds = process_tree.parent_link_env()
        env.update(link_env)
        log_path = host.run_dir / f"{role}.log"
        with open(log_path, "ab") as out:
            host.log_offsets[role] = out.tell()
            process = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True, pass_fds=link_fds,
            )
        host.processes.append(process)
        (host.run_dir / f"{role}.pid").write_text(f"{process.pid}\n")

    def _listening(self, host: LocalHost, role: str, deadline: float, gang: Sequence[LocalHost]) -> str:
        """The address ``role`` printed once it served, read from its log (this start's part).

        A process of any host of the gang that exits meanwhile ends the wait, named."""
        assert host.run_dir is not None
        log_path = host.run_dir / f"{role}.log"
        while True:
            for member in gang:
                self._raise_if_exited(member)
            with open(log_path, "rb") as log_file:
                log_file.seek(host.log_offsets[role])
                found = _LISTENING[role].search(log_file.read())
            if found is not None:
                return found.group(1).decode()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"host {host.name} ({host.ip}): its {role} process did not report its "
                    f"address within {HOST_START_TIMEOUT_S:.0f} s; see {log_path}"
                )
            time.sleep(0.05)

    def _raise_if_exited(self, host: LocalHost) -> None:
        for proc, role in zip(host.processes, ("worker", "dataflow")):
            if proc.poll() is not None:
                tail = process_tree.log_tail(host.run_dir / f"{role}.log") if host.run_dir else ""
                raise RuntimeError(
                    f"host {host.name} ({host.ip}): its {role} process exited during "
                    f"start-up with code {proc.returncode}; its log ends:\n{tail}"
                )

    def _wait_ready(self, hosts: list[LocalHost], deadline: float) -> None:
        """Until every host's sidecar says its worker is ready; a worker serves only once it
        has joined its slice's JAX job, so a sidecar is asked only once its worker's port
        accepts connections (cheap to try, on the cores the starting hosts need)."""
        pending = list(hosts)
        while pending:
            for host in list(pending):
                self._raise_if_exited(host)
                if not accepts(host.worker_address):
                    continue
                with grpc.insecure_channel(host.sidecar_address) as channel:  # Health: open
                    try:
                        reply = pb_grpc.DataflowStub(channel).Health(pb.HealthRequest(), timeout=1)
                        if reply.worker_ready:
                            pending.remove(host)
                    except grpc.RpcError:
                        pass
            if pending and time.monotonic() > deadline:
                names = ", ".join(h.name for h in pending)
                raise RuntimeError(
                    f"hosts {names} not ready within {HOST_START_TIMEOUT_S:.0f} s; "
                    f"see logs in {self.state_dir / 'hosts'}"
                )
            if pending:
                time.sleep(READY_POLL_S)

    def stop(self, stopping: Sequence[Host]) -> None:
        hosts = [h for h in stopping if isinstance(h, LocalHost)]
        for host in hosts:
            host.stopping = True
            for proc in host.processes:
                if proc.poll() is None:
                    process_tree.signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for host in hosts:
            for proc in host.processes:
                process_tree.stop_group(proc, max(0.1, deadline - time.monotonic()))
        with self._lock:
            for host in hosts:
                if host in self._hosts:
                    self._hosts.remove(host)
                self._ips_in_use.discard(int(host.ip.rsplit(".", 1)[1]))
        for host in hosts:
            if host.shm_dir is not None:
                shutil.rmtree(host.shm_dir, ignore_errors=True)
            with self._lock:
                hold, host.shm_hold = host.shm_hold, -1
                held = [p for p in (host.coordinator, host.worker_port) if p is not None]
                host.coordinator = host.worker_port = None
            if hold >= 0:
                os.close(hold)
            for port in held:
                port.release()
            if host.run_dir is not None:  # the logs stay until the controller exits
                for name in ("slice-token", "worker.pid", "dataflow.pid"):
                    (host.run_dir / name).unlink(missing_ok=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                hosts = list(self._hosts)
            for host in hosts:
                if host.stopping:
                    continue
                for proc, role in zip(host.processes, ("worker", "dataflow")):
                    code = proc.poll()
                    if code is not None:
                        host.stopping = True
                        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                        self._on_host_died(host, f"{role} process {how}")
                        break

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            hosts = list(self._hosts)
        self.stop(hosts)
