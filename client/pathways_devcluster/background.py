"""The dev cluster in the background: started detached, found by its records, stopped by PID.

``up`` starts ``python -m pathways_devcluster serve`` in a session of its own, so that it
outlives the shell and ``make``, with its output in ``<state>/dev-cluster.log``, and
records it in ``<state>/pid`` as pid and start time (so a reused pid is never taken for
it). ``serve`` records the PIDs of what it started in ``<state>/pids`` and writes
``<state>/ready`` once the operator's Deployment is available; ``up`` waits for that, or
for ``serve`` to exit (then it prints the end of the log), bounded, and prints
``export KUBECONFIG=...``.

``serve`` is a child subreaper: whatever was started below it and detached becomes its
child, and after stopping the cluster it kills every descendant still there. ``down``
sends SIGTERM to the recorded process, waits (bounded) for it to exit, SIGKILLs its group
and any recorded PID still alive if it does not, and removes the state directory, so
nothing of the dev cluster is left: no process, no mount, no file.

The state directory is ``$KPW_CACHE/dev-cluster`` (``~/.cache/kube-pathways/dev-cluster``)
unless ``--state-dir`` says otherwise.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pathways_wire import process_tree
from pathways_wire.process_tree import ProcessId

from pathways_devcluster.binaries import REPO_ROOT, cache_dir
from pathways_devcluster.components import ControlPlaneError
from pathways_devcluster.dev_cluster import DevCluster

log = logging.getLogger(__name__)

UP_TIMEOUT_S = 600.0
DOWN_TIMEOUT_S = 240.0


def default_state_dir() -> Path:
    return cache_dir() / "dev-cluster"


class Records:
    """The files in the state directory through which ``up``, ``serve`` and ``down`` meet."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.pid_file = state_dir / "pid"
        """The ``serve`` process: pid and start time."""
        self.pids_file = state_dir / "pids"
        """What ``serve`` started, by name: pid and start time."""
        self.ready_file = state_dir / "ready"
        self.log_file = state_dir / "dev-cluster.log"
        self.kubeconfig = state_dir / "controlplane" / "admin.kubeconfig"

    def server(self) -> ProcessId | None:
        """The recorded ``serve`` process, while it runs."""
        try:
            found = ProcessId.from_text(self.pid_file.read_text())
        except OSError:
            return None
        return found if found is not None and found.alive() else None

    def recorded(self) -> list[ProcessId]:
        """Every process ``serve`` recorded having started."""
        try:
            texts = json.loads(self.pids_file.read_text())
        except (OSError, ValueError):
            return []
        return [p for p in (ProcessId.from_text(str(t)) for t in texts.values()) if p is not None]

    def record_pids(self, pids: dict[str, int]) -> None:
        found = {name: ProcessId.of(pid) for name, pid in pids.items()}
        texts = {name: p.to_text() for name, p in found.items() if p is not None}
        self.pids_file.write_text(json.dumps(texts, indent=1) + "\n")

    def ready_seconds(self) -> float | None:
        try:
            return float(json.loads(self.ready_file.read_text())["seconds"])
        except (OSError, ValueError, KeyError):
            return None


def export_line(records: Records) -> str:
    return f"export KUBECONFIG={records.kubeconfig}"


# -- up --------------------------------------------------------------------------------------


