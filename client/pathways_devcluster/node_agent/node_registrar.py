"""The node agent's Nodes: registered, kept Ready, their Leases renewed.

The agent is a stand-in for the kubelet, not a kubelet, but a Node must look to the
scheduler and the controllers exactly as a kubelet would keep it. Each ``NodeSpec``
(``--node NAME:ISLAND:DEVICES``) is registered with the labels ``pathways.dev/island``
and ``kubernetes.io/hostname``; its status carries capacity and allocatable ``cpu``,
``memory``, ``pods`` and the extended resource ``pathways.dev/device``, the Ready
condition, InternalIP 127.0.0.1 and the port of its container logs (``daemonEndpoints``,
`container_logs`); the ``node.kubernetes.io/not-ready`` taint that
admission puts on a new Node is removed; and a Lease in ``kube-node-lease`` is renewed
with every heartbeat (``HEARTBEAT_SECONDS``). With node lifecycle on, a Node the agent stops
serving (the agent killed, as a machine dies) goes NotReady once the controller-manager's
grace period passes, and its pods are evicted. A Node deleted behind the agent's back is registered again at the
next heartbeat; while the API server is away the registrar retries with a bounded
back-off.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pathways_devcluster.node_agent.api import ApiError, KubeApi, now, now_micro

log = logging.getLogger(__name__)

ISLAND_LABEL = "pathways.dev/island"
DEVICE_RESOURCE = "pathways.dev/device"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
HOST_IP = "127.0.0.1"
KUBELET_VERSION = "v1.34.4"
HEARTBEAT_SECONDS = 5.0
"""Between two status and Lease renewals: a quarter of the control plane's 20 s grace
period, as the kubelet's 10 s is a quarter of a default cluster's 40 s Lease."""


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


def node_is_ready(node: dict[str, Any]) -> bool:
    """Ready, and without the not-ready taint: the scheduler will place pods on it."""
    ready = any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node.get("status", {}).get("conditions") or []
    )
    tainted = any(
        t.get("key") == NOT_READY_TAINT for t in node.get("spec", {}).get("taints") or []
    )
    return ready and not tainted


class NodeRegistrar:
    """Registers the agent's Nodes, keeps them Ready, and renews their Leases."""

    def __init__(
        self, api: KubeApi, nodes: Sequence[NodeSpec], heartbeat_seconds: float, kubelet_port: int | None = None
    ) -> None:
        self.api = api
        self.nodes = list(nodes)
        self.heartbeat_seconds = heartbeat_seconds
        self.kubelet_port = kubelet_port
        """Where the API server asks for this agent's container logs (``container_logs``)."""
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
        stamp = now()
        since = self._since.setdefault(node.name, stamp)
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
                "message": "posted by the kube-pathways node agent",
                "lastHeartbeatTime": stamp,
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
        if self.kubelet_port is not None:
            status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": self.kubelet_port}}
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
                "renewTime": now_micro(),
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
