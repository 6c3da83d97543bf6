"""The node agent as a child process of the dev cluster or a test session: ``NodeAgentProcess``.

The agent is a stand-in for the kubelet, not a kubelet; it runs as its own
process (``python -m pathways_devcluster.node_agent``), as a kubelet runs beside the control
plane, so that killing or restarting it is a real fault. ``NodeAgentProcess`` starts it
with ``AgentOptions``, waits until its Nodes are Ready and schedulable (failing with the
tail of the agent's log if it exits or times out), reads back the pod subnet it claimed,
and on ``stop`` ends it and, by default, deletes its Nodes so that nothing is scheduled
onto a Node that no agent serves. ``kill`` is a machine dying instead: what the cluster
tier's node-failure test does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pathways_devcluster import processes
from pathways_devcluster.node_agent.agent import AgentOptions
from pathways_devcluster.node_agent.api import KubeApi
from pathways_devcluster.node_agent.containers import REPO_ROOT
from pathways_devcluster.node_agent.node_registrar import HEARTBEAT_SECONDS, NodeSpec, node_is_ready
from pathways_devcluster.node_agent.pod_volumes import shm_root

MODULE = "pathways_devcluster.node_agent"


class NodeAgentProcess:
    """Runs ``python -m pathways_devcluster.node_agent`` as a child process.

    ``with NodeAgentProcess(kubeconfig, [NodeSpec("c-0", "island-c", 4)], state_dir) as agent:``
    starts it and waits until its Nodes are Ready; leaving the block stops it and, with
    ``delete_nodes=True`` (the default), deletes its Nodes.
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
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.options = AgentOptions(
            kubeconfig, tuple(nodes), state_dir, pod_subnet, heartbeat_seconds
        )
        self.env = dict(env or {})
        self.log_file = log_file or state_dir / "node-agent.log"
        self.delete_nodes = delete_nodes
        self.pod_subnet = pod_subnet
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.options.kubeconfig

    @property
    def nodes(self) -> list[NodeSpec]:
        return list(self.options.nodes)

    @property
    def state_dir(self) -> Path:
        return self.options.state_dir

    def start(self, ready_timeout: float = 60.0) -> NodeAgentProcess:
        argv = [sys.executable, "-m", MODULE, *self.options.argv()]
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
                    f"node agent exited with {self.popen.returncode}:\n"
                    f"{processes.log_tail(self.log_file)}"
                )
            for name in sorted(waiting):
                try:
                    node = api.call(api.core.read_node, name)
                except Exception:  # noqa: BLE001 - not registered yet
                    continue
                if node_is_ready(node):
                    waiting.discard(name)
            if not waiting:
                return time.monotonic() - start
            if not processes.wait_until(deadline, 0.2):
                raise RuntimeError(
                    f"nodes {sorted(waiting)} not Ready within {timeout:.0f} s; agent log:\n"
                    f"{processes.log_tail(self.log_file)}"
                )

    def kill(self) -> None:
        """The machine dies: the agent is SIGKILLed and its containers with it.

        Its Nodes and pods stay in the API as they were and nobody renews the Nodes'
        Leases or status: what the control plane makes of that is node lifecycle's to say.
        """
        if self.popen is not None:
            processes.signal_group(self.popen, signal.SIGKILL)
            self.popen.wait(10.0)

    def stop(self, grace_seconds: float = 20.0) -> None:
        if self.popen is not None:
            processes.stop(self.popen, grace_seconds)
            self.popen = None
        if self.pod_subnet != "auto":  # what a killed agent's memory volumes left
            shutil.rmtree(shm_root(self.pod_subnet), ignore_errors=True)
        if self.delete_nodes:
            api = KubeApi(self.kubeconfig)
            for node in self.nodes:
                try:
                    api.call(api.core.delete_node, node.name)
                except Exception:  # noqa: BLE001 - already gone or the API is down
                    pass

    def __enter__(self) -> NodeAgentProcess:
        return self if self.popen is not None else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
