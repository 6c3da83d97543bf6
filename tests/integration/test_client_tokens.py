"""The embedded controller serves only the client that started it.

At start it makes a client token, in a file of its state directory that only this user
can read; the client presents it on every call. A caller without it is refused with
``UNAUTHENTICATED`` saying which credential is missing, and one with another token too.
"""

from __future__ import annotations

import stat

import grpc
import pytest

import pathways as pw
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.driver_protocol import CLIENT_TOKEN_FILE, CLIENT_TOKEN_METADATA

pytestmark = pytest.mark.timeout(120)


def test_the_embedded_controller_refuses_callers_without_its_client_token(runtime: pw.Runtime) -> None:
    assert runtime.cluster is not None
    token_file = runtime.cluster.state_dir / CLIENT_TOKEN_FILE
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert runtime.describe().islands, "the client that started it is served"
    with grpc.insecure_channel(runtime.address) as channel:
        stub = pb_grpc.ControllerStub(channel)
        with pytest.raises(grpc.RpcError) as missing:
            stub.Describe(pb.ClusterInfoRequest(), timeout=10)
        assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "no client token was presented (gRPC metadata x-pathways-client-token)" in (missing.value.details() or "")
        with pytest.raises(grpc.RpcError) as forged:
            stub.CreateSlice(pb.CreateSliceRequest(spec=pb.VirtualSliceSpec(id="x", devices=4)), timeout=10,
                             metadata=((CLIENT_TOKEN_METADATA, "forged"),))
        assert forged.value.code() == grpc.StatusCode.UNAUTHENTICATED
