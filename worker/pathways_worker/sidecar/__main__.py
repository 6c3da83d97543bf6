"""`python -m pathways_worker.sidecar`: the `dataflow` container of a Pathways host.

It serves `Dataflow` to the controller (the Control stream), to clients (Put
inputs, Fetch outputs) and to peer sidecars (Put routed values), and keeps one
stream to its own worker. Every call but Health must present the slice's token
(`pathways_worker.slice_auth`). Flags also come from PATHWAYS_* environment
variables (see `pathways_worker.settings`). With port 0 it picks a free port
and prints `pathways-sidecar listening on HOST:PORT`. With `--metrics-port`
(`PATHWAYS_SIDECAR_METRICS_PORT`) it also serves Prometheus `/metrics` on the listen
address (`pathways_worker.sidecar.sidecar_metrics`).

Nothing here imports numpy (the sidecar's modules do) before
`single_threaded_blas` has kept OpenBLAS from starting its threads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent import futures

from pathways_worker.lifecycle import (
    configure_logging, exit_with_parent, keep_freed_memory, single_threaded_blas, wait_for_signal,
)
from pathways_worker.settings import SidecarSettings, parse_sidecar_args

log = logging.getLogger("pathways_worker.sidecar")

# HostProgram messages carry every artifact of a program; Put chunks are
# checked against transfer.MAX_CHUNK_BYTES by the service itself.
CONTROL_MESSAGE_BYTES = 256 << 20


def serve(settings: SidecarSettings) -> None:
    single_threaded_blas()
    keep_freed_memory()
    import grpc

    from pathways_wire import host_port
    from pathways_wire import pathways_pb2_grpc as pb_grpc
    from pathways_wire.session_frames import SessionPort
    from pathways_wire.slice_token import CLIENT_METHODS, ROUTE_METHODS
    from pathways_wire.transfer import MAX_MESSAGE_BYTES
    from pathways_worker.sidecar.dataflow import Dataflow
    from pathways_worker.sidecar.dataflow_service import GRPC_THREADS, ControlFrames, DataflowService
    from pathways_worker.slice_auth import SliceTokenInterceptor

    if settings.insecure_no_token:
        log.warning("sidecar %s: started with --insecure-no-token: any caller that reaches it is served",
                    settings.host_name)
    gate = SliceTokenInterceptor(
        settings.slice_token, settings.host_name, insecure=settings.insecure_no_token,
        client_methods=CLIENT_METHODS,
        route_methods=ROUTE_METHODS,
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=GRPC_THREADS),
        options=[
            ("grpc.max_receive_message_length", CONTROL_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
        interceptors=[gate],
    )
    port = server.add_insecure_port(settings.listen)
    if port == 0:
        raise SystemExit(f"host {settings.host_name}: cannot listen on {settings.listen}")
    listen_host = host_port.split(settings.listen)[0]
    bound = host_port.join(listen_host, port)
    core = Dataflow(settings)
    core.advertise = settings.advertise or bound
    control_port = SessionPort(f"sidecar {settings.host_name}", listen_host,
                               settings.slice_token, ControlFrames(core).serve,
                               insecure=settings.insecure_no_token)
    core.control_port = control_port.port
    pb_grpc.add_DataflowServicer_to_server(DataflowService(core, holds_token=gate.holds_token), server)
    server.start()
    metrics_port = None
    if settings.metrics_port is not None:
        from pathways_worker.sidecar.sidecar_metrics import SidecarMetrics

        metrics = SidecarMetrics(
            settings.host_name, core.transfers, core.budget, lambda: core.link.store_bytes
        )
        metrics_port = metrics.serve(settings.metrics_port, listen_host)
    print(f"pathways-sidecar listening on {bound}", flush=True)  # the first line: launchers read it
    if metrics_port is not None:
        log.info("sidecar %s metrics on http://%s/metrics", settings.host_name, host_port.join(listen_host, metrics_port))
    log.info("sidecar %s serving on %s, worker %s", settings.host_name, bound, settings.worker)
    wait_for_signal()
    server.stop(grace=1).wait(3)
    control_port.close()
    core.close()


def main(argv: Sequence[str] | None = None) -> None:
    configure_logging()
    settings = parse_sidecar_args(argv)
    exit_with_parent(settings.shm_dir)
    serve(settings)


if __name__ == "__main__":
    main()
