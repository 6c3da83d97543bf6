"""The embedded runtime wires each slice's token end to end, and a stranger is refused.

Two slices on two islands run a program that sends a value from one to the other and
puts and fetches values too large to travel inline: the controller gave the client
each slice's token, put the receiving slice's token on the route, and started the
hosts with their own. Then, at a host of the receiving slice, a caller with no token
and a caller holding the *other* slice's token (a pod of another slice) are refused
with ``UNAUTHENTICATED`` naming the host, while its own token is let in; ``Describe``
shows no tokens to anyone.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

import pathways as pw
from pathways_wire import transfer
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.slice_token import call_metadata
from tests.integration.two_islands import cross_island_move

pytestmark = pytest.mark.timeout(300)


def _put(address: str, token: str) -> int:
    with grpc.insecure_channel(address) as channel:
        chunks = transfer.whole_value_chunks(
            "intruder", pb.ValueRef(node=-1, index=0), np.ones(4, np.float32), "stranger"
        )
        reply = pb_grpc.DataflowStub(channel).Put(chunks, timeout=10, metadata=call_metadata(token))
        return int(reply.pieces)


def test_tokens_flow_end_to_end_and_other_slices_are_refused(runtime: pw.Runtime) -> None:
    left, right, move = cross_island_move(4, 4)

    x = np.arange(256 * 128, dtype=np.float32).reshape(256, 128)  # 128 KiB: Put and Fetch
    np.testing.assert_allclose(move(x), x * 3.0 + 1.0)

    left_info, right_info = runtime.bind(left.decl()), runtime.bind(right.decl())
    assert left_info.token and right_info.token and left_info.token != right_info.token
    assert not any(s.token for s in runtime.describe().slices), "Describe must not hand out tokens"

    target = right_info.hosts[0].address
    for token, why in (("", "presented no x-pathways-slice-token"), (left_info.token, "another slice's")):
        with pytest.raises(grpc.RpcError) as refused:
            _put(target, token)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        details = refused.value.details() or ""
        assert "host " in details and "Put refused" in details and why in details, details
    assert _put(target, right_info.token) == 1, "the slice's own token is let in"
