"""The test node agent: a kubelet stand-in that runs pods' containers as local processes.

Everything in the cluster tier is real Kubernetes except the kubelet (no container
runtime here). This agent does the kubelet's job for one or more Nodes, against the real
API server, with the kubelet's contract:

Nodes. Each ``--node NAME:ISLAND:DEVICES`` is registered with labels
``pathways.dev/island`` and ``kubernetes.io/hostname``, capacity and allocatable ``cpu``,
``memory``, ``pods`` and the extended resource ``pathways.dev/device``; its status says
Ready with InternalIP 127.0.0.1; the ``node.kubernetes.io/not-ready`` taint that admission
puts on new Nodes is removed; a Lease in ``kube-node-lease`` is renewed. A Node deleted
behind the agent's back is registered again.

Pods. One list+watch per node (``spec.nodeName=<node>``), re-listed on every error or
timeout, with bounded backoff, so an API server restart is ridden out. Each new pod gets
a loopback IP ``127.0.0.N`` (N from 10, unique among this agent's pods, reused after the
pod is deleted; the /24 is claimed with a lock file, so an extra agent or a concurrent
test session on the same machine takes the next free one, 127.0.1, ...) and a
``PodWorker`` thread that: materializes volumes (see ``pod_volumes``), runs init containers in order
and then the containers, each as a process in its own session (``command`` + ``args``; the
image is ignored; ``python``/``python3`` is this interpreter, so the repo's virtualenv is
used; cwd is the repo root), with the environment a kubelet would give (see ``pod_env``);
honours ``restartPolicy`` with backoff; runs readiness, liveness and startup probes
(``tcpSocket``, ``httpGet``, ``exec``; ``grpc`` is checked as a TCP connect); and writes pod
status as a kubelet does (phase, IPs, ``startTime``, conditions, container statuses).

Deletion. When a pod gets a ``deletionTimestamp`` its process groups get SIGTERM, then
SIGKILL after the grace period (capped at ``MAX_GRACE_SECONDS``); the final status is
written and the pod is deleted with grace 0 -- the kubelet's last word. A pod that
disappears (force-deleted, or its Node removed) has its processes killed at once. When the
agent gets SIGTERM it kills all its containers and exits, leaving API objects as they are.

Logs. ``<state-dir>/pods/<namespace>_<pod>/<container>.log`` for a container's first run,
``.log.N`` for restart N: ``container_log_path``.

Run it as ``python -m tests.cluster.node_agent --kubeconfig K --node a-0:island-a:4
--state-dir D``; ``NodeAgentProcess`` does that for tests.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import urlparse

from tests.cluster import processes
from tests.cluster.pod_env import (
    ContainerConfigError,
    Pod,
    PodNetwork,
    container_argv,
    container_environment,
)
from tests.cluster.pod_volumes import (
    Mount,
    MountMode,
    MountPoints,
    PodVolumes,
    apply_mounts,
    detect_mount_mode,
    host_path,
)

log = logging.getLogger("kpw.node_agent")

REPO_ROOT = Path(__file__).resolve().parents[2]
ISLAND_LABEL = "pathways.dev/island"
DEVICE_RESOURCE = "pathways.dev/device"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
HOST_IP = "127.0.0.1"
MAX_GRACE_SECONDS = 30.0
KUBELET_VERSION = "v1.34.4"
TICK_SECONDS = 0.1
WATCH_SECONDS = 30
API_TIMEOUT = (5.0, 15.0)


# -- configuration ---------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    """One Node the agent stands in for: ``NAME:ISLAND:DEVICES``."""

    name: str
    island: str
    devices: int
    cpu: str = "16"
    memory: str = "64Gi"
    pods: int = 110

    @classmethod
    def parse(cls, text: str) -> NodeSpec:
        parts = text.split(":")
        if len(parts) != 3 or not parts[2].isdigit():
            raise ValueError(f"--node {text!r}: expected NAME:ISLAND:DEVICES, e.g. a-0:island-a:4")
        return cls(parts[0], parts[1], int(parts[2]))

    def __str__(self) -> str:
        return f"{self.name}:{self.island}:{self.devices}"


def container_log_path(
    state_dir: Path | str, namespace: str, pod: str, container: str, restart: int = 0
) -> Path:
    """Where the agent writes a container's stdout+stderr (``restart`` N: ``.log.N``)."""
    suffix = f".log.{restart}" if restart else ".log"
    return Path(state_dir) / "pods" / f"{namespace}_{pod}" / f"{container}{suffix}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- API adapter ---------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KubeApi:
    """JSON in, JSON out over the ``kubernetes`` client (no model deserialization).

    Raw JSON keeps the agent independent of the client's model classes and lets it read
    fields that the client does not know.
    """

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
        configuration.connection_pool_maxsize = 32
        self.host = str(configuration.host)
        self._client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self._client)
        self.coordination = client.CoordinationV1Api(self._client)
        self._exception: type[Exception] = client.ApiException

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", API_TIMEOUT)
        try:
            resp = method(*args, _preload_content=False, **kwargs)
        except self._exception as e:
            raise ApiError(int(getattr(e, "status", 0) or 0), str(getattr(e, "body", e))) from None
        data = resp.data
        return json.loads(data) if data else None

    def watch(self, method: Callable[..., Any], **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Watch events as dicts; ends when the server closes the stream (``timeout_seconds``)."""
        resp = method(
            watch=True,
            _preload_content=False,
            _request_timeout=(5.0, WATCH_SECONDS + 15.0),
            **kwargs,
        )
        try:
            buffer = b""
            for chunk in resp.stream(4096, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.close()
            resp.release_conn()

    # ObjectSource, for pod_env and pod_volumes
    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_or_none(self.core.read_namespaced_secret, name, namespace)

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_or_none(self.core.read_namespaced_config_map, name, namespace)

    def _get_or_none(self, method: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = self.call(method, *args)
            return result
        except ApiError as e:
            if e.status == 404:
                return None
            raise ContainerConfigError(str(e)) from None

    def request_token(
        self,
        namespace: str,
        serviceaccount: str,
        *,
        audiences: list[str],
        expiration_seconds: int,
        pod_name: str,
        pod_uid: str,
    ) -> str:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": audiences,
                "expirationSeconds": expiration_seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": pod_uid,
                },
            },
        }
        try:
            result = self.call(
                self.core.create_namespaced_service_account_token, serviceaccount, namespace, body
            )
        except ApiError as e:
            raise ContainerConfigError(f"token for serviceaccount {serviceaccount}: {e}") from None
        return str(result["status"]["token"])


# -- pod IPs -----------------------------------------------------------------------------

SUBNET_LOCK_DIR = Path(tempfile.gettempdir()) / "kpw-pod-subnets"


def claim_subnet(wanted: str = "auto") -> tuple[str, IO[bytes]]:
    """Locks a loopback /24 for this process's pods; returns it and the held lock file.

    ``auto`` takes the first of 127.0.0, 127.0.1, ... that no live agent holds. The lock
    is an flock, so it is released when the agent exits however it exits.
    """
    SUBNET_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    candidates = [f"127.0.{k}" for k in range(255)] if wanted == "auto" else [wanted]
    for subnet in candidates:
        lock = open(SUBNET_LOCK_DIR / f"{subnet}.lock", "ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return subnet, lock
        except BlockingIOError:
            lock.close()
    raise RuntimeError(f"pod subnet {wanted} is held by another node agent ({SUBNET_LOCK_DIR})")


class IpAllocator:
    """``<subnet>.N`` for N in [first, 254], lowest free first, reused once released."""

    def __init__(self, subnet: str = "127.0.0", first: int = 10) -> None:
        self._subnet = subnet
        self._first = first
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            for n in range(self._first, 255):
                if n not in self._used:
                    self._used.add(n)
                    return f"{self._subnet}.{n}"
        raise RuntimeError(f"no free pod IP left in {self._subnet}.{self._first}-254")

    def release(self, ip: str) -> None:
        with self._lock:
            self._used.discard(int(ip.rsplit(".", 1)[1]))


# -- probes --------------------------------------------------------------------------------


@dataclass
class _Probe:
    """One probe of one container, with the kubelet's thresholds and defaults."""

    spec: Mapping[str, Any]
    kind: str  # readiness | liveness | startup
    started: float
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0
    result: bool | None = None

    def __post_init__(self) -> None:
        self.next_at = self.started + float(self.spec.get("initialDelaySeconds", 0))

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    @property
    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds", 1))

    def record(self, ok: bool, now: float) -> bool | None:
        """Counts one outcome; returns the (possibly changed) verdict."""
        self.next_at = now + self.period
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.result = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= int(self.spec.get("failureThreshold", 3)):
                self.result = False
        return self.result


# -- containers ------------------------------------------------------------------------


@dataclass
class _Container:
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
    probes: dict[str, _Probe] = field(default_factory=dict)
    kill_reason: str | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def sidecar(self) -> bool:
        """A restartable init container (native sidecar)."""
        return self.init and self.spec.get("restartPolicy") == "Always"

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
            "imageID": "kpw-node-agent://local",
            **(
                {"containerID": f"kpw-node-agent://{uid}/{self.name}/{self.runs}"}
                if self.runs
                else {}
            ),
        }


