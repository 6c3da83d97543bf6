"""The ``cluster`` fixture: one real control plane and node agent per test session.

Start-up (about 10 s) happens once per session: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler from the binaries ``make controlplane`` builds
(see ``controlplane``), then one node agent process (see ``kubelet``) serving two
islands of two 4-device nodes each (``DEFAULT_NODES``). The tier never skips: missing
binaries or kubectl fail every test with a message saying what to install or run.

Tests get a ``Cluster``: an admin kubeconfig, a python ``ApiClient``, kubectl, the agent's
state directory (container logs), bounded polling, per-test namespaces, and
``start_agent`` for tests that need nodes of their own.
"""

from __future__ import annotations

import itertools
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client import ApiClient

from tests.cluster.controlplane import ControlPlane, MissingBinariesError, find_binaries
from tests.cluster.kubelet import NodeAgentProcess, NodeSpec, container_log_path

DEFAULT_NODES = (
    NodeSpec("a-0", "island-a", 4),
    NodeSpec("a-1", "island-a", 4),
    NodeSpec("b-0", "island-b", 4),
    NodeSpec("b-1", "island-b", 4),
)

T = TypeVar("T")


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

    # The client's models type every field Optional; tests read them freely, so the API
    # handles are typed Any here rather than asserting non-None at every step.
    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> Any:
        return client.AppsV1Api(self.api)

    @property
    def apiextensions(self) -> Any:
        return client.ApiextensionsV1Api(self.api)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    @property
    def coordination(self) -> Any:
        return client.CoordinationV1Api(self.api)

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

        return self.poll(
            in_phase, timeout=timeout, what=f"pod {namespace}/{name} in {sorted(phases)}"
        )

    def create_namespace(self, prefix: str = "t") -> str:
        """A fresh namespace, ready for pods (service account and root CA published)."""
        name = (
            f"{re.sub(r'[^a-z0-9-]+', '-', prefix.lower())[:40].strip('-')}-{secrets.token_hex(3)}"
        )
        self.control_plane.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        self.control_plane.wait_namespace_ready(name, timeout=30.0)
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


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        find_binaries()
    except MissingBinariesError as e:
        pytest.fail(str(e), pytrace=False)
    if shutil.which("kubectl") is None:
        pytest.fail(
            "the cluster test tier needs `kubectl` on PATH (any v1.3x client)", pytrace=False
        )
    run_dir = tmp_path_factory.mktemp("cluster")
    started = time.monotonic()
    with ControlPlane(run_dir / "controlplane") as control_plane:
        control_plane_seconds = time.monotonic() - started
        agent = NodeAgentProcess(
            control_plane.kubeconfig, DEFAULT_NODES, run_dir / "node-agent", delete_nodes=False
        )
        agent.start()
        nodes_seconds = time.monotonic() - started - control_plane_seconds
        try:
            api = control_plane.api_client()
            yield Cluster(
                control_plane=control_plane,
                api=api,
                agent=agent,
                run_dir=run_dir,
                startup_seconds={
                    **control_plane.startup_seconds,
                    "control-plane": control_plane_seconds,
                    "nodes-ready": nodes_seconds,
                },
            )
            api.close()  # type: ignore[no-untyped-call]
        finally:
            agent.stop()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own, deleted (without waiting) afterwards."""
    name = cluster.create_namespace(request.node.name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
