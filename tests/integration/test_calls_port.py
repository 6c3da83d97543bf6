"""The controller's calls port: a client's `Run`, `WaitCall` and `FinishCall` as frames over raw TCP.

The embedded controller names its calls port in `Describe`; a runtime's calls then
take it, and every request there passes the same gate as a gRPC call: the hello must
carry the client token, and a request the controller refuses is refused with the same
status and words it has over gRPC. With ``PATHWAYS_CALLS_PORT=off`` the controller
opens none and its clients call over gRPC.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import grpc
import jax.numpy as jnp
import numpy as np
import pytest

import pathways as pw
from pathways.calls_link import CallsLink, CallsPortError
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire import session_frames as frames
from pathways_wire.driver_protocol import CLIENT_TOKEN_METADATA
from tests.integration.hello_floods import held_past_the_bound, wait_until

pytestmark = pytest.mark.timeout(180)


def _port_of(runtime: pw.Runtime) -> tuple[str, int]:
    host = runtime.address.rpartition(":")[0]
    return host, int(runtime.describe().calls_port)


def test_a_runtimes_calls_take_the_calls_port(runtime: pw.Runtime) -> None:
    assert _port_of(runtime)[1] > 0, "the embedded controller names its calls port in Describe"
    s = pw.make_virtual_device_set().add_slice(devices=4)
    double = pw.jit(lambda v: v * 2.0, slice=s)

    @pw.program(name="calls-port-small")
    def small(v: Any) -> Any:
        return double(v)

    @pw.program(name="calls-port-big")
    def big(v: Any) -> Any:
        return double(v)

    link = runtime.calls_port
    assert link is not None
    before = link.answered
    np.testing.assert_allclose(np.asarray(small(np.arange(4, dtype=np.float32))), np.arange(4) * 2.0)
    x = np.ones((512, 512), np.float32)  # over the inline bound: Run, then WaitCall
    np.testing.assert_allclose(np.asarray(big(x)), x * 2.0)
    assert link.answered - before >= 3, "a small call's Run, a big call's Run and WaitCall were answered there"


def test_the_calls_port_closes_a_hello_without_the_client_token(runtime: pw.Runtime) -> None:
    host, port = _port_of(runtime)
    for token in ("", "forged"):
        with pytest.raises((ConnectionError, OSError)):
            frames.connect(host, port, token, pb.ControllerAnswer())
    link = runtime.calls_port  # the runtime's own link is not disturbed
    assert link is not None
    status = link.WaitCall(pb.CallStatusRequest(call_id="no-such-call", timeout_s=0), timeout=10)
    assert status.state == pb.CallStatus.UNKNOWN and "not known" in status.message


def test_a_request_is_refused_as_over_grpc(runtime: pw.Runtime) -> None:
    assert runtime.cluster is not None
    host, port = _port_of(runtime)
    token = runtime.cluster.client_token
    request = pb.RunRequest(program_id="no-such-program", call_id="c-1", client=runtime.client_id)
    link = CallsLink(host, port, token, "")
    try:
        with pytest.raises(CallsPortError) as on_port:
            link.Run(request, timeout=10)
        with pytest.raises(CallsPortError) as other:
            link.call("Describe", pb.ClusterInfoRequest(), timeout=10)
    finally:
        link.close()
    with grpc.insecure_channel(runtime.address) as channel:
        with pytest.raises(grpc.RpcError) as on_grpc:
            pb_grpc.ControllerStub(channel).Run(request, timeout=10, metadata=((CLIENT_TOKEN_METADATA, token),))
    assert on_port.value.code() == on_grpc.value.code() == grpc.StatusCode.NOT_FOUND
    assert on_port.value.details() == on_grpc.value.details()
    assert "no-such-program" in on_port.value.details()
    assert other.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "'Describe'" in other.value.details()


def test_a_link_that_cannot_connect_while_the_port_is_flooded_calls_over_grpc(runtime: pw.Runtime) -> None:
    """A flood of connections that never say their hello holds every place the port has for
    one, so it closes a new connection unanswered: a link that has to connect then sends
    its request to the controller's gRPC service, and uses the port again once the flood
    has passed. Without a fallback the request fails UNAVAILABLE, having sent nothing."""
    assert runtime.cluster is not None
    host, port = _port_of(runtime)
    token = runtime.cluster.client_token
    unknown = pb.CallStatusRequest(call_id="no-such-call", timeout_s=0)
    with_fallback = CallsLink(host, port, token, "", fallback=runtime.controller)
    without = CallsLink(host, port, token, "")
    try:
        with held_past_the_bound((host, port)):
            status = with_fallback.WaitCall(unknown, timeout=10)
            assert status.state == pb.CallStatus.UNKNOWN and "not known" in status.message
            waited = with_fallback.WaitCall.future(unknown, timeout=10).result(timeout=20)
            assert waited.state == pb.CallStatus.UNKNOWN
            assert with_fallback.answered == 0, "answered on the calls port, not over gRPC"
            with pytest.raises(CallsPortError) as refused:
                without.WaitCall(unknown, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        wait_until(lambda: with_fallback.fallback_for("WaitCall") is None, "the calls port serving again")
        assert with_fallback.WaitCall(unknown, timeout=10).state == pb.CallStatus.UNKNOWN
        assert with_fallback.answered == 1
    finally:
        with_fallback.close()
        without.close()


OFF_CLIENT = """
import json, numpy as np, pathways as pw
rt = pw.connect(islands={"island-a": 4}, devices_per_host=4)
s = pw.make_virtual_device_set().add_slice(devices=4)
add = pw.jit(lambda v: v + 1.0, slice=s)

