"""One pod, from binding to deletion, as the node agent runs it.

The agent is a stand-in for the kubelet, not a kubelet; a ``PodWorker`` thread does
for one pod what the kubelet's pod worker does. In order: it writes a first status, materializes
the pod's volumes (retrying while a Secret or ConfigMap is missing, with the kubelet's
``MountVolume.SetUp failed`` message), runs the init containers one after another
(restartable ones, native sidecars, keep running beside the rest), then starts the
containers and watches them until all have finished for good, when the phase becomes
``Succeeded`` or ``Failed``. Every change is written to the pod's status subresource (see
``pod_status``); a write that fails is retried on the next tick.

Three things stop it. A ``deletionTimestamp`` (``observe``): every process group gets
SIGTERM, then SIGKILL after the grace period (capped at ``MAX_GRACE_SECONDS``), the final
status is written and the pod deleted with grace 0, the kubelet's last word. The pod
object disappearing (``vanish``): everything is killed within 2 s and nothing written.
The agent stopping (``shutdown``): the same, leaving the API object as it is. In every
case the pod's volumes are removed (``/dev/shm`` ones included), so a stopped agent
leaves no files behind.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from pathways_devcluster import processes
from pathways_devcluster.node_agent.api import ApiError
from pathways_devcluster.node_agent.containers import Container, ContainerRunner, PodSandbox
from pathways_devcluster.node_agent.node_registrar import HOST_IP
from pathways_devcluster.node_agent.pod_env import ContainerConfigError, Pod, PodNetwork
from pathways_devcluster.node_agent.pod_status import PodState, PodStatusBuilder
from pathways_devcluster.node_agent.pod_volumes import PodVolumes

if TYPE_CHECKING:
    from pathways_devcluster.node_agent.agent import NodeAgent

log = logging.getLogger(__name__)

MAX_GRACE_SECONDS = 30.0
TICK_SECONDS = 0.1
LOST_POD_GRACE_SECONDS = 2.0
"""Grace for a pod that vanished or whose agent is stopping: nobody waits for it."""


class PodWorker(threading.Thread):
    """Runs one pod from binding to deletion, and writes its status."""

    def __init__(self, agent: NodeAgent, pod: Pod, ip: str) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.agent = agent
        self.pod: Pod = pod
        self.uid = str(meta["uid"])
        self.node = str(spec["nodeName"])
        self.ip = ip
        net = PodNetwork(ip, HOST_IP, agent.apiserver_host, agent.apiserver_port)
        self.sandbox = PodSandbox(
            uid=self.uid,
            namespace=str(meta["namespace"]),
            name=str(meta["name"]),
            net=net,
            volumes=PodVolumes(pod, agent.state_dir / "volumes", agent.api, net, agent.shm_root),
            source=agent.api,
            mount_mode=agent.mount_mode,
            mount_points=agent.mount_points,
            state_dir=agent.state_dir,
            restart_policy=str(spec.get("restartPolicy", "Always")),
        )
        self.runner = ContainerRunner(self.sandbox, self.current_pod, lambda: self.stopping)
        self.init_containers = [Container(c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [Container(c) for c in spec.get("containers") or []]
        self.state = PodState()
        self._status = PodStatusBuilder(self.uid, ip, HOST_IP)
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

    def current_pod(self) -> Pod:
        with self._lock:
            return self.pod

    # -- lifecycle --------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._publish()
            if self._materialize() and self._run_init_containers():
                self.state.initialized = True
                self._run_containers()
            while not self.stopping:
                self._sleep(1.0)
                self._publish()
        except Exception:  # noqa: BLE001 - the pod must still be torn down
            log.exception("pod %s: worker failed", self.sandbox)
        finally:
            self._teardown()

    def _sleep(self, seconds: float = TICK_SECONDS) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _materialize(self) -> bool:
        while not self.stopping:
            try:
                self.sandbox.volumes.materialize()
                return True
            except ContainerConfigError as e:
                for c in self.init_containers + self.containers:
                    c.waiting = ("ContainerCreating", f"MountVolume.SetUp failed: {e}")
                self._publish()
                self._sleep(1.0)
        return False

    def _run_init_containers(self) -> bool:
        """Runs init containers in order; sidecars (restartPolicy Always) keep running."""
        sidecars: list[Container] = []
        for c in self.init_containers:
            self.runner.start(c)
            if c.sidecar:
                sidecars.append(c)
                continue
            while not self.stopping:
                self.runner.tick([c, *sidecars])
                if c.done:
                    if c.succeeded:
                        break
                    self._finish("Failed", None, f"init container {c.name} failed")
                    return False
                self._publish()
                self._sleep()
        return not self.stopping

    def _run_containers(self) -> None:
        for c in self.containers:
            self.runner.start(c)
        sidecars = [s for s in self.init_containers if s.sidecar]
        while not self.stopping:
            self.runner.tick(self.containers + sidecars)
            if all(c.done for c in self.containers):
                failed = any(not c.succeeded for c in self.containers)
                for s in sidecars:
                    self.runner.kill(s, "sidecar stopped after the main containers")
                self._finish("Failed" if failed else "Succeeded", None, None)
                return
            if self.state.phase == "Pending" and all(c.runs > 0 for c in self.containers):
                self.state.phase = "Running"
            self._publish()
            self._sleep()

    def _finish(self, phase: str, reason: str | None, message: str | None) -> None:
        self.state.phase, self.state.reason, self.state.message = phase, reason, message
        for c in self.containers + self.init_containers:
            c.ready = False
        self._publish()

    # -- status -----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        observed = self.current_pod().get("status") or {}
        return self._status.build(self.state, self.containers, self.init_containers, observed)

    def _publish(self) -> None:
        """Patches the pod status when it changed (or the last write failed)."""
        if self._vanished:
            return
        status = self.status()
        if status == self._published:
            return
        body = {"metadata": {"uid": self.uid}, "status": status}
        box = self.sandbox
        try:
            self.agent.api.call(
                self.agent.api.core.patch_namespaced_pod_status, box.name, box.namespace, body,
                _content_type="application/strategic-merge-patch+json",
            )  # fmt: skip
            self._published = status
        except ApiError as e:
            if e.status in (404, 409):
                log.info("pod %s: gone (%s)", box, e)
                self._vanished = True
            else:
                log.warning("pod %s: status not written: %s", box, e)
        except Exception as e:  # noqa: BLE001 - API server down: retried next tick
            log.warning("pod %s: status not written: %s", box, e)

    # -- teardown ---------------------------------------------------------------------

    def _grace_seconds(self) -> float:
        pod = self.current_pod()
        meta = pod["metadata"]
        grace = float(
            meta.get("deletionGracePeriodSeconds")
            if meta.get("deletionGracePeriodSeconds") is not None
            else pod["spec"].get("terminationGracePeriodSeconds", 30)
        )
        if self._vanished or self._shutdown:
            grace = min(grace, LOST_POD_GRACE_SECONDS)
        return min(grace, MAX_GRACE_SECONDS)

    def _kill_all(self, everything: list[Container]) -> None:
        """SIGTERM every process group, SIGKILL what is left after the grace period."""
        for c in everything:
            if c.popen is not None:
                processes.signal_group(c.popen, signal.SIGTERM)
        deadline = time.monotonic() + self._grace_seconds()
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
                self.runner.reap(c, code if code is not None else -signal.SIGKILL)
                c.next_start = None

    def _teardown(self) -> None:
        everything = self.containers + self.init_containers
        self._kill_all(everything)
        if self._delete_requested and not self._vanished and not self._shutdown:
            if not self.state.terminal:
                ok = all(c.succeeded for c in self.containers)
                self.state.phase = "Succeeded" if ok else "Failed"
            for c in everything:
                c.ready = False
            self._publish()
            self._final_delete()
        self.sandbox.volumes.cleanup()
        self.agent.forget(self)

    def _final_delete(self) -> None:
        box = self.sandbox
        try:
            self.agent.api.call(
                self.agent.api.core.delete_namespaced_pod, box.name, box.namespace,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
                grace_period_seconds=0,
            )  # fmt: skip
        except ApiError as e:
            if e.status not in (404, 409):
                log.warning("pod %s: final delete failed: %s", box, e)
        except Exception as e:  # noqa: BLE001 - re-listing will retry the deletion
            log.warning("pod %s: final delete failed: %s", box, e)
