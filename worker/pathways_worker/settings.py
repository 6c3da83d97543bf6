"""Command-line flags and environment of the two host processes.

Every flag has an environment variable so a Kubernetes pod can configure the
containers without a command line; a flag given on the command line wins. This
module imports nothing heavy: the worker must set XLA's flags before jax loads
(`pathways_wire.slice_token` is plain Python).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pathways_wire import host_env, host_port
from pathways_wire.env_flags import env_option
from pathways_wire.slice_token import ENV_INSECURE, INSECURE_FLAG, insecure_allowed, read_token

DEFAULT_INPUT_TIMEOUT_S = 300.0
DEFAULT_WORKER_STORE_LIMIT = 4 << 30
DEFAULT_SIDECAR_STORE_LIMIT = 1 << 30
DEFAULT_PUT_WAIT_S = 120.0


@dataclass(frozen=True)
class WorkerSettings:
    listen: str
    host_index: int
    num_hosts: int
    coordinator: str
    devices: int
    shm_dir: str
    host_name: str
    input_timeout_s: float
    store_limit_bytes: int
    slice_token: str = field(default="", repr=False)
    insecure_no_token: bool = False
    """Started with ``--insecure-no-token`` and no token: callers are not checked."""


@dataclass(frozen=True)
class SidecarSettings:
    listen: str
    worker: str
    shm_dir: str
    host_name: str
    store_limit_bytes: int
    put_wait_s: float
    advertise: str
    data_port: int = 0
    data_token: str = field(default="", repr=False)
    data_channel: bool = True
    file_handover: bool = True
    session_frames: bool = True
    """Talk to the worker over its session port (`pathways_wire.session_frames`) where it offers one."""
    slice_token: str = field(default="", repr=False)
    metrics_port: int | None = None
    """Port of the Prometheus ``/metrics`` endpoint on the listen address; None: not served."""
    insecure_no_token: bool = False
    """Started with ``--insecure-no-token`` and no token: callers are not checked."""


def _default_shm_dir() -> str:
    return f"/dev/shm/pathways-{os.getpid()}"


def _address(flag: str, address: str) -> str:
    """``address`` written as every process writes one (`host_port.join`: an IPv6 host in
    brackets, as a pod's ``$(POD_IP):PORT`` leaves it bare); exits naming the flag when it
    is not HOST:PORT."""
    try:
        return host_port.normalized(address, flag)
    except ValueError as err:
        raise SystemExit(str(err)) from None


def _host_flags(
    p: argparse.ArgumentParser, env: Mapping[str, str], peer: str, store: tuple[str, int, str]
) -> None:
    """The flags both host processes take: their shared memory, their name and their store's
    bound (``store``: its variable, default and meaning)."""
    env_option(p, "--shm-dir", variable=host_env.SHM_DIR, env=env, default="",
               help=f"shared-memory directory shared with the {peer} (PATHWAYS_SHM_DIR)")
    env_option(p, "--host-name", variable=host_env.HOST_NAME, env=env, default="",
               help="name used in errors (PATHWAYS_HOST_NAME)")
    variable, default, meaning = store
    env_option(p, "--store-limit-bytes", variable=variable, env=env, type=int, default=default,
               help=f"{meaning} ({variable})")


def _token_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slice-token-file", default="",
                   help="file holding the slice token callers must present (default: "
                        "$PATHWAYS_SLICE_TOKEN_FILE, else $PATHWAYS_SLICE_TOKEN); without a token "
                        "the host refuses to start")
    p.add_argument(INSECURE_FLAG, action="store_true",
                   help=f"start without a slice token and check no caller (${ENV_INSECURE}=1); "
                        "for a host on one machine that only trusted processes can reach")


def parse_worker_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> WorkerSettings:
    env = os.environ if env is None else env
    p = argparse.ArgumentParser(
        prog="python -m pathways_worker.worker",
        description="A Pathways host's worker: JAX devices, object store and executor.",
    )
    env_option(p, "--listen", variable=host_env.WORKER_LISTEN, env=env, default="127.0.0.1:0",
               help="HOST:PORT to serve Executor on (PATHWAYS_WORKER_LISTEN); port 0 picks one")
    env_option(p, "--host-index", variable=host_env.HOST_INDEX, env=env, type=int, default=0,
               help="this host's process index in its slice (PATHWAYS_HOST_INDEX)")
    env_option(p, "--num-hosts", variable=host_env.NUM_HOSTS, env=env, type=int, default=1,
               help="hosts in the slice (PATHWAYS_NUM_HOSTS)")
    env_option(p, "--coordinator", variable=host_env.COORDINATOR, env=env, default="",
               help="host 0's HOST:PORT for jax.distributed (PATHWAYS_COORDINATOR); hosts after 0 "
                    "started without it are told by their sidecar")
    env_option(p, "--devices", variable=host_env.DEVICES, env=env, type=int, default=1,
               help="JAX CPU devices on this host (PATHWAYS_DEVICES)")
    _host_flags(p, env, "sidecar", ("PATHWAYS_STORE_LIMIT_BYTES", DEFAULT_WORKER_STORE_LIMIT, "object store bound"))
    env_option(p, "--input-timeout-s", variable="PATHWAYS_INPUT_TIMEOUT_S", env=env, type=float,
               default=DEFAULT_INPUT_TIMEOUT_S,
               help="longest wait for a computation's inputs or store space (PATHWAYS_INPUT_TIMEOUT_S)")
    _token_flags(p)
    a = p.parse_args(argv)
    a.listen = _address("--listen", a.listen)
    if a.num_hosts < 1 or not 0 <= a.host_index < a.num_hosts:
        raise SystemExit(f"--host-index {a.host_index} is not in [0, --num-hosts {a.num_hosts})")
    if a.num_hosts > 1 and (a.host_index == 0 or a.coordinator):
        a.coordinator = _address("--coordinator", a.coordinator)
    if a.devices < 1:
        raise SystemExit(f"--devices must be >= 1, got {a.devices}")
    host_name = a.host_name or f"host-{a.host_index} ({a.listen})"
    insecure = insecure_allowed(env, a.insecure_no_token)
    token = read_token(env, a.slice_token_file, host_name, insecure)
    return WorkerSettings(
        listen=a.listen,
        host_index=a.host_index,
        num_hosts=a.num_hosts,
        coordinator=a.coordinator,
        devices=a.devices,
        shm_dir=a.shm_dir or _default_shm_dir(),
        host_name=host_name,
        input_timeout_s=a.input_timeout_s,
        store_limit_bytes=a.store_limit_bytes,
        slice_token=token,
        insecure_no_token=insecure and not token,
    )


def parse_sidecar_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> SidecarSettings:
    env = os.environ if env is None else env
    p = argparse.ArgumentParser(
        prog="python -m pathways_worker.sidecar",
        description="A Pathways host's dataflow sidecar: plans, ordering and transfers.",
    )
    env_option(p, "--listen", variable=host_env.SIDECAR_LISTEN, env=env, default="127.0.0.1:0",
               help="HOST:PORT to serve Dataflow on (PATHWAYS_SIDECAR_LISTEN); port 0 picks one")
    env_option(p, "--worker", variable=host_env.WORKER_ADDRESS, env=env, default="",
               help="the worker's HOST:PORT (PATHWAYS_WORKER_ADDRESS)")
    held = "bound on bytes of incoming values held"
    store = ("PATHWAYS_SIDECAR_STORE_LIMIT_BYTES", DEFAULT_SIDECAR_STORE_LIMIT, held)
    _host_flags(p, env, "worker", store)
    env_option(p, "--put-wait-s", variable="PATHWAYS_SIDECAR_PUT_WAIT_S", env=env, type=float,
               default=DEFAULT_PUT_WAIT_S,
               help="longest wait of a Put for store space (PATHWAYS_SIDECAR_PUT_WAIT_S)")
    env_option(p, "--advertise", variable="PATHWAYS_SIDECAR_ADVERTISE", env=env, default="",
               help="address announced to the controller; default: the listen address")
    env_option(p, "--data-port", variable="PATHWAYS_SIDECAR_DATA_PORT", env=env, type=int, default=0,
               help="port of the raw TCP data channel, on the listen address "
                    "(PATHWAYS_SIDECAR_DATA_PORT); 0 picks one")
    env_option(p, "--data-token", variable="PATHWAYS_SIDECAR_DATA_TOKEN", env=env, default="",
               help="token peers must present on the data channel, and this sidecar presents "
                    "to theirs (PATHWAYS_SIDECAR_DATA_TOKEN); default: the slice token")
    env_option(p, "--data-channel", variable="PATHWAYS_SIDECAR_DATA_CHANNEL", env=env, default="on",
               choices=("on", "off"),
               help="send routed values over peers' data channels; off: gRPC Put only "
                    "(PATHWAYS_SIDECAR_DATA_CHANNEL)")
    env_option(p, "--file-handover", variable="PATHWAYS_SIDECAR_FILE_HANDOVER", env=env, default="on",
               choices=("on", "off"),
               help="hand piece files to peers on the same machine, and take theirs, instead of "
                    "sending bytes; off: neither (PATHWAYS_SIDECAR_FILE_HANDOVER)")
    env_option(p, "--session-frames", variable="PATHWAYS_SIDECAR_SESSION_FRAMES", env=env, default="on",
               choices=("on", "off"),
               help="talk to the worker over the session port it offers (raw TCP frames); off: its "
                    "gRPC session only (PATHWAYS_SIDECAR_SESSION_FRAMES)")
    _token_flags(p)
    env_option(p, "--metrics-port", variable=host_env.SIDECAR_METRICS_PORT, env=env, default="",
               help="serve Prometheus /metrics on this port of the listen address "
                    "(PATHWAYS_SIDECAR_METRICS_PORT); 0 picks one; empty: no metrics")
    a = p.parse_args(argv)
    a.listen = _address("--listen", a.listen)
    a.worker = _address("--worker", a.worker)
    metrics_port = None
    if str(a.metrics_port).strip():
        if not str(a.metrics_port).strip().isdigit() or not 0 <= int(a.metrics_port) < 65536:
            raise SystemExit(
                f"--metrics-port (PATHWAYS_SIDECAR_METRICS_PORT) must be a port in [0, 65535] "
                f"or empty for none, got {a.metrics_port!r}"
            )
        metrics_port = int(a.metrics_port)
    if not 0 <= a.data_port < 65536:
        raise SystemExit(f"--data-port must be in [0, 65535], got {a.data_port}")
    if a.store_limit_bytes < 1:
        raise SystemExit(f"--store-limit-bytes must be >= 1, got {a.store_limit_bytes}")
    host_name = a.host_name or a.listen
    insecure = insecure_allowed(env, a.insecure_no_token)
    token = read_token(env, a.slice_token_file, host_name, insecure)
    return SidecarSettings(
        listen=a.listen,
        worker=a.worker,
        shm_dir=a.shm_dir or _default_shm_dir(),
        host_name=host_name,
        store_limit_bytes=a.store_limit_bytes,
        put_wait_s=a.put_wait_s,
        advertise=_address("--advertise", a.advertise) if a.advertise else "",
        data_port=a.data_port,
        data_token=a.data_token or token,
        data_channel=a.data_channel == "on",
        file_handover=a.file_handover == "on",
        session_frames=a.session_frames == "on",
        slice_token=token,
        metrics_port=metrics_port,
        insecure_no_token=insecure and not token,
    )