@pw.program(name="calls-port-off")
def prog(v):
    return add(v)

out = np.asarray(prog(np.zeros(4, np.float32)))
print(json.dumps({"port": rt.describe().calls_port, "link": rt.calls_port is not None, "out": out.tolist()}))
pw.shutdown()
"""


def test_with_the_calls_port_off_calls_go_over_grpc() -> None:
    env = dict(os.environ, PATHWAYS_CALLS_PORT="off")
    env.pop("PATHWAYS_CONTROLLER", None)
    done = subprocess.run([sys.executable, "-c", OFF_CLIENT], env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"port": 0, "link": False, "out": [1.0, 1.0, 1.0, 1.0]}


CHAINED_SMALL_CALLS = """
import json, jax, jax.numpy as jnp, numpy as np, pathways as pw
rt = pw.connect(islands={"island-a": 4}, devices_per_host=4)
s = pw.make_virtual_device_set().add_slice(devices=4)

def slow_add(v):
    busy = jax.lax.fori_loop(0, 200, lambda _, m: jnp.tanh(m) * 0.5, jnp.ones((64, 64)))
    return v + 1.0 + 0.0 * busy[0, 0]

add = pw.jit(slow_add, slice=s)

@pw.program(name="chained-small-calls")
def prog(v):
    return add(v)

ends = []
for _ in range(120):
    v = np.zeros(4, np.float32)
    for _ in range(20):
        v = prog(v)  # a small call: its handle is a future of an answer that comes as it ends
    ends.append(np.asarray(v).tolist())