def _executable(command: str, path: str, mounts: Sequence[Mount]) -> bool:
    """Whether ``command`` would exec (checked up front: the mount wrapper hides the error)."""
    if "/" in command:
        return os.access(host_path(command, mounts), os.X_OK)
    return shutil.which(command, path=path) is not None


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


# -- one pod ---------------------------------------------------------------------------


class PodWorker(threading.Thread):
    """Runs one pod from binding to deletion, and writes its status."""

    def __init__(self, agent: NodeAgent, pod: Pod, ip: str) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.agent = agent
        self.pod: Pod = pod
        self.uid = str(meta["uid"])
        self.namespace = str(meta["namespace"])
        self.pod_name = str(meta["name"])
        self.node = str(pod["spec"]["nodeName"])
        self.ip = ip
        self.net = PodNetwork(ip, HOST_IP, agent.apiserver_host, agent.apiserver_port)
        spec = pod["spec"]
        self.restart_policy = str(spec.get("restartPolicy", "Always"))
        self.init_containers = [_Container(c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [_Container(c) for c in spec.get("containers") or []]
        self.volumes = PodVolumes(pod, agent.state_dir / "volumes", agent.api, self.net)
        self.start_time = _now()
        self.phase = "Pending"
        self.initialized = False
        self.reason: str | None = None
        self.message: str | None = None
        self._conditions: dict[str, tuple[str, str, str | None, str | None]] = {}
        self._published: dict[str, Any] | None = None
        self._wake = threading.Event()
        self._delete_requested = False
        self._vanished = False
        self._shutdown = False
        self._lock = threading.Lock()

    # -- signals from the agent --------------------------------------------------------

    def observe(self, pod: Pod) -> None:
        with self._lock:
            self.pod = pod
            if pod["metadata"].get("deletionTimestamp"):
                self._delete_requested = True
        self._wake.set()

    def vanish(self) -> None:
        """The pod object is gone: kill everything now, write nothing."""
        self._vanished = True
        self._wake.set()

    def shutdown(self) -> None:
        """The agent is stopping: kill the containers, leave the API object alone."""
        self._shutdown = True
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._delete_requested or self._vanished or self._shutdown

    # -- lifecycle --------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._publish()
            if self._materialize() and self._run_init_containers():
                self.initialized = True
                self._run_containers()
            while not self.stopping:
                self._wake.wait(1.0)
                self._wake.clear()
                self._publish()
        except Exception:  # noqa: BLE001 - the pod must still be torn down
            log.exception("pod %s/%s: worker failed", self.namespace, self.pod_name)
        finally:
            self._teardown()

    def _sleep(self, seconds: float = TICK_SECONDS) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _materialize(self) -> bool:
        while not self.stopping:
            try:
                self.volumes.materialize()
                return True
            except ContainerConfigError as e:
                for c in self.init_containers + self.containers:
                    c.waiting = ("ContainerCreating", f"MountVolume.SetUp failed: {e}")
                self._publish()
                self._sleep(1.0)
        return False

    def _run_init_containers(self) -> bool:
        """Runs init containers in order; sidecars (restartPolicy Always) keep running."""
        sidecars: list[_Container] = []
        for c in self.init_containers:
            self._start(c)
            if c.sidecar:
                sidecars.append(c)
                continue
            while not self.stopping:
                self._tick([c, *sidecars])
                if c.popen is None and c.next_start is None and c.terminated is not None:
                    if c.terminated["exitCode"] == 0:
                        break
                    self._finish("Failed", None, f"init container {c.name} failed")
                    return False
                self._publish()
                self._sleep()
        return not self.stopping

    def _run_containers(self) -> None:
        for c in self.containers:
            self._start(c)
        while not self.stopping:
            sidecars = [s for s in self.init_containers if s.sidecar]
            self._tick(self.containers + sidecars)
            if all(
                c.popen is None and c.next_start is None and c.terminated for c in self.containers
            ):
                failed = any(
                    c.terminated and c.terminated["exitCode"] != 0 for c in self.containers
                )
                for s in sidecars:
                    self._kill(s, "sidecar stopped after the main containers")
                self._finish("Failed" if failed else "Succeeded", None, None)
                return
            if self.phase == "Pending" and all(c.runs > 0 for c in self.containers):
                self.phase = "Running"
            self._publish()
            self._sleep()

    def _finish(self, phase: str, reason: str | None, message: str | None) -> None:
        self.phase = phase
        self.reason, self.message = reason, message
        for c in self.containers + self.init_containers:
            c.ready = False
        self._publish()

    # -- containers -------------------------------------------------------------------

    def _start(self, c: _Container) -> bool:
        """Starts (or restarts) one container; False when it cannot be configured (yet)."""
        with self._lock:
            pod = self.pod
        try:
            env = container_environment(pod, c.spec, self.net, self.agent.api)
            argv = container_argv(c.spec, env)
        except ContainerConfigError as e:
            c.waiting = ("CreateContainerConfigError", str(e))
            c.next_start = time.monotonic() + 1.0
            self._publish()
            return False
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        mounts = self.volumes.mounts_for(c.spec)
        if not _executable(argv[0], env.get("PATH", ""), mounts):
            c.runs += 1
            c.started_at = _now()
            message = f'exec: "{argv[0]}": executable file not found in $PATH'
            self._record_exit(c, 128, "StartError", message)
            return False
        argv, env = apply_mounts(argv, env, mounts, self.agent.mount_mode, self.agent.mount_points)
        cwd = REPO_ROOT
        if c.spec.get("workingDir"):
            wd = Path(host_path(str(c.spec["workingDir"]), mounts))
            wd.mkdir(parents=True, exist_ok=True)
            cwd = wd
        if c.runs > 0:
            c.restart_count += 1
        logfile = container_log_path(
            self.agent.state_dir, self.namespace, self.pod_name, c.name, c.restart_count
        )
        try:
            c.popen = processes.spawn(argv, log=logfile, env=env, cwd=cwd)
        except OSError as e:
            c.runs += 1
            c.started_at = _now()
            self._record_exit(c, 128, "StartError", f"{argv[0]}: {e}")
            return False
        c.runs += 1
        if c.terminated is not None:
            c.last_terminated = c.terminated
        c.terminated, c.waiting, c.next_start, c.kill_reason = None, None, None, None
        c.started_at, c.started_mono = _now(), time.monotonic()
        c.ready = False
        c.probes = {
            kind: _Probe(c.spec[f"{kind}Probe"], kind, c.started_mono)
            for kind in ("readiness", "liveness", "startup")
            if c.spec.get(f"{kind}Probe")
        }
        c.started = "startup" not in c.probes
        log.info(
            "pod %s/%s: started %s (pid %d)", self.namespace, self.pod_name, c.name, c.popen.pid
        )
        return True

    def _backoff(self, c: _Container) -> float:
        return time.monotonic() + min(10.0, 2.0 ** min(c.restart_count, 4))

    def _tick(self, containers: Sequence[_Container]) -> None:
        """Reaps exited processes, restarts per policy, runs due probes."""
        now = time.monotonic()
        for c in containers:
            if c.popen is not None:
                code = c.popen.poll()
                if code is not None:
                    self._reap(c, code)
                else:
                    self._probe(c, now)
            if c.popen is None and c.next_start is not None and now >= c.next_start:
                self._start(c)

    def _reap(self, c: _Container, returncode: int) -> None:
        assert c.popen is not None
        processes.signal_group(c.popen, signal.SIGKILL)  # orphans of the container
        c.popen = None
        exit_code = _exit_code(returncode)
        self._record_exit(c, exit_code, "Completed" if exit_code == 0 else "Error", c.kill_reason)

    def _record_exit(self, c: _Container, exit_code: int, reason: str, message: str | None) -> None:
        """Marks the container terminated and schedules a restart if the policy says so."""
        c.terminated = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": c.started_at,
            "finishedAt": _now(),
            "containerID": f"kpw-node-agent://{self.uid}/{c.name}/{c.runs}",
        }
        if message:
            c.terminated["message"] = message
        c.ready, c.started = False, False
        policy = "Always" if c.sidecar else self.restart_policy
        restart = policy == "Always" or (policy == "OnFailure" and exit_code != 0)
        if c.init and not c.sidecar and exit_code == 0:
            restart = False
        if restart and not self.stopping:
            c.next_start = self._backoff(c)
            c.waiting = ("CrashLoopBackOff", f"back-off restarting failed container {c.name}")
        log.info("pod %s/%s: %s exited %d", self.namespace, self.pod_name, c.name, exit_code)

    def _kill(self, c: _Container, reason: str) -> None:
        if c.popen is not None:
            c.kill_reason = reason
            processes.signal_group(c.popen, signal.SIGTERM)

    def _probe(self, c: _Container, now: float) -> None:
        for kind in ("startup", "liveness", "readiness"):
            probe = c.probes.get(kind)
            if probe is None or now < probe.next_at:
                continue
            if kind != "startup" and not c.started:
                continue
            if kind == "startup" and c.started:
                continue
            verdict = probe.record(self._run_probe(c, probe), now)
            if kind == "startup" and verdict:
                c.started = True
            elif kind == "startup" and verdict is False:
                self._kill(c, "Startup probe failed")
            elif kind == "liveness" and verdict is False:
                self._kill(c, "Liveness probe failed")
        if c.started and c.popen is not None:
            readiness = c.probes.get("readiness")
            c.ready = bool(readiness.result) if readiness else True

    def _run_probe(self, c: _Container, probe: _Probe) -> bool:
        spec = probe.spec
        try:
            if "exec" in spec:
                return self._exec_probe(c, spec["exec"].get("command") or [], probe.timeout)
            if "tcpSocket" in spec or "grpc" in spec:
                target = spec.get("tcpSocket") or spec["grpc"]
                host = target.get("host") or self.ip
                with socket.create_connection((host, self._port(c, target["port"])), probe.timeout):
                    return True
            if "httpGet" in spec:
                get = spec["httpGet"]
                scheme = str(get.get("scheme", "HTTP")).lower()
                host = get.get("host") or self.ip
                url = f"{scheme}://{host}:{self._port(c, get['port'])}{get.get('path', '/')}"
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                req = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(req, timeout=probe.timeout) as resp:
                    return 200 <= int(resp.status) < 400
        except (OSError, urllib.error.URLError, subprocess.SubprocessError, ValueError):
            return False
        return False

    def _port(self, c: _Container, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"container {c.name} has no port named {port!r}")

    def _exec_probe(self, c: _Container, command: Sequence[str], timeout: float) -> bool:
        with self._lock:
            pod = self.pod
        try:
            env = container_environment(pod, c.spec, self.net, self.agent.api)
        except ContainerConfigError:
            return False
        argv = [
            sys.executable if a in ("python", "python3") and i == 0 else a
            for i, a in enumerate(command)
        ]
        mounts = self.volumes.mounts_for(c.spec)
        if self.agent.mount_mode == "namespace" and mounts and c.popen is not None:
            argv = ["nsenter", f"--mount=/proc/{c.popen.pid}/ns/mnt", "--", *argv]
        else:
            argv, env = apply_mounts(argv, env, mounts, "rewrite", self.agent.mount_points)
        result = subprocess.run(
            argv, env=env, cwd=REPO_ROOT, capture_output=True, timeout=timeout, check=False
        )
        return result.returncode == 0

    # -- status -----------------------------------------------------------------------

    def _condition(
        self, kind: str, status: bool, reason: str | None = None, message: str | None = None
    ) -> dict[str, Any]:
        value = "True" if status else "False"
        previous = self._conditions.get(kind)
        if previous is None or previous[0] != value:
            self._conditions[kind] = (value, _now(), reason, message)
        else:
            self._conditions[kind] = (value, previous[1], reason, message)
        _, since, reason, message = self._conditions[kind]
        cond: dict[str, Any] = {
            "type": kind,
            "status": value,
            "lastProbeTime": None,
            "lastTransitionTime": since,
        }
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        return cond

    def status(self) -> dict[str, Any]:
        terminal = self.phase in ("Succeeded", "Failed")
        regular = self.containers + [c for c in self.init_containers if c.sidecar]
        unready = [c.name for c in regular if not c.ready]
        if terminal:
            ready_reason, ready_message = "PodCompleted", None
        elif unready:
            ready_reason = "ContainersNotReady"
            ready_message = f"containers with unready status: [{' '.join(unready)}]"
        else:
            ready_reason, ready_message = None, None
        pending_init = [
            c.name
            for c in self.init_containers
            if not c.sidecar and not (c.terminated and c.terminated["exitCode"] == 0)
        ]
        conditions = [
            self._condition("PodReadyToStartContainers", not terminal),
            self._condition(
                "Initialized",
                self.initialized or not pending_init,
                None if self.initialized or not pending_init else "ContainersNotInitialized",
                None
                if self.initialized or not pending_init
                else f"containers with incomplete status: [{' '.join(pending_init)}]",
            ),
            self._condition(
                "ContainersReady", not terminal and not unready, ready_reason, ready_message
            ),
            self._condition("Ready", not terminal and not unready, ready_reason, ready_message),
        ]
        with self._lock:
            observed = self.pod.get("status") or {}
        if not any(c.get("type") == "PodScheduled" for c in observed.get("conditions") or []):
            conditions.insert(0, self._condition("PodScheduled", True))
        status: dict[str, Any] = {
            "phase": self.phase,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "conditions": conditions,
            "containerStatuses": [c.status(self.uid) for c in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status(self.uid) for c in self.init_containers]
        if self.reason:
            status["reason"] = self.reason
        if self.message:
            status["message"] = self.message
        return status

    def _publish(self) -> None:
        """Patches the pod status when it changed (or the last write failed)."""
        if self._vanished:
            return
        status = self.status()
        if status == self._published:
            return
        body = {"metadata": {"uid": self.uid}, "status": status}
        try:
            self.agent.api.call(
                self.agent.api.core.patch_namespaced_pod_status,
                self.pod_name,
                self.namespace,
                body,
                _content_type="application/strategic-merge-patch+json",
            )
            self._published = status
        except ApiError as e:
            if e.status in (404, 409):
                log.info("pod %s/%s: gone (%s)", self.namespace, self.pod_name, e)
                self._vanished = True
            else:
                log.warning("pod %s/%s: status not written: %s", self.namespace, self.pod_name, e)
        except Exception as e:  # noqa: BLE001 - API server down: retried next tick
            log.warning("pod %s/%s: status not written: %s", self.namespace, self.pod_name, e)

    # -- teardown ---------------------------------------------------------------------

    def _teardown(self) -> None:
        with self._lock:
            meta = self.pod["metadata"]
        grace = float(
            meta.get("deletionGracePeriodSeconds")
            if meta.get("deletionGracePeriodSeconds") is not None
            else self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        )
        if self._vanished:
            grace = min(grace, 2.0)
        if self._shutdown:
            grace = min(grace, 2.0)
        grace = min(grace, MAX_GRACE_SECONDS)
        everything = self.containers + self.init_containers
        for c in everything:
            if c.popen is not None:
                processes.signal_group(c.popen, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(c.popen is not None and c.popen.poll() is None for c in everything):
            if not processes.wait_until(deadline, 0.05):
                break
        for c in everything:
            if c.popen is not None:
                processes.signal_group(c.popen, signal.SIGKILL)
                try:
                    c.popen.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    pass
                code = c.popen.returncode
                c.next_start = None
                self._reap(c, code if code is not None else -signal.SIGKILL)
                c.next_start = None
        if self._delete_requested and not self._vanished and not self._shutdown:
            if self.phase not in ("Succeeded", "Failed"):
                ok = all(c.terminated and c.terminated["exitCode"] == 0 for c in self.containers)
                self.phase = "Succeeded" if ok else "Failed"
            for c in everything:
                c.ready = False
            self._publish()
            try:
                self.agent.api.call(
                    self.agent.api.core.delete_namespaced_pod,
                    self.pod_name,
                    self.namespace,
                    body={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
                    grace_period_seconds=0,
                )
            except ApiError as e:
                if e.status not in (404, 409):
                    log.warning(
                        "pod %s/%s: final delete failed: %s", self.namespace, self.pod_name, e
                    )
            except Exception as e:  # noqa: BLE001 - re-listing will retry the deletion
                log.warning("pod %s/%s: final delete failed: %s", self.namespace, self.pod_name, e)
        if not self._shutdown:
            self.volumes.cleanup()
        self.agent.forget(self)


# -- nodes --------------------------------------------------------------------------------


class NodeRegistrar:
    """Registers the agent's Nodes, keeps them Ready, and renews their Leases."""

    def __init__(self, api: KubeApi, nodes: Sequence[NodeSpec], heartbeat_seconds: float) -> None:
        self.api = api
        self.nodes = list(nodes)
        self.heartbeat_seconds = heartbeat_seconds
        self._uids: dict[str, str] = {}
        self._since: dict[str, str] = {}

    def register(self, node: NodeSpec) -> None:
        core = self.api.core
        labels = {
            ISLAND_LABEL: node.island,
            "kubernetes.io/hostname": node.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        try:
            obj = self.api.call(
                core.create_node,
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node.name, "labels": labels},
                },
            )
        except ApiError as e:
            if e.status != 409:
                raise
            obj = self.api.call(
                core.patch_node, node.name, {"metadata": {"labels": labels}},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
        self._uids[node.name] = obj["metadata"]["uid"]
        self.heartbeat(node)
        taints = obj.get("spec", {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
        if len(kept) != len(taints):
            self.api.call(
                core.patch_node, node.name, {"spec": {"taints": kept or None}},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
        log.info("node %s registered (island %s, %d devices)", node.name, node.island, node.devices)

    def heartbeat(self, node: NodeSpec) -> None:
        now = _now()
        since = self._since.setdefault(node.name, now)
        resources = {
            "cpu": node.cpu,
            "memory": node.memory,
            "pods": str(node.pods),
            DEVICE_RESOURCE: str(node.devices),
        }
        healthy = {
            "MemoryPressure": ("False", "KubeletHasSufficientMemory"),
            "DiskPressure": ("False", "KubeletHasNoDiskPressure"),
            "PIDPressure": ("False", "KubeletHasSufficientPID"),
            "Ready": ("True", "KubeletReady"),
        }
        conditions = [
            {
                "type": kind,
                "status": value,
                "reason": reason,
                "message": "posted by the kube-pathways test node agent",
                "lastHeartbeatTime": now,
                "lastTransitionTime": since,
            }
            for kind, (value, reason) in healthy.items()
        ]
        status = {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": node.name}],
            "nodeInfo": {
                "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": os.uname().release,
                "osImage": "kpw-node-agent", "containerRuntimeVersion": "kpw-node-agent://0.1",
                "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }  # fmt: skip
        self.api.call(
            self.api.core.patch_node_status, node.name, {"status": status},
            _content_type="application/strategic-merge-patch+json",
        )  # fmt: skip
        self._renew_lease(node)

    def _renew_lease(self, node: NodeSpec) -> None:
        coordination = self.api.coordination
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": node.name,
                "namespace": "kube-node-lease",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": uid}
                    for uid in [self._uids.get(node.name)]
                    if uid
                ],
            },
            "spec": {
                "holderIdentity": node.name,
                "leaseDurationSeconds": 40,
                "renewTime": _now_micro(),
            },
        }
        try:
            self.api.call(
                coordination.patch_namespaced_lease, node.name, "kube-node-lease",
                {"spec": body["spec"]}, _content_type="application/merge-patch+json",
            )  # fmt: skip
        except ApiError as e:
            if e.status != 404:
                raise
            self.api.call(coordination.create_namespaced_lease, "kube-node-lease", body)

    def run(self, stop: threading.Event) -> None:
        """Registers every node, then heartbeats until ``stop``; re-registers lost Nodes."""
        pending = list(self.nodes)
        backoff = 0.5
        while not stop.is_set():
            try:
                while pending:
                    self.register(pending[0])
                    pending.pop(0)
                backoff = 0.5
                if stop.wait(self.heartbeat_seconds):
                    return
                for node in self.nodes:
                    try:
                        self.heartbeat(node)
                    except ApiError as e:
                        if e.status != 404:
                            raise
                        pending.append(node)
            except Exception as e:  # noqa: BLE001 - the API server may be restarting
                log.warning("node heartbeat failed (retrying in %.1f s): %s", backoff, e)
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)


# -- the agent -------------------------------------------------------------------------------


class NodeAgent:
    """Watches pods bound to its nodes and runs them (one ``PodWorker`` each)."""

    def __init__(
        self,
        kubeconfig: Path,
        nodes: Sequence[NodeSpec],
        state_dir: Path,
        *,
        pod_subnet: str = "auto",
        heartbeat_seconds: float = 10.0,
    ) -> None:
        self.api = KubeApi(kubeconfig)
        server = urlparse(self.api.host)
        self.apiserver_host = server.hostname or "127.0.0.1"
        self.apiserver_port = server.port or 443
        self.nodes = list(nodes)
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.mount_mode: MountMode = detect_mount_mode(state_dir / "tmp")
        self.mount_points = MountPoints()
        self.pod_subnet, self._subnet_lock = claim_subnet(pod_subnet)
        (state_dir / "pod-subnet").write_text(self.pod_subnet)
        self.ips = IpAllocator(self.pod_subnet)
        self.registrar = NodeRegistrar(self.api, nodes, heartbeat_seconds)
        self.stop_event = threading.Event()
        self._workers: dict[str, PodWorker] = {}
        self._done: set[str] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        log.info(
            "agent: nodes %s, pod IPs %s.10-254, mounts by %s, state in %s",
            [str(n) for n in self.nodes],
            self.pod_subnet,
            self.mount_mode,
            self.state_dir,
        )
        self._threads.append(
            threading.Thread(
                target=self.registrar.run, args=(self.stop_event,), name="nodes", daemon=True
            )
        )
        for node in self.nodes:
            self._threads.append(
                threading.Thread(
                    target=self._watch_pods,
                    args=(node.name,),
                    name=f"watch-{node.name}",
                    daemon=True,
                )
            )
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Kills every container (bounded), leaves API objects alone."""
        self.stop_event.set()
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.shutdown()
        deadline = time.monotonic() + timeout
        for w in workers:
            w.join(max(0.0, deadline - time.monotonic()))
        self.mount_points.remove_created()

    def forget(self, worker: PodWorker) -> None:
        with self._lock:
            if self._workers.get(worker.uid) is worker:
                del self._workers[worker.uid]
            self._done.add(worker.uid)
        self.ips.release(worker.ip)

    # -- pods -------------------------------------------------------------------------

    def _watch_pods(self, node: str) -> None:
        selector = f"spec.nodeName={node}"
        core = self.api.core
        backoff = 0.5
        while not self.stop_event.is_set():
            try:
                listing = self.api.call(core.list_pod_for_all_namespaces, field_selector=selector)
                self._sync(node, listing["items"])
                backoff = 0.5
                rv = listing["metadata"]["resourceVersion"]
                for event in self.api.watch(
                    core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=rv,
                    timeout_seconds=WATCH_SECONDS,
                    allow_watch_bookmarks=True,
                ):
                    if self.stop_event.is_set():
                        return
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        raise ApiError(int(obj.get("code", 0)), str(obj.get("message")))
                    if kind in ("ADDED", "MODIFIED"):
                        self._handle(obj)
                    elif kind == "DELETED":
                        self._handle_deleted(obj)
            except Exception as e:  # noqa: BLE001 - re-list after a bounded backoff
                if self.stop_event.is_set():
                    return
                log.warning(
                    "watch of pods on %s failed (re-listing in %.1f s): %s", node, backoff, e
                )
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _sync(self, node: str, pods: Sequence[Pod]) -> None:
        present = {p["metadata"]["uid"] for p in pods}
        with self._lock:
            lost = [w for w in self._workers.values() if w.node == node and w.uid not in present]
        for w in lost:
            w.vanish()
        for pod in pods:
            self._handle(pod)

    def _handle(self, pod: Pod) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        with self._lock:
            worker = self._workers.get(uid)
            if worker is None and not self.stop_event.is_set():
                if uid in self._done:
                    return
                phase = (pod.get("status") or {}).get("phase")
                if meta.get("deletionTimestamp"):
                    self._done.add(uid)
                    threading.Thread(
                        target=self._finalize_unstarted, args=(pod,), daemon=True
                    ).start()
                    return
                if phase in ("Succeeded", "Failed"):
                    self._done.add(uid)
                    return
                worker = PodWorker(self, pod, self.ips.allocate())
                self._workers[uid] = worker
                worker.start()
                return
        if worker is not None:
            worker.observe(pod)

    def _handle_deleted(self, pod: Pod) -> None:
        with self._lock:
            worker = self._workers.get(pod["metadata"]["uid"])
        if worker is not None:
            worker.vanish()

    def _finalize_unstarted(self, pod: Pod) -> None:
        """A pod deleted before (or after) this agent ran it: the kubelet's final delete."""
        meta = pod["metadata"]
        try:
            self.api.call(
                self.api.core.delete_namespaced_pod, meta["name"], meta["namespace"],
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
                grace_period_seconds=0,
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - already gone, or retried at the next re-list
            log.info("pod %s/%s: final delete: %s", meta["namespace"], meta["name"], e)
            with self._lock:
                self._done.discard(meta["uid"])


# -- running it ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster.node_agent", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument(
        "--node", action="append", type=NodeSpec.parse, required=True, metavar="NAME:ISLAND:DEVICES"
    )
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument(
        "--pod-subnet",
        default="auto",
        help="pod IPs are <subnet>.10 .. <subnet>.254; auto: first free 127.0.K",
    )
    parser.add_argument("--heartbeat-seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s"
    )
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    agent = NodeAgent(
        args.kubeconfig,
        args.node,
        args.state_dir,
        pod_subnet=args.pod_subnet,
        heartbeat_seconds=args.heartbeat_seconds,
    )

    def _on_signal(signum: int, frame: object) -> None:
        agent.stop_event.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    agent.start()
    while not agent.stop_event.wait(1.0):
        pass
    log.info("agent: stopping")
    agent.stop()
    log.info("agent: stopped")
    return 0


class NodeAgentProcess:
    """Runs ``python -m tests.cluster.node_agent`` as a child process, for tests.

    ``with NodeAgentProcess(kubeconfig, [NodeSpec("c-0", "island-c", 4)], state_dir) as agent:``
    starts it and waits until its Nodes are Ready; leaving the block stops it and, with
    ``delete_nodes=True`` (the default), deletes its Nodes so that nothing gets scheduled
    onto a node no agent serves.
    """

    def __init__(
        self,
        kubeconfig: Path,
        nodes: Sequence[NodeSpec],
        state_dir: Path,
        *,
        pod_subnet: str = "auto",
        log_file: Path | None = None,
        delete_nodes: bool = True,
        heartbeat_seconds: float = 10.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.env = dict(env or {})
        self.nodes = list(nodes)
        self.state_dir = state_dir
        self.pod_subnet = pod_subnet
        self.log_file = log_file or state_dir / "node-agent.log"
        self.delete_nodes = delete_nodes
        self.heartbeat_seconds = heartbeat_seconds
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout: float = 60.0) -> NodeAgentProcess:
        argv = [
            sys.executable, "-m", "tests.cluster.node_agent",
            "--kubeconfig", str(self.kubeconfig), "--state-dir", str(self.state_dir),
            "--pod-subnet", self.pod_subnet, "--heartbeat-seconds", str(self.heartbeat_seconds),
        ]  # fmt: skip
        for node in self.nodes:
            argv += ["--node", str(node)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.popen = processes.spawn(
            argv, log=self.log_file, env=env, cwd=REPO_ROOT, append_log=True
        )
        try:
            self.wait_ready(ready_timeout)
            self.pod_subnet = (self.state_dir / "pod-subnet").read_text().strip()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float) -> float:
        """Waits until every Node is Ready and schedulable; returns the seconds taken."""
        api = KubeApi(self.kubeconfig)
        start = time.monotonic()
        deadline = start + timeout
        waiting = {n.name for n in self.nodes}
        while True:
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(
                    f"node agent exited with {self.popen.returncode}:\n{processes.log_tail(self.log_file)}"
                )
            for name in sorted(waiting):
                try:
                    node = api.call(api.core.read_node, name)
                except Exception:  # noqa: BLE001 - not registered yet
                    continue
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in node.get("status", {}).get("conditions") or []
                )
                tainted = any(
                    t.get("key") == NOT_READY_TAINT
                    for t in node.get("spec", {}).get("taints") or []
                )
                if ready and not tainted:
                    waiting.discard(name)
            if not waiting:
                return time.monotonic() - start
            if not processes.wait_until(deadline, 0.2):
                raise RuntimeError(
                    f"nodes {sorted(waiting)} not Ready within {timeout:.0f} s; agent log:\n"
                    f"{processes.log_tail(self.log_file)}"
                )

    def stop(self, grace_seconds: float = 20.0) -> None:
        if self.popen is not None:
            processes.stop(self.popen, grace_seconds)
            self.popen = None
        if self.delete_nodes:
            api = KubeApi(self.kubeconfig)
            for node in self.nodes:
                try:
                    api.call(api.core.delete_node, node.name)
                except Exception:  # noqa: BLE001 - already gone or the API is down
                    pass

    def __enter__(self) -> NodeAgentProcess:
        return self if self.popen is not None else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
