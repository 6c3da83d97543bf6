"""A host started with a slice token lets in only callers that hold it; garbage bounces.

One one-host slice (127.0.0.24) whose worker and sidecar read ``PATHWAYS_SLICE_TOKEN``.
Checked: Health is open; every other sidecar method, and the worker's Session, refuse
a caller with no token or another slice's token (UNAUTHENTICATED, naming the metadata
entry); the sidecar itself got into its worker (the worker is ready) and a caller with
the token is served. Then undecodable and oversized messages to the sidecar's methods
are refused and it keeps serving.

Hosts fail closed: a worker or sidecar started with no token, an empty token file (a
Secret without its key) or an unreadable one (a Secret gone) exits non-zero before it
serves, naming itself and what was missing; ``--insecure-no-token`` does not excuse a
named token file.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from pathways_wire import transfer
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.slice_token import (
    ENV_INSECURE,
    ENV_TOKEN,
    ENV_TOKEN_FILE,
    INSECURE_FLAG,
    METADATA_KEY,
    call_metadata,
    client_token,
    new_token,
)
from tests.integration.test_host import HostProcs, slice_with_token, vref

pytestmark = pytest.mark.timeout(120)

TOKEN = new_token()
OTHER_SLICE_TOKEN = new_token()
RPC_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcs]:
    with slice_with_token("guarded", "127.0.0.24", TOKEN, Path(tmp_path_factory.mktemp("guarded"))) as host:
        yield host


def _channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", transfer.MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", 512 << 20),
    ])


def _put(address: str, call_id: str, token: str) -> int:
    chunks = transfer.whole_value_chunks(call_id, vref(-1, 0), np.ones(4, np.float32), "test")
    reply = pb_grpc.DataflowStub(_channel(address)).Put(
        chunks, timeout=RPC_TIMEOUT_S, metadata=call_metadata(token)
    )
    return int(reply.pieces)


def _internal_doors(host: HostProcs, token: str) -> dict[str, Callable[[], object]]:
    """A call, presenting `token`, of each method only the slice token opens: the sidecar's
    Control and Coordinator, and the worker's Session."""
    sidecar = pb_grpc.DataflowStub(_channel(host.address))
    metadata = call_metadata(token)
    return {
        "Control": lambda: list(sidecar.Control(iter([pb.HostCommand()]), timeout=RPC_TIMEOUT_S, metadata=metadata)),
        "Coordinator": lambda: sidecar.Coordinator(pb.CoordinatorRequest(), timeout=RPC_TIMEOUT_S, metadata=metadata),
        "worker Session": lambda: list(pb_grpc.ExecutorStub(_channel(host.worker_address)).Session(
            iter([pb.WorkerCommand()]), timeout=RPC_TIMEOUT_S, metadata=metadata)),
    }


@pytest.mark.parametrize("token", ["", OTHER_SLICE_TOKEN], ids=["no-token", "other-slice-token"])
def test_callers_without_the_slice_token_are_refused(guarded: HostProcs, token: str) -> None:
    sidecar = pb_grpc.DataflowStub(_channel(guarded.address))
    told = sidecar.Health(pb.HealthRequest(), timeout=RPC_TIMEOUT_S, metadata=call_metadata(token))
    assert told.worker_ready and told.host == guarded.name, "Health stays open"
    assert told == pb.HealthReply(host=guarded.name, worker_ready=True), (
        f"Health told a caller without the slice's token more than that the host lives: {told}"
    )
    attempts = {
        "Put": lambda: _put(guarded.address, "intruder", token),
        "Fetch": lambda: list(sidecar.Fetch(pb.FetchRequest(call_id="intruder", value=vref(0, 0)),
                                            timeout=RPC_TIMEOUT_S, metadata=call_metadata(token))),
        **_internal_doors(guarded, token),
    }
    for what, attempt in attempts.items():
        with pytest.raises(grpc.RpcError) as err:
            attempt()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, (what, err.value)
        details = err.value.details() or ""
        assert "refused" in details and guarded.name in details, (what, details)
        if not token:
            assert METADATA_KEY in details, details


def test_the_slice_token_is_let_in(guarded: HostProcs) -> None:
    assert _put(guarded.address, "member", TOKEN) == 1
    sidecar = pb_grpc.DataflowStub(_channel(guarded.address))
    told = sidecar.Health(pb.HealthRequest(), timeout=RPC_TIMEOUT_S, metadata=call_metadata(TOKEN))
    assert told.detailed and told.store_bytes > 0 and told.data_address and told.node and told.shm_device