print(json.dumps({"link": rt.calls_port is not None, "ends": ends}))
pw.shutdown()
"""


@pytest.mark.parametrize("switch", ["off", "on"])
def test_a_call_given_a_small_calls_handle_before_its_answer_finds_its_object(switch: str) -> None:
    """Each call names the output of the small call before it, whose answer has not come.
    Over gRPC the two `Run`s are served on threads of their own, in either order: there the
    later call waits for the answer and sends its value; on the calls port the controller
    takes them in order, and the object is named."""
    env = dict(os.environ, PATHWAYS_CALLS_PORT=switch)
    env.pop("PATHWAYS_CONTROLLER", None)
    done = subprocess.run([sys.executable, "-c", CHAINED_SMALL_CALLS], env=env, capture_output=True, text=True,
                          timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"link": switch == "on", "ends": [[20.0] * 4] * 120}


def test_a_bad_switch_stops_the_controller_naming_it() -> None:
    env = dict(os.environ, PATHWAYS_CALLS_PORT="maybe")
    env.pop("PATHWAYS_CONTROLLER", None)
    client = "import pathways as pw; pw.connect(islands={'island-a': 4}, devices_per_host=4)"
    done = subprocess.run([sys.executable, "-c", client], env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode != 0
    assert "PATHWAYS_CALLS_PORT='maybe' is neither on nor off" in done.stderr


def test_a_client_that_cannot_reach_the_calls_port_calls_over_grpc(
    runtime: pw.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(link: CallsLink) -> None:
        raise ConnectionRefusedError(f"{link.address} is behind a Service that does not expose it")

    monkeypatch.setattr(CallsLink, "connect", unreachable)
    rt = pw.Runtime(runtime.address, runtime.cluster)
    try:
        assert rt.describe().calls_port > 0, "the controller names one"
        assert rt.calls_port is None, "but this client uses gRPC"
        s = pw.make_virtual_device_set().add_slice(devices=4)
        add = pw.jit(lambda v: v + 1.0, slice=s)

        @pw.program(name="calls-port-unreachable")
        def prog(v: Any) -> Any:
            return add(v)

        x = np.zeros(4, np.float32)
        traced = prog.trace(x)
        (out,) = rt.run(traced.ir, traced.flat_inputs([x]))
        np.testing.assert_allclose(np.asarray(out), np.ones(4))
    finally:
        rt.cluster = None  # the module's runtime owns the cluster
        rt.close()


def test_waits_over_grpc_are_bounded_per_client_and_the_controller_keeps_answering(runtime: pw.Runtime) -> None:
    """Each `WaitCall` over gRPC holds a controller thread until its call ends: one client
    may hold `WAITS_PER_CLIENT` at once, past that a wait is refused at once, and the
    controller's other methods still answer."""
    import jax

    from pathways_operator.controller.client_gate import WAITS_PER_CLIENT

    assert runtime.cluster is not None
    s = pw.make_virtual_device_set().add_slice(devices=1)
    slow = pw.jit(lambda v: jax.lax.fori_loop(0, 8000, lambda i, w: jnp.tanh(w @ w), v), slice=s)

    @pw.program(name="waits-bounded")
    def prog(v: Any) -> Any:
        return slow(v)

    x = np.eye(256, dtype=np.float32) * 0.5
    prog(x).block_until_ready()  # placed and compiled
    out = prog(x)
    assert out.call is not None
    request = pb.CallStatusRequest(call_id=out.call.call_id, timeout_s=60)
    metadata = ((CLIENT_TOKEN_METADATA, runtime.cluster.client_token),)
    with grpc.insecure_channel(runtime.address) as channel:
        stub = pb_grpc.ControllerStub(channel)
        held = [stub.WaitCall.future(request, timeout=90, metadata=metadata) for _ in range(WAITS_PER_CLIENT)]
        refused: grpc.RpcError | None = None
        for _ in range(200):  # until every held wait reached the controller: 10 s at most
            try:
                probe = stub.WaitCall(pb.CallStatusRequest(call_id=request.call_id, timeout_s=0), timeout=10,
                                      metadata=metadata)
            except grpc.RpcError as err:
                refused = err
                break
            assert probe.state == pb.CallStatus.RUNNING, "the slow call ended before the waits were all held"
            time.sleep(0.05)
        assert refused is not None, f"{WAITS_PER_CLIENT} waits held and still one more was let in"
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
        assert "calls port" in (refused.details() or ""), refused.details()
        assert stub.Describe(pb.ClusterInfoRequest(), timeout=10, metadata=metadata).calls_port > 0
        ended = [future.result(timeout=90) for future in held]
    # each held wait ended with the call: as succeeded, or, woken after the runtime's own wait freed
    # the call, as a call no longer known
    assert {status.state for status in ended} <= {pb.CallStatus.SUCCEEDED, pb.CallStatus.UNKNOWN}, ended[:2]
    out.block_until_ready()
