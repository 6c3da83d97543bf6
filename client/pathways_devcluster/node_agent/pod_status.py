"""A pod's ``status`` as the node agent reports it, shaped as a kubelet shapes it.

The agent is a stand-in for the kubelet, not a kubelet, yet the operator and
kubectl read what it writes exactly as they would read a kubelet's: the phase, host and
pod IPs, ``startTime``, the conditions ``PodReadyToStartContainers``, ``Initialized``,
``ContainersReady`` and ``Ready`` (plus ``PodScheduled`` when the scheduler has not
written it) with their reasons and messages, and one entry per container and init
container. A condition's ``lastTransitionTime`` moves only when its status changes, so
``PodStatusBuilder`` remembers each condition between writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pathways_devcluster.node_agent.api import now
from pathways_devcluster.node_agent.containers import Container

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass
class PodState:
    """What the pod worker decided so far: phase, and why when it ended."""

    phase: str = "Pending"
    initialized: bool = False
    reason: str | None = None
    message: str | None = None

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


class PodStatusBuilder:
    """Builds one pod's status, keeping each condition's last transition time."""

    def __init__(self, uid: str, pod_ip: str, host_ip: str) -> None:
        self.uid = uid
        self.pod_ip = pod_ip
        self.host_ip = host_ip
        self.start_time = now()
        self._conditions: dict[str, tuple[str, str, str | None, str | None]] = {}

    def condition(
        self, kind: str, status: bool, reason: str | None = None, message: str | None = None
    ) -> dict[str, Any]:
        value = "True" if status else "False"
        previous = self._conditions.get(kind)
        since = now() if previous is None or previous[0] != value else previous[1]
        self._conditions[kind] = (value, since, reason, message)
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

    def build(
        self,
        state: PodState,
        containers: Sequence[Container],
        init_containers: Sequence[Container],
        observed: Mapping[str, Any],
    ) -> dict[str, Any]:
        """The status to write; ``observed`` is the pod's status as last read from the API."""
        terminal = state.terminal
        regular = [*containers, *(c for c in init_containers if c.sidecar)]
        unready = [c.name for c in regular if not c.ready]
        if terminal:
            ready_reason, ready_message = "PodCompleted", None
        elif unready:
            ready_reason = "ContainersNotReady"
            ready_message = f"containers with unready status: [{' '.join(unready)}]"
        else:
            ready_reason, ready_message = None, None
        pending = [c.name for c in init_containers if not c.sidecar and not c.succeeded]
        initialized = state.initialized or not pending
        incomplete = f"containers with incomplete status: [{' '.join(pending)}]"
        conditions = [
            self.condition("PodReadyToStartContainers", not terminal),
            self.condition(
                "Initialized",
                initialized,
                None if initialized else "ContainersNotInitialized",
                None if initialized else incomplete,
            ),
            self.condition(
                "ContainersReady", not terminal and not unready, ready_reason, ready_message
            ),
            self.condition("Ready", not terminal and not unready, ready_reason, ready_message),
        ]
        if not any(c.get("type") == "PodScheduled" for c in observed.get("conditions") or []):
            conditions.insert(0, self.condition("PodScheduled", True))
        status: dict[str, Any] = {
            "phase": state.phase,
            "hostIP": self.host_ip,
            "hostIPs": [{"ip": self.host_ip}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "conditions": conditions,
            "containerStatuses": [c.status(self.uid) for c in containers],
        }
        if init_containers:
            status["initContainerStatuses"] = [c.status(self.uid) for c in init_containers]
        if state.reason:
            status["reason"] = state.reason
        if state.message:
            status["message"] = state.message
        return status
