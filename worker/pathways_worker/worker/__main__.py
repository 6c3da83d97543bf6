"""`python -m pathways_worker.worker`: the `worker` container of a Pathways host.

It owns the host's JAX devices (`--devices` CPU devices standing in for a TPU
host's chips), joins its slice's multi-process JAX job when the slice has
several hosts, and serves `Executor.Session` to its sidecar: one long-lived
stream of commands in (programs, launches, grants, arrivals, fetches) and
batched events out; only callers presenting the slice's token get in. Flags
also come from PATHWAYS_* environment variables (see `pathways_worker.settings`).

XLA reads its flags when jax is imported, so nothing here imports jax (or the
client package, which does) before `_prepare_jax` has set them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from concurrent import futures

from pathways_wire import host_env, host_port
from pathways_wire.port_probe import accepts
from pathways_worker import coordinator_file
from pathways_worker.lifecycle import (
    configure_logging, exit_with_parent, keep_freed_memory, single_threaded_blas, wait_for_signal,
)
from pathways_worker.settings import WorkerSettings, parse_worker_args

log = logging.getLogger("pathways_worker.worker")

SESSION_MESSAGE_BYTES = 256 << 20  # programs carry their artifacts
COORDINATOR_POLL_S = 0.02
COORDINATOR_WAIT_S = 120.0


def _await_coordinator(address: str, within_s: float = COORDINATOR_WAIT_S) -> None:
    """Return once host 0's coordination service accepts connections (or ``within_s`` passed).

    Every host imports jax at the same time, and host 0 starts serving only when
    its own import is done; a host that reaches `jax.distributed.initialize` first
    would meet a refused connection, and gRPC retries it only after its one-second
    reconnect backoff. A TCP probe every `COORDINATOR_POLL_S` joins as soon as the
    coordinator listens. After ``within_s`` it goes on, and JAX's own timeout decides.
    """
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not accepts(address):
        time.sleep(COORDINATOR_POLL_S)


def _coordinator_from_sidecar(settings: WorkerSettings, within_s: float = COORDINATOR_WAIT_S) -> str:
    """Host 0's coordinator address, for a host started without one: its sidecar writes it
    once the operator has told it (`pathways_worker.coordinator_file`)."""
    address = coordinator_file.wait_for(settings.shm_dir, within_s)
    if address is None:
        raise SystemExit(
            f"host {settings.host_name}: started without --coordinator ({host_env.COORDINATOR}), and its "
            f"sidecar was not given the slice's JAX coordinator address within {within_s:g} s "
            f"(it writes it to {coordinator_file.path_in(settings.shm_dir)})"
        )
    log.info("host %s: JAX coordinator %s, from the sidecar", settings.host_name, address)
    return address


def _prepare_jax(settings: WorkerSettings) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    device_flag = f"--xla_force_host_platform_device_count={settings.devices}"
    os.environ["XLA_FLAGS"] = " ".join(
        [f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count")]
        + [device_flag]
    )
    os.environ["JAX_PLATFORMS"] = "cpu"
    single_threaded_blas()
    keep_freed_memory()
    import jax

    if settings.num_hosts > 1:
        coordinator = settings.coordinator
        if settings.host_index > 0:
            coordinator = coordinator or _coordinator_from_sidecar(settings)
            _await_coordinator(coordinator)
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=settings.num_hosts,
            process_id=settings.host_index,
            # Host 0 serves the job's coordination service on its own address only: on
            # [::] (the default) a terminating gang's host 0 and its replacement would
            # share the port (SO_REUSEPORT) and a host could join the wrong job.
            coordinator_bind_address=coordinator if settings.host_index == 0 else None,
            # Every parameter is given, but in a pod (KUBERNETES_SERVICE_HOST set) JAX would
            # still probe its Kubernetes cluster environment: import the whole kubernetes
            # client (about 0.65 s of CPU per host, before host 0 even starts the service)
            # and load an in-cluster config that host pods do not mount.
            cluster_detection_method="deactivate",
        )
    expected = settings.devices * settings.num_hosts
    if len(jax.devices()) != expected:
        raise SystemExit(
            f"host {settings.host_name}: JAX sees {len(jax.devices())} devices, expected "
            f"{settings.devices} x {settings.num_hosts} hosts = {expected}"
        )


def serve(settings: WorkerSettings) -> None:
    _prepare_jax(settings)
    import grpc

    from pathways_wire import pathways_pb2_grpc as pb_grpc
    from pathways_worker.worker.executor import Executor
    from pathways_wire.session_frames import SessionPort
    from pathways_worker.worker.executor_service import ExecutorService, SessionFrames
    from pathways_worker.shared_memory import ShmDir
    from pathways_worker.slice_auth import SliceTokenInterceptor

    shm = ShmDir(settings.shm_dir, "w")
    executor = Executor(
        host_name=settings.host_name,
        host_index=settings.host_index,
        shm=shm,
        store_limit_bytes=settings.store_limit_bytes,
        input_timeout_s=settings.input_timeout_s,
    )
    options = [
        ("grpc.max_send_message_length", SESSION_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", SESSION_MESSAGE_BYTES),
    ]
    if settings.insecure_no_token:
        log.warning("worker %s: started with --insecure-no-token: any caller that reaches it is served",
                    settings.host_name)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=options,
        interceptors=[SliceTokenInterceptor(
            settings.slice_token, settings.host_name, insecure=settings.insecure_no_token
        )],
    )
    service = ExecutorService(executor, settings.host_name)
    pb_grpc.add_ExecutorServicer_to_server(service, server)
    port = server.add_insecure_port(settings.listen)
    if port == 0:
        raise SystemExit(f"host {settings.host_name}: cannot listen on {settings.listen}")
    bind_host = host_port.split(settings.listen)[0]
    session_port = SessionPort(f"worker {settings.host_name}", bind_host, settings.slice_token,
                               SessionFrames(service).serve, insecure=settings.insecure_no_token)
    service.session_port = session_port.port
    server.start()
    print(f"pathways-worker listening on {host_port.join(bind_host, port)}", flush=True)
    log.info("worker %s ready with %s", settings.host_name, settings)
    wait_for_signal()
    server.stop(grace=1).wait(3)
    session_port.close()
    executor.stop()
    shm.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    configure_logging()
    settings = parse_worker_args(argv)
    exit_with_parent(settings.shm_dir)
    serve(settings)


if __name__ == "__main__":
    main()
