"""The dev cluster: the control plane, a node agent of two islands, and the operator's chart.

``DevCluster`` is what ``python -m pathways_devcluster serve`` runs in the foreground:

1. the control plane (``controlplane``) in ``<state>/controlplane``, with node lifecycle
   on, its admin kubeconfig at ``<state>/controlplane/admin.kubeconfig``;
2. one node agent (``node_agent``, not a kubelet) serving ``DEV_NODES``: islands
   ``island-a`` and ``island-b`` of two 4-device Nodes each;
3. ``helm install`` of ``helm/kube-pathways`` into namespace ``pathways-system``, waited
   on (``--wait``): the scheduler binds the chart's Deployment pod to one of the Nodes,
   and the node agent runs it, so the chart's command, args, env, probes,
   ServiceAccount token and RBAC are what the operator runs with. The chart's image is
   this checkout's Python environment (a container's ``python`` is the agent's
   interpreter). Its ports are fixed numbers in the chart, and pods here share the
   machine's loopback, so the controller, calls, liveness and metrics ports are reserved
   ones (``ports``) instead of 8470, 8471, 8080 and 9090.

``stop`` undoes it in reverse: programs and slices are deleted and their pods waited for
(so worker hosts end as they would in a cluster, and clean up after themselves), the
release is uninstalled (the operator pod gets its grace period), then the agent and the
control plane stop. Every step is bounded in time; a step that fails is logged and the
next one runs.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pathways_wire.kube_names import GROUP, PROGRAM_PLURAL, SLICE_LABEL, SLICE_PLURAL, VERSION

from pathways_devcluster import processes
from pathways_devcluster.binaries import REPO_ROOT, find_helm
from pathways_devcluster.components import ControlPlaneError
from pathways_devcluster.controlplane import ControlPlane
from pathways_devcluster.node_agent import NodeAgentProcess, NodeSpec
from pathways_devcluster.node_agent.pod_volumes import detect_mount_mode
from pathways_devcluster.ports import ReservedPort, reserve_port

log = logging.getLogger(__name__)

DEV_NODES = (
    NodeSpec("a-0", "island-a", 4),
    NodeSpec("a-1", "island-a", 4),
    NodeSpec("b-0", "island-b", 4),
    NodeSpec("b-1", "island-b", 4),
)
CHART = REPO_ROOT / "helm" / "kube-pathways"
RELEASE = "kube-pathways"
NAMESPACE = "pathways-system"
INSTALL_TIMEOUT_S = 300
DRAIN_TIMEOUT_S = 90.0


class DevCluster:
    """Starts and stops the dev cluster's pieces, all children of this process."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.control_plane = ControlPlane(state_dir / "controlplane")
        self.agent: NodeAgentProcess | None = None
        self._ports: list[ReservedPort] = []
        self._installed = False

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    def pids(self) -> dict[str, int]:
        """The PIDs of the control plane's components and of the node agent."""
        found = self.control_plane.pids()
        if self.agent is not None and self.agent.popen is not None:
            found["node-agent"] = self.agent.popen.pid
        return found

    def start(self) -> None:
        """Control plane, node agent, chart; raises ``ControlPlaneError`` saying what failed."""
        if detect_mount_mode(self.state_dir / "mount-probe") != "namespace":
            raise ControlPlaneError(
                "the dev cluster needs private mount namespaces (`unshare --mount`, which needs root or "
                "CAP_SYS_ADMIN), and KPW_NODE_AGENT_MOUNTS unset or =namespace: "
                "the operator's pod reads its ServiceAccount token at "
                "/var/run/secrets/kubernetes.io/serviceaccount, which the node agent can only "
                "provide by bind-mounting it there"
            )
        self.control_plane.start()
        self.agent = NodeAgentProcess(
            self.kubeconfig, DEV_NODES, self.state_dir / "node-agent", delete_nodes=False
        )
        self.agent.start()
        self._install()

    def stop(self) -> None:
        """Workloads, release, node agent, control plane: each bounded, each attempted."""
        if self._installed:
            self._drain()
            self._helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "90s",
                       check=False)
            self._installed = False
        if self.agent is not None:
            self.agent.stop()
            self.agent = None
        self.control_plane.stop()
        for reservation in self._ports:
            reservation.release()
        self._ports.clear()

    # -- the chart ------------------------------------------------------------------------

    def _install(self) -> None:
        controller, calls, liveness, metrics = (self._reserve() for _ in range(4))
        state_env = [
            {"name": "PATHWAYS_OPERATOR_STATE_DIR", "value": "/tmp/pathways-operator"},
            # Driver pods dial the controller; this cluster has no DNS for the chart's Service,
            # and every pod shares the machine's loopback.
            {"name": "PATHWAYS_CONTROLLER_ADDRESS", "value": f"127.0.0.1:{controller}"},
            # No PersistentVolumeClaims here: a program's checkpoint volume is a host directory.
            {"name": "PATHWAYS_DRIVER_CHECKPOINT_VOLUMES", "value": "host-path"},
        ]
        self._installed = True
        self._helm(
            "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
            "--set", f"operator.controllerPort={controller}",
            "--set", f"operator.callsPort={calls}",
            "--set", f"operator.livenessPort={liveness}",
            "--set", f"metrics.port={metrics}",
            # the chart's emptyDir on /tmp holds it; said explicitly so that an agent that
            # rewrites paths instead of mounting (no mount namespaces) rewrites this one too
            "--set-json", f"operator.extraEnv={json.dumps(state_env)}",
            "--wait", "--timeout", f"{INSTALL_TIMEOUT_S}s",
            timeout=INSTALL_TIMEOUT_S + 30, explain=self._release_pods,
        )  # fmt: skip

    def _helm(
        self,
        *args: str,
        check: bool = True,
        timeout: float = 120.0,
        explain: Callable[[], str] | None = None,
    ) -> None:
        """Runs helm; on failure ``explain`` adds what the cluster shows (the release's pods)."""
        helm_home = self.state_dir / "helm"
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(helm_home / "cache"),
            "HELM_CONFIG_HOME": str(helm_home / "config"),
            "HELM_DATA_HOME": str(helm_home / "data"),
        }
        try:
            result = subprocess.run(
                [str(find_helm()), *args], capture_output=True, text=True, timeout=timeout,
                env=env, cwd=REPO_ROOT, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            result = subprocess.CompletedProcess(args, 124, "", f"timed out after {timeout:.0f} s")
        if result.returncode != 0:
            why = f"helm {args[0]} {RELEASE} exited {result.returncode}:\n{result.stderr}{result.stdout}"
            if explain is not None:
                why += explain()
            if check:
                raise ControlPlaneError(f"{why}\nnode agent log: {self._agent_log()}")
            log.warning("%s", why)

    def _release_pods(self) -> str:
        try:
            listed = self.control_plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
        except (ControlPlaneError, OSError) as e:
            return f"\n(the pods in {NAMESPACE} could not be listed: {e})"
        return "".join(f"\n{line}" for line in pod_states(listed.get("items") or []))

    def _agent_log(self) -> Path | None:
        return self.agent.log_file if self.agent is not None else None

    def _reserve(self) -> int:
        reservation = reserve_port()
        self._ports.append(reservation)
        return reservation.port

    # -- draining -------------------------------------------------------------------------

    def _drain(self) -> None:
        """Deletes every PathwaysProgram and VirtualSlice and waits for their pods to go."""
        cp = self.control_plane
        try:
            for plural in (PROGRAM_PLURAL, SLICE_PLURAL):
                for item in cp.request("GET", f"/apis/{GROUP}/{VERSION}/{plural}")["items"]:
                    meta = item["metadata"]
                    cp.request(
                        "DELETE",
                        f"/apis/{GROUP}/{VERSION}/namespaces/{meta['namespace']}/{plural}/{meta['name']}",
                    )
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while self._slice_pods():
                if not processes.wait_until(deadline, 0.5):
                    log.warning("worker pods still there after %.0f s: %s", DRAIN_TIMEOUT_S,
                                self._slice_pods())
                    return
        except (ControlPlaneError, OSError, KeyError) as e:
            log.warning("draining the dev cluster: %s", e)

    def _slice_pods(self) -> list[str]:
        listed: Any = self.control_plane.request("GET", f"/api/v1/pods?labelSelector={SLICE_LABEL}")
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in listed["items"]]


def pod_states(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per container of ``pods``: its state, and its last run's end when it ran before.

    What a failed ``helm install --wait`` leaves out: why the operator never became ready
    (``StartError`` and its message, a ``CrashLoopBackOff``, an ``Error`` exit code).
    """
    lines = []
    for pod in pods:
        status = pod.get("status") or {}
        name = f"pod {pod['metadata']['name']} ({status.get('phase', 'no phase')})"
        statuses = [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]
        if not statuses:
            lines.append(f"{name}: no container started yet")
        for c in statuses:
            line = f"{name} container {c['name']}: {_state(c.get('state') or {})}"
            last = (c.get("lastState") or {}).get("terminated")
            if last:
                line += f"; last run {_state({'terminated': last})}"
            lines.append(line)
    return lines


def _state(state: Mapping[str, Any]) -> str:
    for kind in ("waiting", "running", "terminated"):
        if kind in state:
            detail = state[kind] or {}
            words = [kind, str(detail.get("reason") or "")]
            if "exitCode" in detail:
                words.append(f"exit code {detail['exitCode']}")
            if detail.get("message"):
                words.append(f"({str(detail['message']).strip()})")
            return " ".join(w for w in words if w)
    return "unknown"
