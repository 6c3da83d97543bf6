"""The embedded local cluster: a controller process and, later, host processes.

`pw.connect()` without a cluster starts `python -m pathways_operator.local`,
which plays the resource manager and island scheduler for islands of local
"machines" and starts each placed host as a worker and a sidecar process on its
own loopback address. The client only ever talks to it over the wire protocol,
so it is the same client that drives a Kubernetes-hosted controller.

The islands are checked here, before any process starts (`local_config`): a
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
import re
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
from pathways.errors import RuntimeUnavailableError

log = logging.getLogger(__name__)
_hold_lock = threading.Lock()

DEFAULT_ISLANDS = {"island-a": 16, "island-b": 16}
DEFAULT_DEVICES_PER_HOST = 4
START_TIMEOUT_S = 60.0
STATE_PREFIX = "pathways-local-"
ENV_ISLANDS = "PATHWAYS_LOCAL_ISLANDS"
ENV_DEVICES_PER_HOST = "PATHWAYS_DEVICES_PER_HOST"

_ISLAND_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_NAME_RULE = (
    "use 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or "
    "digit (it becomes a Kubernetes label value), e.g. 'island-a'"
)
_ENTRY_RULE = "each entry is NAME:DEVICES, e.g. island-a:16,island-b:16"


# ---------------------------------------------------------------- configuration (pure)


def parse_devices_per_host(value: object, source: str) -> int:
    """Devices per host from an argument or environment text; at least 1."""
    number = int(value.strip()) if isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(
            f"{source}={value!r}: devices per host must be a whole number of at least 1, "
            f"e.g. {DEFAULT_DEVICES_PER_HOST}"
        )
    return number


def parse_islands(text: str, source: str) -> dict[str, int]:
    """``NAME:DEVICES,NAME:DEVICES`` as a mapping, each name once (not yet checked against a host size)."""
    islands: dict[str, int] = {}
    entries = text.split(",")
    for position, item in enumerate(entries, 1):
        name, sep, count = (part.strip() for part in item.partition(":"))
        if not item.strip():
            raise ValueError(f"{source}={text!r}: entry {position} is empty; {_ENTRY_RULE}")
        if not sep:
            raise ValueError(f"{source}={text!r}: entry {item.strip()!r} has no ':DEVICES'; {_ENTRY_RULE}")
        _check_name(name, source)
        if name in islands:
            raise ValueError(
                f"{source}={text!r}: island {name!r} is given twice ({islands[name]} and "
                f"{count} devices): give each island once"
            )
        if not count.lstrip("-").isdigit():
            raise ValueError(
                f"{source}={text!r}: island {name!r} has {count!r} devices: give a whole "
                "number of at least 1"
            )
        islands[name] = int(count)
    return islands


def _check_name(name: object, source: str) -> None:
    if not isinstance(name, str) or not _ISLAND_NAME.fullmatch(name):
        raise ValueError(f"{source}: island name {name!r} is not allowed: {_NAME_RULE}")


def check_islands(islands: Mapping[str, object], per_host: int, source: str) -> dict[str, int]:
    """The islands, each a whole number of hosts of ``per_host`` devices, or a ValueError naming the entry."""
    if not islands:
        raise ValueError(
            f"{source} names no island: give at least one NAME: DEVICES entry, e.g. "
            "{'island-a': 16}, or leave it out for the defaults (island-a and island-b, "
            "16 devices each)"
        )
    checked: dict[str, int] = {}
    for name, count in islands.items():
        _check_name(name, source)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(
                f"{source}: island {name!r} has {count!r} devices: give a whole number of "
                f"at least 1, a multiple of {per_host} devices per host"
            )
        if count % per_host:
            raise ValueError(
                f"{source}: island {name!r} has {count} devices, not a multiple of {per_host} "
                f"devices per host: give a multiple of {per_host}, or a devices per host "
                f"that divides {count}"
            )
        checked[name] = count
    return checked


def local_config(
    islands: Mapping[str, object] | None,
    devices_per_host: object | None,
    env: Mapping[str, str],
) -> tuple[dict[str, int], int]:
    """The embedded cluster's islands and devices per host: arguments, else the environment, else defaults."""
    if devices_per_host is not None:
        per_host = parse_devices_per_host(devices_per_host, "pw.connect(devices_per_host=...)")
    elif env.get(ENV_DEVICES_PER_HOST, "").strip():
        per_host = parse_devices_per_host(env[ENV_DEVICES_PER_HOST], ENV_DEVICES_PER_HOST)
    else:
        per_host = DEFAULT_DEVICES_PER_HOST
    if islands is not None:
        if not isinstance(islands, Mapping):
            raise ValueError(
                f"pw.connect(islands={islands!r}): give a mapping of island name to devices, "
                "e.g. {'island-a': 16}"
            )
        return check_islands(islands, per_host, f"pw.connect(islands={dict(islands)!r})"), per_host
    text = env.get(ENV_ISLANDS, "")
    if not text.strip():
        return dict(DEFAULT_ISLANDS), per_host
    parsed = parse_islands(text, ENV_ISLANDS)
    return check_islands(parsed, per_host, f"{ENV_ISLANDS}={text!r}"), per_host


def islands_arg(islands: Mapping[str, int]) -> str:
    return ",".join(f"{name}:{count}" for name, count in islands.items())


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
            if entry.stat().st_uid != os.getuid():
                continue
            owners = [
                process_tree.ProcessId.from_text((entry / name).read_text())
                for name in ("owner", "controller.owner")
                if (entry / name).exists()
            ]
        except OSError:
            continue
        if not owners or any(o is None or o.alive() for o in owners):
            continue  # not written yet (just made), or still in use
        if not process_tree.unowned(entry):
            continue
        shutil.rmtree(entry, ignore_errors=True)
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
                cluster = LocalCluster(ready.read_text().strip(), process, state, hold)
                cluster.watch()
                return cluster
            if process.poll() is not None:
                break
            time.sleep(0.05)
    except BaseException:
        process_tree.stop_group(process, 5.0)
        raise
    tail = process_tree.log_tail(log_path)
    process_tree.stop_group(process, 5.0)
    raise RuntimeUnavailableError(
        f"the local Pathways controller did not start within {START_TIMEOUT_S:.0f} s "
        f"(exit status {process.returncode}); its log ends:\n{tail}"
    )
