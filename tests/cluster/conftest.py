"""The cluster tier's fixtures: the cluster, a namespace, the CRDs, the operator, objects.

``cluster`` (session): start-up (about 10 s) happens once per session: etcd,
kube-apiserver, kube-controller-manager and kube-scheduler from the binaries ``make
controlplane`` builds, then one node agent process serving two islands of two 4-device
nodes each (``DEFAULT_NODES``); both come from ``pathways_devcluster``, the tool behind
``make dev-cluster``, so the tier exercises what developers run. The tier never skips: missing binaries or kubectl fail every test with a message saying what to
install or run.

``namespace``: a fresh namespace per test. ``crds`` applies ``crds/`` and waits until the
CRDs are Established. ``operator`` (module scope) runs the operator for the test module
that asks for it, so one runs at a time and modules without one (``test_cli``) see none.
``objects``: the test namespace's objects, cleaned up (and waited for) afterwards.

What the fixtures return (``Cluster``, ``OperatorProcess``, ``Objects``) lives in
``harness``; the objects tests create are built with ``builders``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest

from pathways_devcluster.binaries import MissingBinariesError, find_binaries
from pathways_devcluster.controlplane import REPO_ROOT, ControlPlane
from tests.cluster.harness import CRDS, Cluster, Objects, OperatorProcess
from pathways_devcluster.node_agent import NodeAgentProcess, NodeSpec

__all__ = ["Cluster"]  # test modules that predate ``harness`` import it from here

DEFAULT_NODES = (
    NodeSpec("a-0", "island-a", 4),
    NodeSpec("a-1", "island-a", 4),
    NodeSpec("b-0", "island-b", 4),
    NodeSpec("b-1", "island-b", 4),
)


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


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    """The project's CRDs, applied and Established (again in each module that asks)."""
    cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds"))
    cluster.kubectl(
        "wait", "--for", "condition=Established", "--timeout=30s",
        *(f"crd/{name}" for name in CRDS), timeout=40,
    )  # fmt: skip


@pytest.fixture(scope="module")
def operator_args() -> tuple[str, ...]:
    """Flags of the module's operator besides the harness's; a module overrides this fixture."""
    return ()


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, crds: None, tmp_path_factory: pytest.TempPathFactory, operator_args: tuple[str, ...]
) -> Iterator[OperatorProcess]:
    """One operator per test module that asks: never two serving the cluster at once."""
    run_dir = tmp_path_factory.mktemp("operator")
    proc = OperatorProcess(cluster.kubeconfig, run_dir, *operator_args).start()
    try:
        yield proc
    finally:
        proc.close()
        print(f"operator log: {proc.log_path}")


@pytest.fixture
def objects(cluster: Cluster, operator: OperatorProcess, namespace: str) -> Iterator[Objects]:
    """The test namespace's objects; everything in it is deleted (and waited for) afterwards."""
    found = Objects(cluster, namespace)
    yield found
    found.cleanup()