def test_the_client_token_learns_where_the_data_channel_is(guarded: HostProcs) -> None:
    """A client asks Health where to put its inputs: its token (the client form) is enough."""
    sidecar = pb_grpc.DataflowStub(_channel(guarded.address))
    told = sidecar.Health(pb.HealthRequest(), timeout=RPC_TIMEOUT_S, metadata=call_metadata(client_token(TOKEN)))
    assert told.detailed and told.data_address.rsplit(":", 1)[1].isdigit() and told.node


def test_the_client_token_puts_and_fetches_but_opens_no_host_internal_door(guarded: HostProcs) -> None:
    """What the controller hands clients and route senders (the client form) puts and
    fetches values; the sidecar's Control and Coordinator and the worker's Session, through
    which a program's driver could steer its hosts, want the slice token itself."""
    token = client_token(TOKEN)
    assert _put(guarded.address, "client-put", token) == 1
    sidecar = pb_grpc.DataflowStub(_channel(guarded.address))
    with pytest.raises(grpc.RpcError) as fetched:
        list(sidecar.Fetch(pb.FetchRequest(call_id="never-ran", value=vref(0, 0), timeout_s=0.5),
                           timeout=RPC_TIMEOUT_S, metadata=call_metadata(token)))
    assert fetched.value.code() != grpc.StatusCode.UNAUTHENTICATED, fetched.value
    internal = _internal_doors(guarded, token)
    for what, attempt in internal.items():
        with pytest.raises(grpc.RpcError) as err:
            attempt()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, (what, err.value)
        assert "client token" in (err.value.details() or ""), (what, err.value.details())


def _raw(address: str, method: str, payload: bytes, *, streaming: bool) -> grpc.RpcError:
    channel = _channel(address)
    identity = lambda b: b  # noqa: E731  (bytes on the wire as they are)
    metadata = call_metadata(TOKEN)
    with pytest.raises(grpc.RpcError) as err:
        if streaming:
            call = channel.stream_stream(f"/pathways.v1alpha1.Dataflow/{method}",
                                         request_serializer=identity, response_deserializer=identity)
            list(call(iter([payload]), timeout=RPC_TIMEOUT_S, metadata=metadata))
        else:
            put = channel.stream_unary(f"/pathways.v1alpha1.Dataflow/{method}",
                                       request_serializer=identity, response_deserializer=identity)
            put(iter([payload]), timeout=RPC_TIMEOUT_S, metadata=metadata)
    return err.value


@pytest.mark.parametrize(
    ("method", "payload", "streaming", "codes"),
    [
        ("Put", b"\xff\xff\xff\xff garbage", False, {grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT}),
        ("Put", b"\x0a\xff\xff\xff\xff\x0f", False, {grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT}),
        ("Put", b"\x12" + b"\xff" * 10 + b"\x01", False, {grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT}),
        ("Put", b"\x12\x80\x80\x80\x80\x02" + b"x" * ((300 << 20)), False, {grpc.StatusCode.RESOURCE_EXHAUSTED}),
        ("Control", b"\xff\x00 not a HostCommand", True, {grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT}),
        ("Control", b"\x0a" + b"\x80" * 12, True, {grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT}),
    ],
    ids=["put-garbage", "put-truncated-header", "put-bad-varint", "put-300MiB", "control-garbage",
         "control-overlong-varint"],
)
def test_malformed_and_oversized_messages_bounce(
    guarded: HostProcs, method: str, payload: bytes, streaming: bool, codes: set[grpc.StatusCode]
) -> None:
    refused = _raw(guarded.address, method, payload, streaming=streaming)
    assert refused.code() in codes, refused
    sidecar = pb_grpc.DataflowStub(_channel(guarded.address))
    assert sidecar.Health(pb.HealthRequest(), timeout=RPC_TIMEOUT_S).worker_ready
    assert _put(guarded.address, f"after-{method}", TOKEN) == 1


