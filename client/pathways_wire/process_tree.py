"""Process lifetimes: children that never outlive their parent, and groups stopped whole.

Every process Kube-Pathways starts on one machine -- the embedded controller, its
hosts' worker and sidecar processes, the operator's program drivers -- is started
and stopped with the pieces of this module, so that no way of ending a parent
(an exception, SIGTERM, SIGKILL) leaves its children running:

* **The parent link.** :func:`parent_link_env` gives a child the read end of a
  pipe whose write end only the parent holds. The child's :func:`watch_parent`
  thread sees end-of-file as soon as the parent is gone, however it ended: the
  kernel closes the write end even after SIGKILL. It also notices its parent pid
  changing (re-parenting), which covers a write end inherited by a fork.
  ``prctl(PR_SET_PDEATHSIG)`` is not used for these children: it fires when the
  *thread* that forked exits, and controllers start hosts from worker threads.
* **Process groups.** Children start in their own session, and :func:`stop_group`
  signals the whole group: SIGTERM, a bounded wait, then SIGKILL.
* **The reaper.** ``python -m pathways_wire.process_tree -- CMD...`` runs CMD in a
  process that is the *child subreaper* (``PR_SET_CHILD_SUBREAPER``) of all CMD
  starts: a descendant that detaches (``setsid``, a double fork) is re-parented to
  the reaper rather than to init, so it can still be found and is killed when CMD
  ends. Signals are passed on to CMD; CMD's exit status is the reaper's. Without a
  cgroup this is the strongest guarantee available: only a SIGKILL of the reaper
  itself lets detached descendants escape, and the reaper stops CMD within
  ``--grace-s`` so its own parent's SIGKILL never has to come.
* **Owners of directories.** An owner holds a shared ``flock`` on its directory
  (:func:`hold_dir`) for as long as it lives; the kernel drops it however the owner
  ends. :func:`unowned` is true once nobody holds it, which, unlike a pid, cannot be
  fooled by pid reuse or by another pid namespace sharing the filesystem.
  :class:`ProcessId` (pid *and* start time) records who the owners were.

The four stay in one module of about 440 lines because each guarantee leans on the
others (the reaper is a parent-linked child; stopping a group is how every owner
ends), and a reader checking "can this process outlive its parent?" needs them all.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import fcntl
import logging
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

ENV_PARENT_LINK = "PATHWAYS_PARENT_LINK"
"""``FD,PID``: the read end of the parent link and the parent's pid (see :func:`watch_parent`)."""

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_link_lock = threading.Lock()
_link: tuple[int, int] | None = None
"""(read end, write end) of this process's parent link; the write end is never closed."""


# ---------------------------------------------------------------- identities


