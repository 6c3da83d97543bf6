"""Driver processes: one ``python -m pathways.driver`` per running PathwaysProgram.

A program's driver is a Pathways client that runs its entrypoint against the
operator's own controller. The operator starts it as a child process with
``--exit-with-parent``, under a reaper (``pathways_wire.process_tree``) that kills
whatever the driver leaves running when it ends, detached descendants included,
so drivers and their children never outlive the operator; everything a
restarted operator needs to continue lives in files under the program's work
directory ``<state-dir>/<namespace>/<name>-<uid>/``:

``progress.jsonl``
    one line per completed step (``ctx.step_done``): ``stepsCompleted``, and
    where the next driver starts after a restart;
``results.json``
    written by the driver as it exits: the results, or the error and whether
    running again can help;
``driver.log``
    the driver's stdout and stderr, quoted in failure messages; its end is copied into
    ConfigMap ``<program>-driver-log`` when the program ends (``pathways logs program``).
    The operator reads them through a pipe and keeps at most :data:`DRIVER_LOG_MAX_BYTES`
    in the file: beyond that it becomes ``driver.log.1`` (replacing the one
    before) and a new ``driver.log`` starts, so a program keeps at most twice
    that, its newest output;
``compiled-program.json``
    for a ``spec.source.configMapRef`` program, the ConfigMap the operator read and
    checked, handed to the driver as ``--compiled-program`` (drivers hold no API
    credentials, and run exactly the version that was checked);
``driver.pid``
    the running driver, so a restarted operator can stop a leftover one before
    starting another (there is never more than one driver per program).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from pathways_wire import process_tree
from pathways_wire.driver_protocol import EXIT_RETRYABLE, PROGRESS_FILE, RESULTS_FILE, START_LINE, steps_completed

from pathways_operator.core.program_lifecycle import Reported
from pathways_operator.core.program_lifecycle import DriverState as DriverState
from pathways_operator.k8s.pathways_program import DriverSpec

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0
LOG_TAIL_CHARS = 1500
DRIVER_LOG_MAX_BYTES = 8 * 1024 * 1024
"""``driver.log`` is rotated to ``driver.log.1`` at this size (8 MiB): at most 16 MiB per program."""
RUN_MARKER = START_LINE.split("{")[0].encode()
"""The line the supervisor writes before each run of the driver; log tails start after the last one."""
_PUMP_DRAIN_S = 5.0


@dataclasses.dataclass(frozen=True)
class DriverStatus:
    state: DriverState
    exit_code: int | None = None
    results: dict[str, Any] | None = None
    """The program's results (on success)."""
    error: str = ""
    retryable: bool = False
    """The driver said it lost a host (in its results file, or by exiting with EXIT_RETRYABLE)."""
    log_tail: str = ""
    """The end of this run's output (not earlier runs')."""
    suspended: bool = False
    """It stopped at a step boundary because a suspend was asked for (state snapshotted)."""
    reported: Reported = Reported.NOTHING
    """What its results file said."""


@dataclasses.dataclass(frozen=True)
class DriverLaunch:
    """Everything a driver is started with."""

    namespace: str
    name: str
    uid: str
    entrypoint: str
    args: dict[str, Any]
    steps: int
    start_step: int
    weight: float
    slices: dict[str, dict[str, Any]]
    """Program slice name -> {"virtualSlice": name, "devices": n}."""
    checkpoint_dir: str = ""
    """Where the driver keeps orbax snapshots of the program's state ("" = none)."""
    checkpoint_every: int = 0
    compiled_program: dict[str, Any] | None = None
    """The ConfigMap of a ``spec.source.configMapRef`` program (then ``entrypoint`` is unused)."""
    owner_reference: dict[str, Any] | None = None
    """The program, as the controller ownerReference of what a driver pod needs."""
    pod: DriverSpec = DriverSpec()
    """``spec.driver``: the driver pod's image, command and pod settings."""


class _LogPump(threading.Thread):
    """Copies a driver's output from its pipe into ``driver.log``, rotating it at ``limit`` bytes."""

    def __init__(self, source: IO[bytes], path: Path, limit: int = DRIVER_LOG_MAX_BYTES) -> None:
        super().__init__(name=f"driver-log:{path.parent.name}", daemon=True)
        self._source = source
        self._path = path
        self._limit = limit

    def run(self) -> None:
        out: IO[bytes] | None = None
        size = 0
        try:
            while True:
                chunk = os.read(self._source.fileno(), 64 * 1024)
                if not chunk:
                    return
                try:
                    if out is None or (size and size + len(chunk) > self._limit):
                        if out is not None:
                            out.close()
                            os.replace(self._path, self._path.with_name(self._path.name + ".1"))
                        out = open(self._path, "ab", buffering=0)
                        size = out.tell()
                    out.write(chunk)
                    size += len(chunk)
                except OSError as err:  # the log is lost, the program goes on: keep draining the pipe
                    log.warning("%s: writing the driver's output failed: %s", self._path, err)
                    if out is not None:
                        with contextlib.suppress(OSError):
                            out.close()
                    out = None
        except (OSError, ValueError) as err:
            log.warning("%s: reading the driver's output stopped: %s", self._path, err)
        finally:
            if out is not None:
                with contextlib.suppress(OSError):
                    out.close()
            with contextlib.suppress(OSError):
                self._source.close()


