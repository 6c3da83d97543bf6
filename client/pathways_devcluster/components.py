"""One process of the test control plane: started, waited on until healthy, stopped.

``Component`` is what ``ControlPlane`` knows of etcd, kube-apiserver,
kube-controller-manager and kube-scheduler: the command line, the log, and the health
endpoint that says it is serving. ``wait_healthy`` polls that endpoint with a bounded
timeout and fails with the tail of the log if the process exits or never answers, so a
broken start says why instead of hanging.

A server that binds port 0 tells its port in its log; ``Component.reports_port`` is the
pattern that finds it there (etcd: ``"serving client traffic insecurely"`` with the
listener's ``address``). Until it has read the port, the health URL (``{port}`` in it)
is not polled; once it has, ``port`` holds it (``ControlPlane.restart`` then starts the
process on that port again, so that clients configured with it keep working).
"""

from __future__ import annotations

import re
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pathways_devcluster import processes


class ControlPlaneError(RuntimeError):
    """The control plane could not be started or used."""


@dataclass
class Component:
    """One control-plane process: how to start it and how to tell it is healthy."""

    name: str
    argv: list[str]
    log: Path
    health_url: str
    health_token: str | None = None
    verify_ca: Path | None = None
    stop_grace_seconds: float = 10.0
    reports_port: re.Pattern[str] | None = None
    """Where the log says the port bound for ``:0`` in ``argv`` (group 1: the port)."""
    port: int | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log_offset: int = field(default=0, repr=False)

    def start(self) -> None:
        self._log_offset = self.log.stat().st_size if self.log.exists() else 0
        self.popen = processes.spawn(self.argv, log=self.log, append_log=True)

    def stop(self) -> None:
        if self.popen is not None:
            processes.stop(self.popen, self.stop_grace_seconds)
            self.popen = None

    def failure(self, why: str) -> ControlPlaneError:
        return ControlPlaneError(
            f"{self.name} {why}; log {self.log} ends with:\n{processes.log_tail(self.log)}"
        )

    @property
    def url(self) -> str:
        """The health URL, with the reported port filled in."""
        return self.health_url.format(port=self.port)

    def _read_port(self) -> int | None:
        """The port this run of the process reported in its log, if it has yet."""
        assert self.reports_port is not None
        with open(self.log, "rb") as f:
            f.seek(self._log_offset)
            found = self.reports_port.search(f.read().decode("utf-8", "replace"))
        return int(found.group(1)) if found else None

    def wait_healthy(self, timeout: float) -> float:
        """Polls the health endpoint until it answers 200 "ok"; returns the seconds taken."""
        start = time.monotonic()
        deadline = start + timeout
        if self.verify_ca is not None:
            context = ssl.create_default_context(cafile=str(self.verify_ca))
        else:  # the component's own self-signed serving certificate
            context = ssl._create_unverified_context()
        headers = {"Authorization": f"Bearer {self.health_token}"} if self.health_token else {}
        last = "no answer yet"
        while True:
            assert self.popen is not None
            code = self.popen.poll()
            if code is not None:
                raise self.failure(f"exited with status {code} while starting")
            if self.reports_port is not None and self.port is None:
                self.port = self._read_port()
                last = "no port in its log yet"
            if self.reports_port is None or self.port is not None:
                last = self._probe(headers, context) or ""
                if not last:
                    return time.monotonic() - start
            if not processes.wait_until(deadline, 0.2):
                raise self.failure(
                    f"not healthy at {self.url} within {timeout:.0f} s (last: {last})"
                )

    def _probe(self, headers: dict[str, str], context: ssl.SSLContext) -> str | None:
        """None when healthy, else what the endpoint answered."""
        try:
            req = urllib.request.Request(self.url, headers=headers)
            with urllib.request.urlopen(req, timeout=2.0, context=context) as resp:
                body = resp.read().decode("utf-8", "replace")
                if resp.status == 200 and ("ok" in body or '"health":"true"' in body):
                    return None
                return f"HTTP {resp.status}: {body[:200]}"
        except urllib.error.HTTPError as e:
            return f"HTTP {e.code}: {e.read()[:300].decode('utf-8', 'replace')}"
        except (OSError, ssl.SSLError) as e:
            return str(e)
