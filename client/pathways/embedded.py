"""The embedded local cluster: a controller process and, later, host processes.

`pw.connect()` without a cluster starts `python -m pathways_operator.local`,
which plays the resource manager and island scheduler for islands of local
"machines" and starts each placed host as a worker and a sidecar process on its
own loopback address. The client only ever talks to it over the wire protocol,
so it is the same client that drives a Kubernetes-hosted controller.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pathways.errors import RuntimeUnavailableError

DEFAULT_ISLANDS = {"island-a": 16, "island-b": 16}
DEFAULT_DEVICES_PER_HOST = 4
START_TIMEOUT_S = 60.0


def _islands_from_env() -> dict[str, int]:
    text = os.environ.get("PATHWAYS_LOCAL_ISLANDS", "")
    if not text:
        return dict(DEFAULT_ISLANDS)
    islands: dict[str, int] = {}
    for item in text.split(","):
        name, sep, count = item.strip().partition(":")
        if not sep or not count.isdigit() or int(count) < 1:
            raise ValueError(
                f"PATHWAYS_LOCAL_ISLANDS={text!r}: each entry is NAME:DEVICES, "
                "e.g. island-a:16,island-b:16"
            )
        islands[name] = int(count)
    return islands


@dataclass
class LocalCluster:
    address: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_local_cluster(
    islands: dict[str, int] | None = None, devices_per_host: int | None = None
) -> LocalCluster:
    islands = islands or _islands_from_env()
    per_host = devices_per_host or int(
        os.environ.get("PATHWAYS_DEVICES_PER_HOST", DEFAULT_DEVICES_PER_HOST)
    )
    for name, count in islands.items():
        if count % per_host:
            raise ValueError(
                f"island '{name}' has {count} devices, not a multiple of {per_host} devices per host"
            )
    state = Path(tempfile.mkdtemp(prefix="pathways-local-"))
    ready = state / "controller.addr"
    log_path = state / "controller.log"
    spec = ",".join(f"{k}:{v}" for k, v in islands.items())
    cmd = [
        sys.executable,
        "-m",
        "pathways_operator.local",
        "--listen",
        "127.0.0.1:0",
        "--islands",
        spec,
        "--devices-per-host",
        str(per_host),
        "--state-dir",
        str(state),
        "--ready-file",
        str(ready),
        "--parent-pid",
        str(os.getpid()),
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready.exists() and ready.read_text().strip():
            return LocalCluster(ready.read_text().strip(), process, log_path)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
    if process.poll() is None:
        process.kill()
    raise RuntimeUnavailableError(
        f"the local Pathways controller did not start within {START_TIMEOUT_S:.0f} s "
        f"(log {log_path}):\n{tail}"
    )