@dataclasses.dataclass(frozen=True)
class ProcessId:
    """A process named by pid and start time (clock ticks since boot), robust to pid reuse."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        start = _start_time(pid)
        return None if start is None else cls(pid, start)

    @classmethod
    def current(cls) -> ProcessId:
        me = cls.of(os.getpid())
        return me if me is not None else cls(os.getpid(), 0)

    def alive(self) -> bool:
        return _start_time(self.pid) == self.start and not _exited(self.pid)

    def to_text(self) -> str:
        return f"{self.pid} {self.start}"

    @classmethod
    def from_text(cls, text: str) -> ProcessId | None:
        parts = text.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return None
        return cls(int(parts[0]), int(parts[1]))


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3, the state, first)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _exited(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is None or fields[0] in ("Z", "X")


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    return pid > 0 and not _exited(pid)


def hold_dir(path: Path) -> int:
    """Hold a shared lock on directory ``path`` until the returned fd is closed or this process ends."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def unowned(path: Path) -> bool:
    """True if no process holds ``path`` (see :func:`hold_dir`); False if it does or is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def remove_if_abandoned(path: Path) -> bool:
    """Removes ``path`` if it is this user's and no process holds it; True if it was removed."""
    try:
        if path.stat().st_uid != os.getuid():
            return False
    except OSError:
        return False
    if not unowned(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


# ---------------------------------------------------------------- parent link


def _parent_link() -> tuple[int, int]:
    global _link
    with _link_lock:
        if _link is None:
            _link = os.pipe()  # both ends close-on-exec: children get only what pass_fds names
        return _link


def parent_link_env() -> tuple[dict[str, str], tuple[int, ...]]:
    """The environment entry and ``pass_fds`` for a child that must exit with this process."""
    read_end, _ = _parent_link()
    return {ENV_PARENT_LINK: f"{read_end},{os.getpid()}"}, (read_end,)


def watch_parent(on_parent_gone: Callable[[], None], env: dict[str, str] | None = None) -> bool:
    """Call ``on_parent_gone`` (once, in a thread) when the parent in ``PATHWAYS_PARENT_LINK`` ends.

    Returns False, watching nothing, when the variable is absent (a pod, a process
    started by hand) or names no pipe. A parent that is already gone is noticed at once.
    The variable is taken out of the environment: it is this process's alone, and a
    child of this one gets its own link or none.
    """
    text = os.environ.pop(ENV_PARENT_LINK, "") if env is None else env.get(ENV_PARENT_LINK, "")
    fd_text, _, pid_text = text.partition(",")
    if not fd_text.isdigit() or not pid_text.isdigit():
        return False
    fd, parent = int(fd_text), int(pid_text)
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise OSError(f"fd {fd} is not a pipe")
        os.set_inheritable(fd, False)  # not handed on to this process's own children
    except OSError as err:
        log.warning("%s=%r names no parent link (%s); not watching the parent", ENV_PARENT_LINK, text, err)
        return False

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while os.getppid() == parent:
            try:
                if poller.poll(1000) and not os.read(fd, 1):
                    break
            except OSError:
                break
        log.warning("parent process %d is gone; exiting", parent)
        on_parent_gone()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    return True


def exit_after(seconds: float, cleanup: Callable[[], None] = lambda: None, code: int = 1) -> None:
    """A last resort: run ``cleanup`` and ``os._exit`` if the process still runs in ``seconds``."""

    def last_resort() -> None:
        time.sleep(seconds)
        log.error("still running %.0f s after being asked to stop; exiting now", seconds)
        with contextlib.suppress(Exception):
            cleanup()
        os._exit(code)

    threading.Thread(target=last_resort, name="exit-deadline", daemon=True).start()


# ---------------------------------------------------------------- groups


def signal_group(pid: int, sig: int) -> bool:
    """Send ``sig`` to the process group led by ``pid``; False if it is gone.

    A SIGTERM is followed by a SIGCONT, as ``kill`` and the kubelet do: a stopped
    member (SIGSTOP, a debugger) would otherwise keep the SIGTERM pending and sit
    out the whole grace period before its SIGKILL.
    """
    try:
        os.killpg(pid, sig)
        if sig == signal.SIGTERM:
            os.killpg(pid, signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_group(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> int | None:
    """SIGTERM ``process``'s group, wait up to ``grace_s``, then SIGKILL the group.

    The group is SIGKILLed at the end even when the leader exited in time, so members
    that ignored SIGTERM do not outlive it. Returns the leader's exit status (None if
    it could not be reaped, a process stuck in the kernel).
    """
    if process.poll() is None:
        signal_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(grace_s, 0.0))
    signal_group(process.pid, signal.SIGKILL)
    try:
        return process.wait(10.0)
    except subprocess.TimeoutExpired:
        return None


def log_tail(path: Path, max_bytes: int = 2000) -> str:
    """The end of a child's log, for the message that says it failed."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------- the reaper


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children (Linux); False if unsupported."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """For ``preexec_fn`` in a single-threaded parent: ``sig`` when the parent ends."""
    _prctl(_PR_SET_PDEATHSIG, sig)


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
        except OSError:
            continue
        found.extend(int(p) for p in text.split())
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), bounded against cycles."""
    seen: list[int] = []
    frontier = children(pid)
    while frontier and len(seen) < 100_000:
        nxt: list[int] = []
        for child in frontier:
            if child not in seen:
                seen.append(child)
                nxt.extend(children(child))
        frontier = nxt
    return seen


def _reap() -> list[tuple[int, int]]:
    """Reap every exited child without blocking; (pid, wait status) of each."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def kill_descendants(grace_s: float = 1.0, deadline_s: float = 10.0) -> None:
    """SIGTERM every descendant of this (subreaper) process, then SIGKILL what is left.

    Run by a subreaper, this reaches descendants that detached: they are its children.
    """
    me = os.getpid()
    for pid in descendants(me):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(pid_alive(p) for p in descendants(me)):
        _reap()
        time.sleep(0.05)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        _reap()
        left = [p for p in descendants(me) if pid_alive(p)]
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    _reap()


def supervised(argv: Sequence[str], python: str = sys.executable) -> list[str]:
    """``argv`` run under the reaper (see the module docstring)."""
    return [python, "-m", "pathways_wire.process_tree", "--", *argv]


def run_reaping(argv: Sequence[str], grace_s: float = 3.0, poll_s: float = 0.1) -> int:
    """Run ``argv`` as the reaper; returns its wait status as ``Popen.returncode`` would."""
    become_subreaper()
    parent = os.getppid()
    stop_at: list[float] = []
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: object) -> None:
        if child is None:
            if signum != signal.SIGUSR1 and not stop_at:
                stop_at.append(time.monotonic())
            return
        if signum == signal.SIGUSR1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)
            return
        if not stop_at:
            stop_at.append(time.monotonic())
        signal_group(child.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, forward)
    # The command leads its own group, so a signal to the reaper's group is passed on
    # once (above), not delivered twice; if the reaper is SIGKILLed the command follows.
    child = subprocess.Popen(
        list(argv), process_group=0, preexec_fn=die_with_parent, close_fds=True
    )
    if stop_at:
        signal_group(child.pid, signal.SIGTERM)
    status: int | None = None
    killed = False
    while status is None:
        for pid, wait_status in _reap():
            if pid == child.pid:
                status = os.waitstatus_to_exitcode(wait_status)
        if status is not None:
            break
        if not stop_at and os.getppid() != parent:
            stop_at.append(time.monotonic())
            signal_group(child.pid, signal.SIGTERM)
        if stop_at and not killed and time.monotonic() - stop_at[0] > grace_s:
            signal_group(child.pid, signal.SIGKILL)
            killed = True
        time.sleep(poll_s)
    child.returncode = status  # reaped above; keeps Popen from waiting for it again
    signal_group(child.pid, signal.SIGKILL)
    kill_descendants(grace_s=0.5 if stop_at else 1.0)
    return status


def _exit_like(status: int) -> None:
    """Exit as the command did: the same code, or the same fatal signal."""
    if status >= 0:
        sys.exit(status)
    signal.signal(-status, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {-status})
    os.kill(os.getpid(), -status)
    sys.exit(128 - status)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pathways_wire.process_tree",
        description="Run a command; when it ends, kill every process it left behind.",
    )
    parser.add_argument("--grace-s", type=float, default=3.0,
                        help="after a stop signal, how long the command has before SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    _exit_like(run_reaping(command, grace_s=args.grace_s))


if __name__ == "__main__":
    main()
