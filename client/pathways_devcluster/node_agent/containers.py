"""A pod's containers as local processes: start, reap, restart, probe, kill.

The node agent is a stand-in for the kubelet, not a kubelet: it has no container
runtime and no images. A container here is a process in its own session, started from
``command`` + ``args`` (the image is ignored; ``python``/``python3`` is this interpreter,
so the repository's virtualenv is used; the working directory is the repository root
unless ``workingDir`` says otherwise; a volume on an ancestor of either does not hide
them), with the environment a kubelet would give it (see ``pod_env``) and its volumes
mounted or rewritten (see ``pod_volumes``). Its stdout and stderr go to
``container_log_path``: ``.log`` for the first run, ``.log.N`` for restart N; the PID of
its current run is in ``container_pid_path``, so fault tests signal exactly that process.

``ContainerRunner`` does for one pod what the kubelet's container manager does: it
starts a container, reaps it when its process exits and records the exit the way the
API reports it (``Completed``, ``Error``, ``StartError`` with exit code 128), restarts
it as ``restartPolicy`` says (restartable init containers -- native sidecars -- always)
with a capped exponential back-off shown as ``CrashLoopBackOff``, and runs its probes,
killing it when liveness or startup fails. ``Container.status`` is its entry in the
pod's ``containerStatuses``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pathways_devcluster import processes
from pathways_devcluster.node_agent import probes
from pathways_devcluster.node_agent.api import now
from pathways_devcluster.node_agent.pod_env import (
    ContainerConfigError,
    ObjectSource,
    Pod,
    PodNetwork,
    container_argv,
    container_environment,
)
from pathways_devcluster.node_agent.pod_volumes import (
    Mount,
    MountMode,
    MountPoints,
    PodVolumes,
    apply_mounts,
    host_path,
)

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
IMAGE_PATHS = tuple(
    sorted({str(REPO_ROOT), sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix})
)
"""The image's own files, which no volume on an ancestor hides (see ``pod_volumes``)."""
RUNTIME = "kpw-node-agent://"
"""The prefix of container and image IDs, where a kubelet names its container runtime."""


def container_log_path(
    state_dir: Path | str, namespace: str, pod: str, container: str, restart: int = 0
) -> Path:
    """Where the agent writes a container's stdout+stderr (``restart`` N: ``.log.N``)."""
    suffix = f".log.{restart}" if restart else ".log"
    return Path(state_dir) / "pods" / f"{namespace}_{pod}" / f"{container}{suffix}"


def container_pid_path(state_dir: Path | str, namespace: str, pod: str, container: str) -> Path:
    """Where the agent records the PID of a container's current run."""
    return Path(state_dir) / "pods" / f"{namespace}_{pod}" / f"{container}.pid"


@dataclass
class Container:
    """What the agent knows about one container of one pod."""

    spec: Mapping[str, Any]
    init: bool = False
    popen: subprocess.Popen[bytes] | None = None
    restart_count: int = 0
    runs: int = 0
    started_at: str | None = None
    started_mono: float = 0.0
    terminated: dict[str, Any] | None = None
    last_terminated: dict[str, Any] | None = None
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    next_start: float | None = None
    ready: bool = False
    started: bool = False
    probes: dict[probes.ProbeKind, probes.Probe] = field(default_factory=dict)
    kill_reason: str | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def sidecar(self) -> bool:
        """A restartable init container (native sidecar)."""
        return self.init and self.spec.get("restartPolicy") == "Always"

    @property
    def done(self) -> bool:
        """Exited, and not waiting to be restarted."""
        return self.popen is None and self.next_start is None and self.terminated is not None

    @property
    def succeeded(self) -> bool:
        return self.terminated is not None and self.terminated["exitCode"] == 0

    def status(self, uid: str) -> dict[str, Any]:
        state: dict[str, Any]
        if self.popen is not None:
            state = {"running": {"startedAt": self.started_at}}
        elif self.terminated is not None and self.next_start is None:
            state = {"terminated": self.terminated}
        else:
            reason, message = self.waiting or ("ContainerCreating", "")
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        last = self.last_terminated
        if self.terminated is not None and self.next_start is not None:
            last = self.terminated  # waiting to restart: the run that just ended
        return {
            "name": self.name,
            "state": state,
            "lastState": {"terminated": last} if last else {},
            "ready": self.ready,
            "started": self.popen is not None and self.started,
            "restartCount": self.restart_count,
            "image": str(self.spec.get("image") or "none"),
            "imageID": f"{RUNTIME}local",
            **({"containerID": self.container_id(uid)} if self.runs else {}),
        }

    def container_id(self, uid: str) -> str:
        return f"{RUNTIME}{uid}/{self.name}/{self.runs}"


