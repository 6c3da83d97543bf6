"""The embedded local cluster: a controller process and, later, host processes.

`pw.connect()` without a cluster starts `python -m pathways_operator.local`,
which plays the resource manager and island scheduler for islands of local
"machines" and starts each placed host as a worker and a sidecar process on its
own loopback address. The client only ever talks to it over the wire protocol,
so it is the same client that drives a Kubernetes-hosted controller.

The islands are checked before any process starts (`pathways_wire.island_config`): a
bad name, size, duplicate or devices-per-host value is a ValueError naming it.

Nothing is left behind. The controller's state directory
(`$TMPDIR/pathways-local-*`: its log, the hosts' logs and slice-token files) is
removed when the cluster stops, when the controller exits, or -- if both the
client and the controller were killed -- by the next `start_local_cluster`,
which removes directories whose owners are gone: the client and the controller
each hold a lock on it while they live (`pathways_wire.process_tree.hold_dir`) and
record themselves in `owner` and `controller.owner`. The controller exits with the client, and its hosts with it
(`pathways_wire.process_tree`).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pathways_wire import process_tree
from pathways_wire.driver_protocol import CLIENT_TOKEN_FILE
from pathways_wire.island_config import islands_arg, local_config
from pathways_wire.errors import RuntimeUnavailableError

log = logging.getLogger(__name__)
_hold_lock = threading.Lock()

START_TIMEOUT_S = 60.0
STATE_PREFIX = "pathways-local-"


# ---------------------------------------------------------------- the state directory


def remove_stale_state_dirs(root: Path | None = None) -> list[Path]:
    """Remove this user's state directories that nobody holds and whose recorded owners are gone."""
    base = Path(tempfile.gettempdir()) if root is None else root
    removed: list[Path] = []
    try:
        entries = [e for e in base.iterdir() if e.name.startswith(STATE_PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        try:
            owners = [
                process_tree.ProcessId.from_text((entry / name).read_text())
                for name in ("owner", "controller.owner")
                if (entry / name).exists()
            ]
        except OSError:
            continue
        if not owners or any(o is None or o.alive() for o in owners):
            continue  # not written yet (just made), or still in use
        if process_tree.remove_if_abandoned(entry):
            removed.append(entry)
    return removed


@dataclass
class LocalCluster:
    address: str
    process: subprocess.Popen[bytes]
    state_dir: Path
    hold: int = -1
    """The client's lock on ``state_dir``."""
    stopping: bool = False
    client_token: str = ""
    """What the controller made at start for this client to present (its ``client.token``)."""

    @property
    def log_path(self) -> Path:
        return self.state_dir / "controller.log"

    def watch(self) -> None:
        """Remove the state directory as soon as the controller exits, however it ends
        (its log's tail is logged first if nobody asked it to stop)."""

        def wait() -> None:
            try:
                code = self.process.wait()
                if not self.stopping:
                    how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
                    log.warning(
                        "the local Pathways controller %s; its log ends:\n%s",
                        how, process_tree.log_tail(self.log_path),
                    )
            finally:
                self._remove_state()

        threading.Thread(target=wait, name="local-controller-watch", daemon=True).start()

    def stop(self, timeout_s: float = 20.0) -> None:
        self.stopping = True
        try:
            process_tree.stop_group(self.process, timeout_s)
        finally:
            self._remove_state()

    def _remove_state(self) -> None:
        shutil.rmtree(self.state_dir, ignore_errors=True)
        with _hold_lock:
            hold, self.hold = self.hold, -1
        if hold >= 0:
            os.close(hold)


def start_local_cluster(
    islands: Mapping[str, object] | None = None, devices_per_host: object | None = None
) -> LocalCluster:
    islands, per_host = local_config(islands, devices_per_host, os.environ)
    remove_stale_state_dirs()
    state = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))
    hold = process_tree.hold_dir(state)  # before `owner` exists: see remove_stale_state_dirs
    try:
        (state / "owner").write_text(process_tree.ProcessId.current().to_text())
        return _start(state, hold, islands, per_host)
    except BaseException:
        shutil.rmtree(state, ignore_errors=True)
        os.close(hold)
        raise


def _start(state: Path, hold: int, islands: dict[str, int], per_host: int) -> LocalCluster:
    ready = state / "controller.addr"
    log_path = state / "controller.log"
    cmd = [
        sys.executable,
        "-m",
        "pathways_operator.local",
        "--listen",
        "127.0.0.1:0",
        "--islands",
        islands_arg(islands),
        "--devices-per-host",
        str(per_host),
        "--state-dir",
        str(state),
        "--ready-file",
        str(ready),
    ]
    link_env, link_fds = process_tree.parent_link_env()
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, **link_env}, pass_fds=link_fds,
        )
    try:
        owner = process_tree.ProcessId.of(process.pid)
        if owner is not None:
            (state / "controller.owner").write_text(owner.to_text())
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if ready.exists() and ready.read_text().strip():
                token = (state / CLIENT_TOKEN_FILE).read_text().strip()
                cluster = LocalCluster(ready.read_text().strip(), process, state, hold, client_token=token)
                cluster.watch()
                return cluster
            if process.poll() is not None:
                break
            time.sleep(0.05)
    except BaseException:
        process_tree.stop_group(process, 5.0)
        raise
    tail = process_tree.log_tail(log_path)
    exited = process.poll()
    process_tree.stop_group(process, 5.0)
    what = (
        f"exited with status {exited} before it was ready" if exited is not None
        else f"did not start within {START_TIMEOUT_S:.0f} s (stopped)"
    )
    raise RuntimeUnavailableError(f"the local Pathways controller {what}; its log ends:\n{tail}")
