"""Container probes as the node agent runs them, with the kubelet's thresholds.

The agent is a stand-in for the kubelet, not a kubelet, but readiness, liveness and
startup probes decide what the operator sees (a host pod is Ready, or restarted), so they
follow the kubelet's rules: ``initialDelaySeconds`` before the first run, one run every
``periodSeconds``, ``successThreshold`` successes in a row to pass and
``failureThreshold`` failures in a row to fail, each run bounded by ``timeoutSeconds``.

``Probe`` counts outcomes; ``check_network`` runs a ``tcpSocket`` or ``httpGet`` probe
(``grpc`` is checked as a TCP connect) against the pod's IP. ``exec`` probes need the
container's environment and mounts, so the container runner runs those itself.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

ProbeKind = Literal["readiness", "liveness", "startup"]
PROBE_KINDS: tuple[ProbeKind, ...] = ("readiness", "liveness", "startup")
PROBE_ORDER: tuple[ProbeKind, ...] = ("startup", "liveness", "readiness")
"""The order the kubelet evaluates them in: liveness and readiness wait for startup."""


@dataclass
class Probe:
    """One probe of one container: when it runs next, and its verdict so far."""

    spec: Mapping[str, Any]
    kind: ProbeKind
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


def container_probes(container: Mapping[str, Any], started: float) -> dict[ProbeKind, Probe]:
    """The probes a container spec declares, their clocks started at ``started``."""
    return {
        kind: Probe(container[f"{kind}Probe"], kind, started)
        for kind in PROBE_KINDS
        if container.get(f"{kind}Probe")
    }


def container_port(container: Mapping[str, Any], port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"container {container.get('name')} has no port named {port!r}")


def check_network(probe: Probe, container: Mapping[str, Any], pod_ip: str) -> bool:
    """Runs a ``tcpSocket``, ``grpc`` (as TCP) or ``httpGet`` probe once; False on any error."""
    spec = probe.spec
    try:
        if "tcpSocket" in spec or "grpc" in spec:
            target = spec.get("tcpSocket") or spec["grpc"]
            address = (target.get("host") or pod_ip, container_port(container, target["port"]))
            with socket.create_connection(address, probe.timeout):
                return True
        if "httpGet" in spec:
            get = spec["httpGet"]
            scheme = str(get.get("scheme", "HTTP")).lower()
            host = get.get("host") or pod_ip
            port = container_port(container, get["port"])
            url = f"{scheme}://{host}:{port}{get.get('path', '/')}"
            headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
            req = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(req, timeout=probe.timeout) as resp:
                return 200 <= int(resp.status) < 400
    except (OSError, urllib.error.URLError, ValueError):
        return False
    return False