def up(state_dir: Path, timeout: float = UP_TIMEOUT_S) -> int:
    """Starts ``serve`` in the background and waits until the cluster is ready."""
    records = Records(state_dir)
    running = records.server()
    if running is not None:
        print(f"a dev cluster is already running (pid {running.pid}, state in {state_dir}); "
              "`make dev-cluster-down` stops it", file=sys.stderr)
        print(export_line(records))
        return 0
    shutil.rmtree(state_dir, ignore_errors=True)  # a stale one: its processes are gone
    state_dir.mkdir(parents=True)
    started = time.monotonic()
    with open(records.log_file, "ab") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "pathways_devcluster", "serve", "--state-dir", str(state_dir)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
            start_new_session=True,
        )  # fmt: skip
    me = ProcessId.of(server.pid)
    records.pid_file.write_text(me.to_text() if me is not None else f"{server.pid} 0")
    print(f"dev cluster starting (pid {server.pid}); log: {records.log_file}", file=sys.stderr)
    deadline = started + timeout
    while records.ready_seconds() is None:
        if server.poll() is not None:
            print(f"the dev cluster exited with {server.returncode} while starting; "
                  f"{records.log_file} ends with:\n{process_tree.log_tail(records.log_file, 6000)}\n"
                  f"Its logs stay in {state_dir} until `make dev-cluster-down`.", file=sys.stderr)
            return 1
        if time.monotonic() > deadline:
            print(f"the dev cluster was not ready within {timeout:.0f} s; stopping it. "
                  f"{records.log_file} ends with:\n{process_tree.log_tail(records.log_file, 6000)}",
                  file=sys.stderr)
            down(state_dir)
            return 1
        time.sleep(0.5)
    print(f"dev cluster ready in {time.monotonic() - started:.1f} s: nodes a-0 a-1 (island-a), "
          f"b-0 b-1 (island-b), 4 devices each; the operator from helm/kube-pathways in "
          f"namespace pathways-system. Stop it with `make dev-cluster-down`.", file=sys.stderr)
    print(export_line(records))
    return 0


# -- serve -----------------------------------------------------------------------------------


class _Stopped(Exception):
    """SIGTERM or SIGINT arrived while the cluster was starting."""


def serve(state_dir: Path) -> int:
    """Runs the dev cluster in the foreground until SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    process_tree.become_subreaper()
    records = Records(state_dir)
    stop = threading.Event()
    ready = False

    def _on_signal(signum: int, frame: object) -> None:
        stop.set()
        if not ready:
            raise _Stopped

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    cluster = DevCluster(state_dir)
    started = time.monotonic()
    code = 0
    try:
        cluster.start()
        records.record_pids(cluster.pids())
        seconds = time.monotonic() - started
        records.ready_file.write_text(json.dumps({"seconds": round(seconds, 1)}) + "\n")
        ready = True
        log.info("dev cluster ready in %.1f s; %s", seconds, export_line(records))
        while not stop.wait(1.0):
            pass
        log.info("dev cluster: stopping")
    except _Stopped:
        log.info("dev cluster: stopped while starting")
    except ControlPlaneError as e:
        log.error("dev cluster: %s", e)
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
        process_tree.kill_descendants()
        log.info("dev cluster: stopped")
    return code


# -- down ------------------------------------------------------------------------------------


def down(state_dir: Path, timeout: float = DOWN_TIMEOUT_S) -> int:
    """Stops the recorded ``serve`` process and everything it recorded; removes the state."""
    records = Records(state_dir)
    server = records.server()
    recorded = records.recorded()
    if server is None and not state_dir.exists():
        print(f"no dev cluster is running (no {records.pid_file})", file=sys.stderr)
        return 0
    if server is not None:
        process_tree.signal_group(server.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if server.alive():
            print(f"the dev cluster (pid {server.pid}) did not stop within {timeout:.0f} s: "
                  "killing it", file=sys.stderr)
            process_tree.signal_group(server.pid, signal.SIGKILL)
    left = [p for p in recorded if p.alive()]
    for process in left:
        process_tree.signal_group(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while any(p.alive() for p in left) and time.monotonic() < deadline:
        time.sleep(0.1)
    still = [p.pid for p in left if p.alive()]
    shutil.rmtree(state_dir, ignore_errors=True)
    if still:
        print(f"processes of the dev cluster would not die: {still}", file=sys.stderr)
        return 1
    print(f"dev cluster stopped; {state_dir} removed", file=sys.stderr)
    return 0
