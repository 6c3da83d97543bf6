"""An embedded host's processes, by the PIDs its launcher recorded when it started them,
and its slice's token, from the file the launcher gave it.

Fault tests signal exactly these: a search of the process table by module name or
address could find another test's host on the same machine. A test that watches the
hosts of a slice its own client did not make presents the token to learn their stores.
"""

from __future__ import annotations

import pathways as pw
from pathways_wire import pathways_pb2 as pb
from pathways_operator.local_hosts import host_run_dir


def host_pid(runtime: pw.Runtime, slice_info: pb.SliceInfo, index: int, role: str) -> int | None:
    """The PID of ``role`` ("worker" or "dataflow") of host ``index``, or None while it has none."""
    assert runtime.cluster is not None, "fault tests run on the embedded runtime"
    ip = slice_info.hosts[index].address.rsplit(":", 1)[0]
    pid_file = host_run_dir(runtime.cluster.state_dir, slice_info.slice_id, index, ip) / f"{role}.pid"
    try:
        return int(pid_file.read_text())
    except (OSError, ValueError):
        return None


def process_state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped by a signal), or why there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError as err:
        return f"unreadable ({err})"


def host_token(runtime: pw.Runtime, slice_info: pb.SliceInfo, index: int) -> str:
    """The slice token host ``index`` demands, as its launcher handed it over."""
    assert runtime.cluster is not None, "the embedded runtime's hosts keep their token in a file"
    ip = slice_info.hosts[index].address.rsplit(":", 1)[0]
    return (host_run_dir(runtime.cluster.state_dir, slice_info.slice_id, index, ip) / "slice-token").read_text()
