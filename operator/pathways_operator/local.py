"""`python -m pathways_operator.local`: the embedded cluster's controller.

Islands are sets of local "machines" of `--devices-per-host` devices each;
placed slices become host processes on loopback addresses. The process exits
when its parent (the client that started it) exits, however it ended, taking
its hosts along (`pathways_wire.process_tree`), and removes its `--state-dir`: the
hosts' logs and slice-token files, and the client token it makes at start
(`client.token`, readable by this user only), which the client that started it presents
on every call (`client_gate`).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import threading
from pathlib import Path

from pathways_wire import host_port, process_tree
from pathways_wire.driver_protocol import CLIENT_TOKEN_FILE
from pathways_wire.env_flags import env_option, positive_int
from pathways_wire.slice_token import new_token
from pathways_wire.island_config import check_islands, parse_devices_per_host, parse_islands
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_operator.controller import SHARED_WINDOW, Controller, ControllerService, EmbeddedGangs, controller_server
from pathways_operator.controller.calls_port import CallsPort, calls_port_wanted
from pathways_operator.controller.client_gate import ClientGate, OneClient
from pathways_operator.core.placement import Machine
from pathways_operator.local_hosts import LocalHost, LocalHostLauncher

log = logging.getLogger("pathways_operator.local")


SHUTDOWN_DEADLINE_S = 30.0
"""Longest a shutdown may take before the process exits regardless."""


def island_machines(text: str, per_host: int) -> list[Machine]:
    """The local machines of ``--islands`` (checked as `pw.connect` checks them)."""
    islands = check_islands(parse_islands(text, "--islands"), per_host, f"--islands={text!r}")
    return [
        Machine(f"{name}-m{m}", name, per_host, 0)
        for name, total in islands.items()
        for m in range(total // per_host)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pathways_operator.local")
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--islands", default="island-a:16,island-b:16")
    parser.add_argument("--devices-per-host", type=int, default=4)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--parent-pid", type=int, default=0,
                        help="exit when this process ends (besides the parent link, if given)")
    env_option(
        parser, "--window", variable="PATHWAYS_WINDOW", env=os.environ, type=positive_int, default=256,
        help="grants outstanding per slice while one call has work for it",
    )
    env_option(
        parser, "--shared-window", variable="PATHWAYS_SHARED_WINDOW", env=os.environ, type=positive_int,
        default=SHARED_WINDOW, help="grants outstanding per slice while several calls compete for it",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("PATHWAYS_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        per_host = parse_devices_per_host(args.devices_per_host, "--devices-per-host")
        machines = island_machines(args.islands, per_host)
        calls_port = calls_port_wanted(os.environ)
    except ValueError as err:
        parser.error(str(err))
    process_tree.hold_dir(args.state_dir)  # held to the end: see pathways.embedded
    controller: Controller[EmbeddedGangs] | None = None

    def host_died(host: LocalHost, reason: str) -> None:
        if controller is not None:
            controller.host_failed(host.request.slice_id, host.name, reason)

    launcher = LocalHostLauncher(args.state_dir, host_died)
    controller = Controller.embedded(
        lambda: list(machines), launcher, window=args.window, shared_window=args.shared_window
    )
    client_token = new_token()
    fd = os.open(args.state_dir / CLIENT_TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:  # before the ready file: the client reads it once it sees that
        out.write(client_token)
    gate = ClientGate(OneClient(client_token))
    server = controller_server([gate])
    service = ControllerService(controller)
    pb_grpc.add_ControllerServicer_to_server(service, server)
    port = server.add_insecure_port(args.listen)
    host = host_port.split(args.listen, "--listen")[0]
    if calls_port:
        service.calls_port = CallsPort(service, gate, host).port
    server.start()
    address = host_port.join(host, port)
    if args.ready_file:
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(address)
        tmp.rename(args.ready_file)
    log.info("controller listening on %s with islands %s", address, args.islands)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    process_tree.watch_parent(stop.set)
    while not stop.wait(0.5):
        if args.parent_pid and not process_tree.pid_alive(args.parent_pid):
            log.info("parent %d exited; shutting down", args.parent_pid)
            break
    process_tree.exit_after(
        SHUTDOWN_DEADLINE_S, lambda: shutil.rmtree(args.state_dir, ignore_errors=True)
    )
    try:
        server.stop(grace=1)
        controller.close()
        launcher.close()
    finally:
        shutil.rmtree(args.state_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
