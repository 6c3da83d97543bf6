"""No process or file outlives its owner: real controllers, hosts, drivers and clients.

Victims are the processes recorded when they were started (the launcher's pid files,
a program's own report), never processes found by name.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import pathways as pw
from pathways_wire import process_tree
from pathways_wire.process_tree import pid_alive
from pathways_operator.k8s.drivers import DriverLaunch, DriverState, DriverSupervisor
from tests.integration.host_pids import process_state

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")


def _eventually(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"within {timeout_s:.0f} s: {what}")
        time.sleep(0.1)


def _host_pids(state_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted((state_dir / "hosts").glob("*/*.pid"))]


def _shm_dirs(controller_pid: int) -> list[Path]:
    return sorted(SHM.glob(f"pathways-{controller_pid}-*"))


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def one_island() -> Iterator[pw.Runtime]:
    runtime = pw.connect(islands={"island-a": 4}, devices_per_host=4)
    try:
        yield runtime
    finally:
        pw.shutdown()


def _place_a_slice() -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=4)
    double = pw.pmap(lambda x: x * 2.0, devices=vslice.devices)
    np.testing.assert_allclose(double(np.ones(4, np.float32)), [2.0] * 4)


def test_hosts_shm_and_state_dirs_go_when_the_local_controller_is_sigkilled(
    one_island: pw.Runtime,
) -> None:
    _place_a_slice()
    cluster = one_island.cluster
    assert cluster is not None
    controller = cluster.process.pid
    hosts = _host_pids(cluster.state_dir)
    assert len(hosts) == 2 and all(pid_alive(p) for p in hosts), hosts
    assert _shm_dirs(controller)
    try:
        os.kill(controller, signal.SIGKILL)
        _eventually(lambda: not any(pid_alive(p) for p in hosts), 30, f"hosts {hosts} exit")
        _eventually(lambda: not _shm_dirs(controller), 30, f"{_shm_dirs(controller)} removed")
        _eventually(lambda: not cluster.state_dir.exists(), 30, f"{cluster.state_dir} removed")
    finally:
        _kill_all(hosts)


def test_a_clean_run_leaves_no_state_or_shm_directory() -> None:
    runtime = pw.connect(islands={"island-a": 4}, devices_per_host=4)
    try:
        _place_a_slice()
        assert runtime.cluster is not None
        state_dir, controller = runtime.cluster.state_dir, runtime.cluster.process.pid
        assert list(state_dir.glob("hosts/*/slice-token")), "the hosts got their token as a file"
    finally:
        pw.shutdown()
    assert not state_dir.exists()
    assert not _shm_dirs(controller)


_BLOCKED_CLIENT = textwrap.dedent(
    """
    import faulthandler, signal, sys, threading, time
    import numpy as np
    import pathways as pw

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's view of a hang
    # Ctrl-C as in an interactive shell: a shell's background job (a CI step, `make test &`)
    # starts its children with SIGINT ignored, and Python then installs no handler for it.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    runtime = pw.connect(islands={"island-a": 4}, devices_per_host=4)
    vslice = pw.make_virtual_device_set().add_slice(devices=4)
    double = pw.pmap(lambda x: x * 2.0, devices=vslice.devices)
    big = np.ones((4, 1 << 16), np.float32)  # inputs and outputs too big to travel inline
    double(big).block_until_ready()  # places the slice, loads the program and runs: the next call only runs
    print("STATE", runtime.cluster.state_dir, flush=True)
    sys.stdin.readline()
    main = threading.main_thread().ident

    def report_when_blocked():
        # "in the call": the main thread waits inside the runtime's call (for another
        # thread, for gRPC, or for the host's answer to the put it sends itself)
        for _ in range(600):
            frame = sys._current_frames().get(main)
            stack = []
            while frame is not None:
                stack.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
                frame = frame.f_back
            waiting = any(w in stack[0] for w in ("threading.py", "grpc", "pathways_wire/data_frames.py"))
            if waiting and any("pathways/runtime.py" in f for f in stack):
                print("BLOCKED", stack[:4], flush=True)
                return
            time.sleep(0.05)

    threading.Thread(target=report_when_blocked, daemon=True).start()
    double(big)  # its input is put to the stopped host here
    print("RETURNED", flush=True)
    sys.stdin.readline()  # the cluster stays for the test's report of its hosts
    """
)


def _hosts_report(state_dir: Path) -> str:
    """The local cluster's hosts as a failure message shows them: each process's state,
    then the end of each log, the controller's included."""
    lines = []
    for pid_file in sorted(state_dir.glob("hosts/*/*.pid")):
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError) as err:
            lines.append(f"{pid_file.relative_to(state_dir)}: unreadable ({err})")
            continue
        lines.append(f"{pid_file.relative_to(state_dir)}: pid {pid}, state {process_state(pid)}")
    for log_path in [state_dir / "controller.log", *sorted(state_dir.glob("hosts/*/*.log"))]:
        lines.append(f"--- {log_path.relative_to(state_dir)} ends:\n{process_tree.log_tail(log_path)}")
    return "\n".join(lines)