@dataclasses.dataclass
class _Child:
    process: subprocess.Popen[bytes]
    launch: DriverLaunch
    pump: _LogPump


class DriverSupervisor:
    """Starts, watches and stops the drivers of this operator's programs."""

    def __init__(self, state_dir: Path, controller_address: str, python: str = sys.executable) -> None:
        self._state_dir = state_dir
        self._controller = controller_address
        self._python = python
        self._lock = threading.Lock()
        self._children: dict[str, _Child] = {}

    def workdir(self, namespace: str, name: str, uid: str) -> Path:
        return self._state_dir / namespace / f"{name}-{uid[:8]}"

    def steps_completed(self, namespace: str, name: str, uid: str) -> int:
        return steps_completed(self.workdir(namespace, name, uid) / PROGRESS_FILE)

    def log_text(self, namespace: str, name: str, uid: str, limit_bytes: int) -> str:
        """The end of the program's ``driver.log`` (at most ``limit_bytes``, from a line start); "" if none."""
        try:
            with open(self.workdir(namespace, name, uid) / "driver.log", "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - limit_bytes))
                data = f.read(limit_bytes)
        except OSError:
            return ""
        if size > limit_bytes:
            data = data[data.find(b"\n") + 1:]
            data = f"... ({size - len(data)} earlier bytes not kept)\n".encode() + data
        return data.decode(errors="replace")

    def status(self, namespace: str, name: str, uid: str, ran_before: bool = False) -> DriverStatus:
        """What the program's driver is doing (a leftover from an earlier operator counts as absent).
        ``ran_before`` changes nothing here: a child driver ends with the operator that started
        it, and an operator's restart is not counted against the program."""
        key = f"{namespace}/{name}"
        workdir = self.workdir(namespace, name, uid)
        with self._lock:
            child = self._children.get(key)
        if child is not None:
            code = child.process.poll()
            if code is None:
                return DriverStatus(DriverState.RUNNING)
            child.pump.join(_PUMP_DRAIN_S)  # its last words, for the log tail
            return self._outcome(workdir, code)
        self._kill_leftover(workdir)
        if (workdir / RESULTS_FILE).exists():
            return self._outcome(workdir, None)
        return DriverStatus(DriverState.ABSENT)

    def _outcome(self, workdir: Path, code: int | None) -> DriverStatus:
        return read_outcome(workdir, code, _tail(workdir / "driver.log"))

    def start(self, launch: DriverLaunch) -> None:
        """Start the driver (stopping any other of the same program first)."""
        key = f"{launch.namespace}/{launch.name}"
        self.stop(launch.namespace, launch.name, launch.uid)
        workdir = self.workdir(launch.namespace, launch.name, launch.uid)
        workdir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (workdir / RESULTS_FILE).unlink()
        source = ["--entrypoint", launch.entrypoint]
        if launch.compiled_program is not None:
            compiled = workdir / "compiled-program.json"
            compiled.write_text(json.dumps(launch.compiled_program))
            source = ["--compiled-program", str(compiled)]
        argv = [
            self._python, "-m", "pathways.driver",
            *source,
            "--args", json.dumps(launch.args),
            "--steps", str(launch.steps),
            "--start-step", str(launch.start_step),
            "--weight", repr(launch.weight),
            "--controller", self._controller,
            "--namespace", launch.namespace,
            "--slices", json.dumps(launch.slices),
            "--progress-file", str(workdir / PROGRESS_FILE),
            "--results-file", str(workdir / RESULTS_FILE),
            "--exit-with-parent",
        ]
        if launch.checkpoint_dir:
            argv += ["--checkpoint-dir", launch.checkpoint_dir,
                     "--checkpoint-every", str(launch.checkpoint_every)]
        with open(workdir / "driver.log", "ab") as out:
            out.write(START_LINE.format(step=launch.start_step).encode() + b"\n")
        process = subprocess.Popen(
            process_tree.supervised(argv, self._python),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert process.stdout is not None
        pump = _LogPump(process.stdout, workdir / "driver.log")
        pump.start()
        (workdir / "driver.pid").write_text(str(process.pid))
        with self._lock:
            self._children[key] = _Child(process, launch, pump)
        log.info("%s: driver %d started at step %d", key, process.pid, launch.start_step)

    def stop(self, namespace: str, name: str, uid: str) -> None:
        """Stop the program's driver, if one runs (SIGTERM, then SIGKILL after a grace period)."""
        key = f"{namespace}/{name}"
        with self._lock:
            child = self._children.pop(key, None)
        if child is not None and child.process.poll() is None:
            _terminate(child.process.pid)
            try:
                child.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _kill_group(child.process.pid)
                child.process.wait(STOP_GRACE_S)
        self._kill_leftover(self.workdir(namespace, name, uid))

    def request_suspend(self, namespace: str, name: str) -> bool:
        """Ask the running driver to stop at its next step boundary (SIGUSR1); False if none runs."""
        with self._lock:
            child = self._children.get(f"{namespace}/{name}")
        if child is None or child.process.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child.process.pid, signal.SIGUSR1)
        return True

    def discard_outcome(self, namespace: str, name: str, uid: str) -> None:
        """Forget how the last run ended, so the next look starts a new one."""
        self.stop(namespace, name, uid)
        with contextlib.suppress(FileNotFoundError):
            (self.workdir(namespace, name, uid) / RESULTS_FILE).unlink()

    def retire(self, namespace: str, name: str, uid: str) -> None:
        """The program ended: no driver of it runs."""
        self.stop(namespace, name, uid)

    def forget(self, namespace: str, name: str, uid: str) -> None:
        """Stop the driver and remove the program's work directory (the program is gone)."""
        self.stop(namespace, name, uid)
        shutil.rmtree(self.workdir(namespace, name, uid), ignore_errors=True)

    def stop_all(self) -> None:
        with self._lock:
            children = list(self._children.items())
        for key, child in children:
            launch = child.launch
            self.stop(launch.namespace, launch.name, launch.uid)

    def _kill_leftover(self, workdir: Path) -> None:
        """Kill a driver an earlier operator process started and did not take down with it."""
        pid_file = workdir / "driver.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        with self._lock:
            ours = any(c.process.pid == pid for c in self._children.values())
        if ours:
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            cmdline = ""
        if "pathways.driver" in cmdline and str(workdir) in cmdline:
            log.warning("stopping leftover driver %d of %s", pid, workdir)
            _kill_group(pid)
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()


def read_outcome(workdir: Path, code: int | None, log_tail: str) -> DriverStatus:
    """How a driver that exited with ``code`` ended, from the results file in ``workdir``.

    ``log_tail`` is the end of its output; an error that came with a traceback of its own
    (``logTail``, reported by a driver pod whose log the operator cannot read) uses that.
    """
    try:
        payload = json.loads((workdir / RESULTS_FILE).read_text())
    except (OSError, ValueError):
        payload = None
    if isinstance(payload, dict) and payload.get("suspended") is True:
        return DriverStatus(DriverState.EXITED, code, suspended=True, log_tail=log_tail,
                            reported=Reported.SUSPENDED)
    if isinstance(payload, dict) and isinstance(payload.get("results"), dict):
        return DriverStatus(DriverState.EXITED, code, results=payload["results"], log_tail=log_tail,
                            reported=Reported.RESULTS)
    if isinstance(payload, dict) and "error" in payload:
        return DriverStatus(
            DriverState.EXITED,
            code,
            error=str(payload["error"]),
            retryable=bool(payload.get("retryable")) or code == EXIT_RETRYABLE,
            log_tail=log_tail or str(payload.get("logTail") or "").strip(),
            reported=Reported.ERROR,
        )
    return DriverStatus(DriverState.EXITED, code, retryable=code == EXIT_RETRYABLE, log_tail=log_tail)


def _terminate(pid: int) -> None:
    process_tree.signal_group(pid, signal.SIGTERM)


def _kill_group(pid: int) -> None:
    process_tree.signal_group(pid, signal.SIGKILL)


def _tail(path: Path) -> str:
    """The last LOG_TAIL_CHARS of the latest run's output (reaching into ``driver.log.1`` if needed)."""
    data = b""
    for part in (path, path.with_name(path.name + ".1")):
        try:
            with open(part, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - LOG_TAIL_CHARS))
                data = f.read() + data
        except OSError:
            continue
        if RUN_MARKER in data or len(data) >= LOG_TAIL_CHARS:
            break
    start = data.rfind(RUN_MARKER)
    if start >= 0:
        end = data.find(b"\n", start)
        data = data[end + 1:] if end >= 0 else b""
    return data[-LOG_TAIL_CHARS:].decode(errors="replace").strip()