def test_puts_and_fetches_held_open_are_bounded_and_the_hosts_other_methods_still_answer(
    guarded: HostProcs,
) -> None:
    """A caller with the client token may hold a Put open without sending, or a Fetch
    waiting: each holds one of the sidecar's gRPC threads. Past `MAX_VALUE_STREAMS` such
    calls are refused at once, so Health (and the controller's Control) still find a thread."""
    from pathways_worker.sidecar.dataflow_service import MAX_VALUE_STREAMS

    token = client_token(TOKEN)
    channel = _channel(guarded.address)
    sidecar = pb_grpc.DataflowStub(channel)
    release = threading.Event()

    def stalled() -> Iterator[pb.BufferChunk]:  # a put that never sends a chunk until released
        release.wait(3 * RPC_TIMEOUT_S)
        yield from ()

    held = [sidecar.Put.future(stalled(), timeout=6 * RPC_TIMEOUT_S, metadata=call_metadata(token))
            for _ in range(MAX_VALUE_STREAMS)]
    try:
        deadline = time.monotonic() + RPC_TIMEOUT_S
        refused: grpc.RpcError | None = None
        while refused is None and time.monotonic() < deadline:  # until the held ones all reached it
            try:
                _put(guarded.address, "one-more", token)
                time.sleep(0.05)
            except grpc.RpcError as err:
                refused = err
        assert refused is not None, f"{MAX_VALUE_STREAMS} held puts and still one more was served"
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
        assert "data channel" in (refused.details() or ""), refused.details()
        with pytest.raises(grpc.RpcError) as fetch:
            list(sidecar.Fetch(pb.FetchRequest(call_id="any", value=vref(0, 0)), timeout=RPC_TIMEOUT_S,
                               metadata=call_metadata(token)))
        assert fetch.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, fetch.value
        for _ in range(3):
            assert sidecar.Health(pb.HealthRequest(), timeout=RPC_TIMEOUT_S).worker_ready
    finally:
        release.set()
        for future in held:
            try:
                future.result(timeout=RPC_TIMEOUT_S)
            except grpc.RpcError:
                pass
    assert _put(guarded.address, "after-the-held-ones", token) == 1


# ---------------------------------------------------------------- failing closed

REFUSAL_TIMEOUT_S = 60.0
LONE_IP = "127.0.0.26"


def _start_refused(module: str, flags: list[str], env: dict[str, str], host: str) -> tuple[int, str]:
    """Starts a host process that should refuse; its exit status and stderr.

    Fails at once if it serves instead (prints "listening on"); bounded by REFUSAL_TIMEOUT_S.
    """
    argv = [sys.executable, "-m", module, "--listen", f"{LONE_IP}:0", "--host-name", host, *flags]
    if module.endswith("sidecar"):
        argv += ["--worker", f"{LONE_IP}:1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + REFUSAL_TIMEOUT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.2)
            line = proc.stdout.readline().decode() if ready else ""
            assert "listening on" not in line, f"{module} served without a usable slice token: {line}"
        assert proc.poll() is not None, f"{module} neither served nor exited in {REFUSAL_TIMEOUT_S} s"
        return proc.returncode, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()


def _env_without_token(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_TOKEN, ENV_TOKEN_FILE, ENV_INSECURE, "XLA_FLAGS")}
    return {**env, **extra}


@pytest.mark.parametrize("module", ["pathways_worker.worker", "pathways_worker.sidecar"])
def test_a_host_without_a_slice_token_refuses_to_start(module: str) -> None:
    host = f"lone/{module.rsplit('.', 1)[1]}"
    code, stderr = _start_refused(module, [], _env_without_token(), host)
    assert code != 0, stderr
    assert f"host {host}: refusing to start without a slice token" in stderr, stderr
    assert INSECURE_FLAG in stderr and ENV_TOKEN_FILE in stderr, stderr


@pytest.mark.parametrize("module", ["pathways_worker.worker", "pathways_worker.sidecar"])
@pytest.mark.parametrize("insecure", [False, True], ids=["", "even-with-insecure-flag"])
def test_a_host_whose_token_file_is_empty_refuses_to_start(module: str, insecure: bool, tmp_path: Path) -> None:
    """An empty Secret key mounts as an empty file: never read as "check nothing"."""
    empty = tmp_path / "token"
    empty.write_text("\n")
    host = f"emptied/{module.rsplit('.', 1)[1]}"
    flags = [INSECURE_FLAG] if insecure else []
    code, stderr = _start_refused(module, flags, _env_without_token(**{ENV_TOKEN_FILE: str(empty)}), host)
    assert code != 0, stderr
    assert f"host {host}: refusing to start: the slice token file {empty} ({ENV_TOKEN_FILE}) is empty" in stderr, stderr


def test_a_host_whose_token_file_is_gone_refuses_to_start(tmp_path: Path) -> None:
    gone = tmp_path / "secret" / "token"
    host = "gone/worker"
    flags = ["--slice-token-file", str(gone), INSECURE_FLAG]
    code, stderr = _start_refused("pathways_worker.worker", flags, _env_without_token(), host)
    assert code != 0, stderr
    assert f"host {host}: refusing to start: cannot read the slice token file {gone} (--slice-token-file)" in stderr, stderr