def test_sigint_during_a_blocked_call_ends_the_client_and_its_cluster(tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(_BLOCKED_CLIENT)
    client = subprocess.Popen(
        [sys.executable, str(script)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert client.stdout is not None and client.stdin is not None
    out = client.stdout

    def pump() -> None:
        for line in out:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()

    def expect(prefix: str) -> str:
        deadline = time.monotonic() + 120
        seen = []
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            seen.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no {prefix!r} line from the client; it printed:\n{''.join(seen)}")

    stopped: list[int] = []
    try:
        state_dir = Path(expect("STATE").split(None, 1)[1].strip())
        sidecars = sorted((state_dir / "hosts").glob("*/dataflow.pid"))
        assert len(sidecars) == 1, f"one host runs the slice: {_hosts_report(state_dir)}"
        # its sidecar, which answers the put of the next call's input: stopped, the call blocks
        stopped = [int(sidecars[0].read_text())]
        os.kill(stopped[0], signal.SIGSTOP)
        try:
            _eventually(lambda: process_state(stopped[0]) == "T", 10, f"sidecar {stopped[0]} stopped")
            client.stdin.write("go\n")
            client.stdin.flush()
            expect("BLOCKED")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{_hosts_report(state_dir)}") from None
        client.send_signal(signal.SIGINT)
        try:  # a hang guard: on a quiet machine the exit takes about 2 s (stopping the cluster)
            code = client.wait(90)
        except subprocess.TimeoutExpired:
            client.send_signal(signal.SIGUSR1)
            time.sleep(3)
            dump = []
            while not lines.empty():
                dump.append(lines.get())
            raise AssertionError(
                "the client did not exit within 90 s of SIGINT; its threads:\n" + "".join(dump)
            ) from None
        assert code != 0
    finally:
        for pid in stopped:
            if pid_alive(pid):
                os.kill(pid, signal.SIGCONT)
        if client.poll() is None:
            client.kill()
            client.wait(10)


def spawn_detached_children(ctx: object) -> dict[str, list[int]]:
    """An entrypoint that leaves a setsid child and a double-forked daemon running."""
    args = getattr(ctx, "args")
    report = Path(args["report"])
    setsid_child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    daemon_pid = report.with_suffix(".daemon")
    subprocess.run(
        [sys.executable, "-c",
         "import os, sys, time\n"
         "os.setsid()\n"
         "if os.fork(): os._exit(0)\n"
         f"open({str(daemon_pid)!r}, 'w').write(str(os.getpid()))\n"
         "time.sleep(300)\n"],
        check=True, timeout=30,
    )
    deadline = time.monotonic() + 30
    while not daemon_pid.exists() or not daemon_pid.read_text():
        if time.monotonic() > deadline:
            raise RuntimeError("the daemon did not report its pid")
        time.sleep(0.05)
    report.with_suffix(".tmp").write_text(json.dumps([setsid_child.pid, int(daemon_pid.read_text())]))
    report.with_suffix(".tmp").rename(report)
    if args.get("block"):
        time.sleep(300)
    return {"ok": [1]}


def _launch(tmp_path: Path, block: bool) -> DriverLaunch:
    return DriverLaunch(
        namespace="ns", name="detach", uid="0123456789", steps=1, start_step=0, weight=1.0,
        entrypoint="tests.integration.test_process_lifetimes:spawn_detached_children",
        args={"report": str(tmp_path / "children.json"), "block": block}, slices={},
    )


def test_detached_children_of_an_entrypoint_die_when_its_program_ends(tmp_path: Path) -> None:
    supervisor = DriverSupervisor(tmp_path / "state", "127.0.0.1:1")
    launch = _launch(tmp_path, block=False)
    supervisor.start(launch)
    children: list[int] = []
    try:
        _eventually(
            lambda: supervisor.status("ns", "detach", launch.uid).state is DriverState.EXITED,
            120, "the driver finishes",
        )
        status = supervisor.status("ns", "detach", launch.uid)
        assert status.results == {"ok": [1]}, status
        children = json.loads((tmp_path / "children.json").read_text())
        _eventually(lambda: not any(pid_alive(p) for p in children), 30,
                    f"detached children {children} are killed")
    finally:
        supervisor.stop_all()
        _kill_all(children)


def test_detached_children_die_when_a_running_driver_is_stopped(tmp_path: Path) -> None:
    supervisor = DriverSupervisor(tmp_path / "state", "127.0.0.1:1")
    launch = _launch(tmp_path, block=True)
    supervisor.start(launch)
    report = tmp_path / "children.json"
    children: list[int] = []
    try:
        _eventually(report.exists, 120, "the entrypoint started its children")
        children = json.loads(report.read_text())
        supervisor.stop("ns", "detach", launch.uid)
        _eventually(lambda: not any(pid_alive(p) for p in children), 30,
                    f"detached children {children} are killed")
    finally:
        supervisor.stop_all()
        _kill_all(children)
