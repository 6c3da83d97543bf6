"""Local child processes that never outlive the test session.

Everything the cluster tier runs -- etcd, the Kubernetes control plane, the node
agent, and the containers the agent runs for pods -- is a plain local process. Three
rules keep a crashed or interrupted test run from leaving any of them behind:

* each child starts in its own session (``start_new_session=True``), so stopping it
  signals its whole process group, grandchildren included;
* each child asks the kernel to SIGKILL it when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``), so a SIGKILLed pytest or agent still takes its children
  down; the signal follows the *thread* that forked, so spawn from a long-lived thread;
* stopping is SIGTERM to the group, a bounded wait, then SIGKILL to the group.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from pathways_wire import process_tree

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl


def _die_with_parent() -> None:
    """Runs in the child between fork and exec."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    argv: Sequence[str],
    *,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    append_log: bool = False,
) -> subprocess.Popen[bytes]:
    """Starts ``argv`` in a new session, stdout and stderr to ``log`` (or discarded)."""
    out: IO[bytes] | int
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "ab" if append_log else "wb")
    else:
        out = subprocess.DEVNULL
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=str(cwd) if cwd is not None else None,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    finally:
        if not isinstance(out, int):
            out.close()


def signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    """Sends ``sig`` to the child's process group (its session, see ``spawn``)."""
    process_tree.signal_group(popen.pid, sig)


def stop(popen: subprocess.Popen[bytes], grace_seconds: float = 10.0) -> int:
    """SIGTERM the group, wait at most ``grace_seconds``, then SIGKILL; returns the exit status.

    The group is SIGKILLed at the end even when the leader exited in time, so that
    grandchildren that ignored SIGTERM do not survive their parent.
    """
    code = process_tree.stop_group(popen, grace_seconds)
    return -signal.SIGKILL if code is None else code  # None: a process stuck in the kernel


def log_tail(path: Path, max_bytes: int = 4000) -> str:
    """The last ``max_bytes`` of a log file, for error messages."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"<no log at {path}: {e}>"


def wait_until(deadline: float, interval: float = 0.1) -> bool:
    """Sleeps one ``interval`` (never past ``deadline``); False once the deadline has passed."""
    now = time.monotonic()
    if now >= deadline:
        return False
    time.sleep(min(interval, deadline - now))
    return True