@dataclass(frozen=True)
class PodSandbox:
    """What the containers of one pod share: identity, network, volumes, where logs go."""

    uid: str
    namespace: str
    name: str
    net: PodNetwork
    volumes: PodVolumes
    source: ObjectSource
    mount_mode: MountMode
    mount_points: MountPoints
    state_dir: Path
    restart_policy: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def _executable(command: str, path: str, mounts: Sequence[Mount]) -> bool:
    """Whether ``command`` would exec (checked up front: the mount wrapper hides the error)."""
    if "/" in command:
        return os.access(host_path(command, mounts, IMAGE_PATHS), os.X_OK)
    return shutil.which(command, path=path) is not None


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _this_python(argv: Sequence[str]) -> list[str]:
    """``argv`` with a leading ``python``/``python3`` replaced by this interpreter."""
    head = [sys.executable] if argv and argv[0] in ("python", "python3") else list(argv[:1])
    return head + list(argv[1:])


class ContainerRunner:
    """Starts, restarts, probes and reaps the containers of one pod."""

    def __init__(
        self, sandbox: PodSandbox, pod: Callable[[], Pod], stopping: Callable[[], bool]
    ) -> None:
        self.sandbox = sandbox
        self._pod = pod
        self._stopping = stopping

    def start(self, c: Container) -> bool:
        """Starts (or restarts) one container; False when it cannot be configured (yet)."""
        box = self.sandbox
        try:
            env = container_environment(self._pod(), c.spec, box.net, box.source)
            argv = _this_python(container_argv(c.spec, env))
        except ContainerConfigError as e:
            c.waiting = ("CreateContainerConfigError", str(e))
            c.next_start = time.monotonic() + 1.0
            return False
        mounts = box.volumes.mounts_for(c.spec)
        if not _executable(argv[0], env.get("PATH", ""), mounts):
            c.runs += 1
            c.started_at = now()
            message = f'exec: "{argv[0]}": executable file not found in $PATH'
            self.record_exit(c, 128, "StartError", message)
            return False
        argv, env = apply_mounts(argv, env, mounts, box.mount_mode, box.mount_points, IMAGE_PATHS)
        cwd = REPO_ROOT
        if c.spec.get("workingDir"):
            cwd = Path(host_path(str(c.spec["workingDir"]), mounts, IMAGE_PATHS))
            cwd.mkdir(parents=True, exist_ok=True)
        if c.runs > 0:
            c.restart_count += 1
        logfile = container_log_path(
            box.state_dir, box.namespace, box.name, c.name, c.restart_count
        )
        try:
            c.popen = processes.spawn(argv, log=logfile, env=env, cwd=cwd)
        except OSError as e:
            c.runs += 1
            c.started_at = now()
            self.record_exit(c, 128, "StartError", f"{argv[0]}: {e}")
            return False
        c.runs += 1
        if c.terminated is not None:
            c.last_terminated = c.terminated
        c.terminated, c.waiting, c.next_start, c.kill_reason = None, None, None, None
        c.started_at, c.started_mono = now(), time.monotonic()
        c.ready = False
        c.probes = probes.container_probes(c.spec, c.started_mono)
        c.started = "startup" not in c.probes
        container_pid_path(box.state_dir, box.namespace, box.name, c.name).write_text(f"{c.popen.pid}\n")
        log.info("pod %s: started %s (pid %d)", box, c.name, c.popen.pid)
        return True

    def tick(self, containers: Sequence[Container]) -> None:
        """Reaps exited processes, restarts per policy, runs due probes."""
        t = time.monotonic()
        for c in containers:
            if c.popen is not None:
                code = c.popen.poll()
                if code is not None:
                    self.reap(c, code)
                else:
                    self._probe(c, t)
            if c.popen is None and c.next_start is not None and t >= c.next_start:
                self.start(c)

    def reap(self, c: Container, returncode: int) -> None:
        assert c.popen is not None
        processes.signal_group(c.popen, signal.SIGKILL)  # orphans of the container
        c.popen = None
        exit_code = _exit_code(returncode)
        self.record_exit(c, exit_code, "Completed" if exit_code == 0 else "Error", c.kill_reason)

    def record_exit(self, c: Container, exit_code: int, reason: str, message: str | None) -> None:
        """Marks the container terminated and schedules a restart if the policy says so."""
        c.terminated = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": c.started_at,
            "finishedAt": now(),
            "containerID": c.container_id(self.sandbox.uid),
        }
        if message:
            c.terminated["message"] = message
        c.ready, c.started = False, False
        policy = "Always" if c.sidecar else self.sandbox.restart_policy
        restart = policy == "Always" or (policy == "OnFailure" and exit_code != 0)
        if c.init and not c.sidecar and exit_code == 0:
            restart = False
        if restart and not self._stopping():
            c.next_start = time.monotonic() + min(10.0, 2.0 ** min(c.restart_count, 4))
            c.waiting = ("CrashLoopBackOff", f"back-off restarting failed container {c.name}")
        log.info("pod %s: %s exited %d", self.sandbox, c.name, exit_code)

    def kill(self, c: Container, reason: str) -> None:
        if c.popen is not None:
            c.kill_reason = reason
            processes.signal_group(c.popen, signal.SIGTERM)

    def _probe(self, c: Container, t: float) -> None:
        for kind in probes.PROBE_ORDER:
            probe = c.probes.get(kind)
            if probe is None or t < probe.next_at or (kind == "startup") == c.started:
                continue
            verdict = probe.record(self._run_probe(c, probe), t)
            if kind == "startup" and verdict:
                c.started = True
            elif kind == "startup" and verdict is False:
                self.kill(c, "Startup probe failed")
            elif kind == "liveness" and verdict is False:
                self.kill(c, "Liveness probe failed")
        if c.started and c.popen is not None:
            readiness = c.probes.get("readiness")
            c.ready = bool(readiness.result) if readiness else True

    def _run_probe(self, c: Container, probe: probes.Probe) -> bool:
        if "exec" not in probe.spec:
            return probes.check_network(probe, c.spec, self.sandbox.net.pod_ip)
        try:
            return self._exec_probe(c, probe.spec["exec"].get("command") or [], probe.timeout)
        except (OSError, subprocess.SubprocessError, ValueError):
            return False

    def _exec_probe(self, c: Container, command: Sequence[str], timeout: float) -> bool:
        box = self.sandbox
        try:
            env = container_environment(self._pod(), c.spec, box.net, box.source)
        except ContainerConfigError:
            return False
        argv = _this_python(command)
        mounts = box.volumes.mounts_for(c.spec)
        if box.mount_mode == "namespace" and mounts and c.popen is not None:
            argv = ["nsenter", f"--mount=/proc/{c.popen.pid}/ns/mnt", "--", *argv]
        else:
            argv, env = apply_mounts(argv, env, mounts, "rewrite", box.mount_points, IMAGE_PATHS)
        result = subprocess.run(
            argv, env=env, cwd=REPO_ROOT, capture_output=True, timeout=timeout, check=False
        )
        return result.returncode == 0
