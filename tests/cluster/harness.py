"""What a cluster test works with: the cluster, the operator process, their objects.

The fixtures in ``conftest`` build these; tests get them as fixture arguments and import
this module only for the types and for ``condition``:

* ``Cluster``: one real control plane and node agent per session, with an admin
  kubeconfig, a python ``ApiClient``, kubectl, the agent's state directory (container
  logs), bounded polling, per-test namespaces, and ``start_agent`` for tests that need
  Nodes of their own.
* ``OperatorProcess``: ``python -m pathways_operator --all-namespaces`` against that
  cluster, with its metrics on port 0 (the port read back from its log), and its
  controller (which driver pods dial) and kopf's liveness endpoint (its readiness
  signal) on reserved ports, kept across restarts.
  ``restart(kill=True)`` SIGKILLs it and starts a new one on the same state directory,
  which is what an operator pod restart looks like.
* ``Objects``: the VirtualSlices, PathwaysPrograms, pods and Events of one test
  namespace, with bounded waits for phases and Events that print the operator's log
  when they time out.

The three belong together (each is read through the one before), which is why this
module is a little over 400 lines.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client import ApiClient

from pathways_devcluster import processes
from pathways_devcluster.controlplane import REPO_ROOT, ControlPlane
from pathways_devcluster.node_agent import NodeAgentProcess, NodeSpec, container_log_path, container_pid_path
from pathways_devcluster.ports import ReservedPort, reserve_port
from pathways_wire.driver_protocol import DRIVER_LOG_KEY, RunStart, driver_log_config_map, run_starts
from tests.cluster.builders import GROUP, VERSION, Manifest

T = TypeVar("T")
CRDS = ("virtualslices.pathways.dev", "pathwaysprograms.pathways.dev")
READY_TIMEOUT_S = 60.0
ALLOWED_ENTRYPOINTS = "examples.,tests.cluster.faulty_programs:"
"""The examples, and the misbehaving entrypoints of ``faulty_programs``."""
METRICS_PORT = re.compile(r"serving /metrics on port (\d+)")
"""What the operator logs once ``--metrics-port any`` is bound."""


@dataclass
class Cluster:
    """What a cluster test gets to work with."""

    control_plane: ControlPlane
    api: ApiClient
    agent: NodeAgentProcess
    run_dir: Path
    startup_seconds: dict[str, float] = field(default_factory=dict)
    _extra_agents: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def state_dir(self) -> Path:
        """The default agent's state directory (``pods/<ns>_<pod>/<container>.log``)."""
        return self.agent.state_dir

    def __post_init__(self) -> None:
        # The client's models type every field Optional; tests read them freely, so the
        # API handles are typed Any rather than asserting non-None at every step.
        self.core: Any = client.CoreV1Api(self.api)
        self.apps: Any = client.AppsV1Api(self.api)
        self.apiextensions: Any = client.ApiextensionsV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.coordination: Any = client.CoordinationV1Api(self.api)

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        timeout: float = 60.0,
        input: str | None = None,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Runs kubectl against this cluster (admin unless ``kubeconfig`` is given)."""
        kubectl = shutil.which("kubectl")
        assert kubectl is not None
        argv = [kubectl, "--kubeconfig", str(kubeconfig or self.kubeconfig), *args]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, input=input, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv[1:])} exited {result.returncode}:\n{result.stderr}{result.stdout}"
            )
        return result

    def container_log(self, namespace: str, pod: str, container: str, restart: int = 0) -> Path:
        return container_log_path(self.state_dir, namespace, pod, container, restart)

    def container_pid(self, namespace: str, pod: str, container: str) -> int:
        """The PID the default agent recorded when it started the container's current run."""
        return int(container_pid_path(self.state_dir, namespace, pod, container).read_text())

    def poll(
        self,
        check: Callable[[], T | None],
        *,
        timeout: float = 30.0,
        interval: float = 0.2,
        what: str = "condition",
    ) -> T:
        """Calls ``check`` until it returns something truthy; fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        last: T | None = None
        while True:
            last = check()
            if last:
                return last
            if time.monotonic() >= deadline:
                raise AssertionError(f"{what}: not reached within {timeout:.0f} s (last: {last!r})")
            time.sleep(interval)

    def wait_pod_phase(
        self, namespace: str, name: str, phases: set[str], timeout: float = 30.0
    ) -> Any:
        """The pod (a ``V1Pod``) once its phase is one of ``phases``."""

        def in_phase() -> Any:
            p = self.core.read_namespaced_pod(name, namespace)
            return p if p.status and p.status.phase in phases else None

        try:
            return self.poll(
                in_phase, timeout=timeout, what=f"pod {namespace}/{name} in {sorted(phases)}"
            )
        except AssertionError as err:
            p = self.core.read_namespaced_pod(name, namespace)
            status = p.status
            conditions = "; ".join(
                f"{c.type}={c.status} {c.reason or ''} {c.message or ''}".strip()
                for c in (status.conditions or ())
            ) if status else ""
            raise AssertionError(
                f"{err}; the pod is in phase {status.phase if status else None!r} on node "
                f"{p.spec.node_name!r}, conditions: {conditions or 'none'}"
            ) from None

    def create_namespace(self, prefix: str = "t", timeout: float = 30.0) -> str:
        """A fresh namespace, ready for pods (service account and root CA published)."""
        name = (
            f"{re.sub(r'[^a-z0-9-]+', '-', prefix.lower())[:40].strip('-')}-{secrets.token_hex(3)}"
        )
        self.control_plane.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        self.control_plane.wait_namespace_ready(name, timeout=timeout)
        return name

    def start_agent(
        self,
        nodes: Sequence[NodeSpec | str],
        *,
        ready_timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> NodeAgentProcess:
        """Starts another node agent (own state dir and pod subnet) and waits for its Nodes.

        Its pods get IPs in ``agent.pod_subnet`` (another /24 than the default agent's).

        Use as a context manager, or call ``stop()``: stopping deletes its Nodes. ``env``
        is added to the agent's environment (e.g. ``KPW_NODE_AGENT_MOUNTS=rewrite``).
        """
        specs = [n if isinstance(n, NodeSpec) else NodeSpec.parse(n) for n in nodes]
        index = next(self._extra_agents)
        agent = NodeAgentProcess(
            self.kubeconfig,
            specs,
            self.run_dir / f"node-agent-{index}",
            env=env,
        )
        return agent.start(ready_timeout)


class OperatorProcess:
    """``python -m pathways_operator`` against the test cluster; logs in ``log_path``."""

    def __init__(self, kubeconfig: Path, run_dir: Path, *extra_args: str) -> None:
        self.kubeconfig = kubeconfig
        self.run_dir = run_dir
        self.state_dir = run_dir / "state"
        self.log_path = run_dir / "operator.log"
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self.liveness_port = 0
        self.metrics_port = 0
        self.starts = 0
        self._liveness: ReservedPort | None = None
        self._controller: ReservedPort | None = None
        self._calls: ReservedPort | None = None

    def start(self, timeout: float = READY_TIMEOUT_S, *, until_live: bool = True) -> OperatorProcess:
        """Starts the operator and, ``until_live``, waits until it serves (an operator waiting
        for the Lease another holds is never live: it is only started)."""
        if self._liveness is None:  # kopf cannot bind port 0 (see ``ports``); kept across restarts
            self._liveness = reserve_port()
        if self._controller is None:  # driver pods keep the address they were given across restarts
            self._controller = reserve_port()
        if self._calls is None and driver_runtime(self.extra_args) == "pods":  # and the calls port they learned
            self._calls = reserve_port()
        self.liveness_port = self._liveness.port
        self.metrics_port = 0
        argv = [
            sys.executable, "-m", "pathways_operator", "--all-namespaces",
            "--controller-listen", f"127.0.0.1:{self._controller.port}",
            *(["--controller-calls-port", str(self._calls.port)] if self._calls is not None else []),
            "--state-dir", str(self.state_dir),
            "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
            "--metrics-port", "any",
            "--allowed-entrypoints", ALLOWED_ENTRYPOINTS,
            "--driver-checkpoint-volumes", "host-path",
            *self.extra_args,
        ]  # fmt: skip
        env = {**_base_env(), "KUBECONFIG": str(self.kubeconfig), "PATHWAYS_LOG_LEVEL": "INFO"}
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== operator start #{self.starts} =====\n".encode())
            since = log.tell()
        self.process = processes.spawn(argv, log=self.log_path, env=env, cwd=REPO_ROOT, append_log=True)
        if not until_live:
            return self
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.liveness_port}/healthz"
        while processes.wait_until(deadline, 0.2):
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the operator exited with {self.process.returncode} while starting:\n{self.log_tail()}"
                )
            self.metrics_port = self.metrics_port or self._reported_metrics_port(since)
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if reply.status == 200 and self.metrics_port:
                        return self
            except (urllib.error.URLError, OSError):
                continue
        raise AssertionError(f"the operator was not live within {timeout:.0f} s:\n{self.log_tail()}")

    @property
    def controller_address(self) -> str:
        """HOST:PORT of the operator's controller (what its driver pods dial)."""
        assert self._controller is not None, "the operator has not started"
        return f"127.0.0.1:{self._controller.port}"

    def _reported_metrics_port(self, since: int) -> int:
        """The port ``--metrics-port any`` bound, from the log this start wrote (0: not yet)."""
        with open(self.log_path, "rb") as log:
            log.seek(since)
            found = METRICS_PORT.search(log.read().decode("utf-8", "replace"))
        return int(found.group(1)) if found else 0

    def close(self) -> None:
        """Stops the operator for good and gives back its liveness port."""
        self.stop()
        for reserved in (self._liveness, self._controller):
            if reserved is not None:
                reserved.release()
        self._liveness = self._controller = None

    def stop(self, *, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            processes.signal_group(self.process, signal.SIGKILL)
            self.process.wait(10)
        else:
            processes.stop(self.process, grace_seconds=15.0)
        self.process = None

    def restart(self, *, kill: bool = True) -> None:
        self.stop(kill=kill)
        self.start()

    def metrics(self) -> str:
        """The operator's Prometheus exposition text."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, max_bytes: int = 6000) -> str:
        return processes.log_tail(self.log_path, max_bytes)


def driver_runtime(operator_args: Sequence[str]) -> str:
    """The ``--driver-runtime`` that `operator_args` ask for (the operator's default: pods).
    Only an operator with driver pods serves a calls port: one of child-process drivers
    refuses the flag."""
    for i, arg in enumerate(operator_args):
        if arg.startswith("--driver-runtime="):
            return arg.partition("=")[2]
        if arg == "--driver-runtime" and i + 1 < len(operator_args):
            return operator_args[i + 1]
    return "pods"


def _base_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "KPW_CACHE")
    return {k: os.environ[k] for k in keep if k in os.environ}


# -- reading state ---------------------------------------------------------------------------


class Objects:
    """Reads VirtualSlices, PathwaysPrograms, pods and events of one namespace."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.custom: Any = client.CustomObjectsApi(cluster.api)
        self.core: Any = client.CoreV1Api(cluster.api)

    def apply(self, manifest: Manifest) -> float:
        """``kubectl apply`` a manifest; returns the monotonic time the command returned."""
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(manifest))
        return time.monotonic()

    def get(self, plural: str, name: str) -> Manifest | None:
        try:
            found: Manifest = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name
            )
            return found
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def slice(self, name: str) -> Manifest:
        found = self.get("virtualslices", name)
        assert found is not None, f"VirtualSlice {self.namespace}/{name} does not exist"
        return found

    def slice_token(self, name: str) -> str:
        """The token slice ``name``'s hosts demand, from the Secret the slice owns."""
        secret = self.cluster.core.read_namespaced_secret(f"{name}-pathways-token", self.namespace)
        owners = [(ref.kind, ref.name) for ref in secret.metadata.owner_references or []]
        assert owners == [("VirtualSlice", name)], owners
        return base64.b64decode(secret.data["token"]).decode()

    def program(self, name: str) -> Manifest:
        found = self.get("pathwaysprograms", name)
        assert found is not None, f"PathwaysProgram {self.namespace}/{name} does not exist"
        return found

    def pods(self, label_selector: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=label_selector).items)

    def pod_uids(self, label_selector: str) -> dict[str, str]:
        return {p.metadata.name: p.metadata.uid for p in self.pods(label_selector)}

    def delete(self, plural: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, name)
        except client.ApiException as e:
            if e.status != 404:
                raise

    def configmap(self, name: str) -> dict[str, str]:
        return dict(self.core.read_namespaced_config_map(name, self.namespace).data or {})

    def driver_starts(self, program: str, timeout: float = 30.0) -> list[RunStart]:
        """Where each run of a finished program's driver started, read from the driver log the
        operator keeps in ConfigMap ``<program>-driver-log`` (waited for: it is written as the
        program ends, after its status)."""

        def kept() -> str | None:
            try:
                return self.configmap(driver_log_config_map(program)).get(DRIVER_LOG_KEY)
            except client.ApiException as e:
                if e.status == 404:
                    return None
                raise

        log = self.cluster.poll(kept, timeout=timeout, interval=0.5, what=f"the driver log of {program}")
        return run_starts(log)

    def cleanup(self, timeout: float = 90.0) -> None:
        """Delete the namespace's programs and slices and wait until their pods are gone.

        Tests share the cluster's islands: a test must not leave devices held for the next.
        """
        for plural in ("pathwaysprograms", "virtualslices"):
            listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)
            for item in listed.get("items", []):
                self.delete(plural, item["metadata"]["name"])
        self.cluster.poll(
            lambda: not self.pods("pathways.dev/slice") and not self._remaining(),
            timeout=timeout, interval=0.5,
            what=f"pods and slices of namespace {self.namespace} deleted",
        )

    def _remaining(self) -> list[str]:
        left = []
        for plural in ("pathwaysprograms", "virtualslices"):
            listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)
            left += [f"{plural}/{i['metadata']['name']}" for i in listed.get("items", [])]
        return left

    def events(self, name: str) -> list[Any]:
        found = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        ).items
        return list(found)

    def wait_event(self, name: str, reason: str, timeout: float = 30.0, text: str = "") -> Any:
        """The first Event about ``name`` with ``reason`` (and ``text`` in its message).

        The operator posts Events after it writes status, from a queue of its own, so a test that has just
        seen a phase waits here a bounded time for the Event that goes with it.
        """

        def posted() -> Any:
            for event in self.events(name):
                if event.reason == reason and text in (event.message or ""):
                    return event
            return None

        return self.cluster.poll(posted, timeout=timeout, interval=0.25,
                                 what=f"Event {reason!r} about {name} (seen: "
                                      f"{[(e.reason, e.message) for e in self.events(name)]})")

    def wait_steps(
        self, name: str, steps: int, timeout: float, *, interval: float = 0.5, what: str = ""
    ) -> None:
        """Waits until program ``name`` is Running with at least ``steps`` steps completed."""

        def progressed() -> bool:
            status = self.program(name).get("status") or {}
            return status.get("phase") == "Running" and status.get("stepsCompleted", 0) >= steps

        what = what or f"{name} at step {steps}"
        self.cluster.poll(progressed, timeout=timeout, interval=interval, what=what)

    def wait_slice(self, name: str, phase: str, timeout: float, operator: OperatorProcess) -> Manifest:
        def reached() -> Manifest | None:
            found = self.get("virtualslices", name)
            status = (found or {}).get("status") or {}
            return found if status.get("phase") == phase else None

        return self._wait(reached, f"VirtualSlice {name} {phase}", timeout, operator, "virtualslices", name)

    def wait_program(self, name: str, phases: set[str], timeout: float, operator: OperatorProcess) -> Manifest:
        def reached() -> Manifest | None:
            found = self.get("pathwaysprograms", name)
            status = (found or {}).get("status") or {}
            return found if status.get("phase") in phases else None

        return self._wait(reached, f"PathwaysProgram {name} in {sorted(phases)}", timeout, operator,
                          "pathwaysprograms", name)

    def _wait(
        self, check: Any, what: str, timeout: float, operator: OperatorProcess, plural: str, name: str
    ) -> Manifest:
        try:
            result: Manifest = self.cluster.poll(check, timeout=timeout, interval=0.25, what=what)
            return result
        except AssertionError as e:
            last = self.get(plural, name)
            raise AssertionError(
                f"{e}\nlast status: {json.dumps((last or {}).get('status'), indent=1)}\n"
                f"operator log tail:\n{operator.log_tail()}"
            ) from None


def condition(obj: Manifest, type_: str) -> Manifest:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    raise AssertionError(f"no condition {type_} in {json.dumps(obj.get('status'))}")
