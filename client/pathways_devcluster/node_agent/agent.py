"""The node agent itself: its options, and the table of the pods it runs.

The agent is a stand-in for the kubelet, not a kubelet. ``NodeAgent`` ties the
pieces together: a ``NodeRegistrar`` thread keeps its Nodes registered and Ready, one
``PodWatch`` thread per Node reports the pods bound there, and each new pod gets a
loopback IP from the agent's /24 (``ip_pool``) and a ``PodWorker`` thread that runs it to
the end. The table makes sure a pod is started at most once: a pod already finished, or
deleted before it ever ran, is only given its final delete (``_finalize_unstarted``),
and a pod missing from a re-list is told it has vanished.

``AgentOptions`` is the agent's command line, parsed (``python -m pathways_devcluster.node_agent``)
and written back (``NodeAgentProcess``) in one place.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from pathways_devcluster.node_agent.container_logs import ContainerLogs
from pathways_devcluster.node_agent.api import KubeApi
from pathways_devcluster.node_agent.ip_pool import IpAllocator, claim_subnet
from pathways_devcluster.node_agent.node_registrar import HEARTBEAT_SECONDS, NodeRegistrar, NodeSpec
from pathways_devcluster.node_agent.pod_env import Pod
from pathways_devcluster.node_agent.pod_volumes import (
    MountMode,
    MountPoints,
    detect_mount_mode,
    shm_root,
)
from pathways_devcluster.node_agent.pod_watch import PodWatch
from pathways_devcluster.node_agent.pod_worker import PodWorker

log = logging.getLogger(__name__)

PROG = "python -m pathways_devcluster.node_agent"


@dataclass(frozen=True)
class AgentOptions:
    """What one agent serves: its Nodes, where it keeps state, which pod subnet."""

    kubeconfig: Path
    nodes: tuple[NodeSpec, ...]
    state_dir: Path
    pod_subnet: str = "auto"
    heartbeat_seconds: float = HEARTBEAT_SECONDS

    @classmethod
    def parse(cls, argv: Sequence[str] | None = None, description: str = "") -> AgentOptions:
        parser = argparse.ArgumentParser(prog=PROG, description=description)
        parser.add_argument("--kubeconfig", type=Path, required=True)
        parser.add_argument(
            "--node",
            action="append",
            type=_node_spec,
            required=True,
            metavar="NAME:ISLAND:DEVICES",
        )
        parser.add_argument("--state-dir", type=Path, required=True)
        parser.add_argument(
            "--pod-subnet",
            default="auto",
            help="pod IPs are <subnet>.10 .. <subnet>.254; auto: first free 127.0.K",
        )
        parser.add_argument("--heartbeat-seconds", type=float, default=HEARTBEAT_SECONDS)
        args = parser.parse_args(argv)
        return cls(
            args.kubeconfig, tuple(args.node), args.state_dir, args.pod_subnet,
            args.heartbeat_seconds,
        )  # fmt: skip

    def argv(self) -> list[str]:
        """The command-line arguments that ``parse`` reads back into these options."""
        argv = [
            "--kubeconfig", str(self.kubeconfig), "--state-dir", str(self.state_dir),
            "--pod-subnet", self.pod_subnet, "--heartbeat-seconds", str(self.heartbeat_seconds),
        ]  # fmt: skip
        for node in self.nodes:
            argv += ["--node", str(node)]
        return argv


def _node_spec(text: str) -> NodeSpec:
    try:
        return NodeSpec.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class NodeAgent:
    """Watches pods bound to its nodes and runs them (one ``PodWorker`` each)."""

    def __init__(self, options: AgentOptions) -> None:
        self.api = KubeApi(options.kubeconfig)
        server = urlparse(self.api.host)
        self.apiserver_host = server.hostname or "127.0.0.1"
        self.apiserver_port = server.port or 443
        self.nodes = list(options.nodes)
        self.state_dir = state_dir = options.state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.mount_mode: MountMode = detect_mount_mode(state_dir / "tmp")
        self.mount_points = MountPoints()
        self.pod_subnet, self._subnet_lock = claim_subnet(options.pod_subnet)
        (state_dir / "pod-subnet").write_text(self.pod_subnet)
        self.shm_root = shm_root(self.pod_subnet)
        shutil.rmtree(self.shm_root, ignore_errors=True)  # a killed agent's, of this subnet
        self.ips = IpAllocator(self.pod_subnet)
        self.stop_event = threading.Event()
        if not self.api.ca_file:
            raise ValueError(f"{options.kubeconfig}: its cluster has no certificate authority, which the "
                             "agent needs to tell the API server's requests for container logs")
        self.logs = ContainerLogs(state_dir, self.api.ca_file, self.stop_event)
        self.registrar = NodeRegistrar(self.api, self.nodes, options.heartbeat_seconds, kubelet_port=self.logs.port)
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
            pods = PodWatch(self.api, node.name, self, self.stop_event)
            self._threads.append(
                threading.Thread(target=pods.run, name=f"watch-{node.name}", daemon=True)
            )
        self.logs.start()
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Kills every container (bounded), leaves API objects alone."""
        self.stop_event.set()
        self.logs.close()
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.shutdown()
        deadline = time.monotonic() + timeout
        for w in workers:
            w.join(max(0.0, deadline - time.monotonic()))
        self.mount_points.remove_created()
        shutil.rmtree(self.shm_root, ignore_errors=True)

    def forget(self, worker: PodWorker) -> None:
        with self._lock:
            if self._workers.get(worker.uid) is worker:
                del self._workers[worker.uid]
            self._done.add(worker.uid)
        self.ips.release(worker.ip)

    # -- PodEvents, from the watches ----------------------------------------------------

    def sync(self, node: str, pods: Sequence[Pod]) -> None:
        present = {p["metadata"]["uid"] for p in pods}
        with self._lock:
            lost = [w for w in self._workers.values() if w.node == node and w.uid not in present]
        for w in lost:
            w.vanish()
        for pod in pods:
            self.handle(pod)

    def handle(self, pod: Pod) -> None:
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

    def handle_deleted(self, pod: Pod) -> None:
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
