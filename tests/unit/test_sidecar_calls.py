"""How the operator quotes a failed sidecar call and asks every sidecar of a gang."""

from __future__ import annotations

import threading

import grpc

from pathways_operator.k8s.sidecar_health import each_sidecar, rpc_failure


class Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_a_failed_call_is_quoted_by_its_code_and_details() -> None:
    assert rpc_failure(Failed(grpc.StatusCode.UNAVAILABLE, "connect refused")) == "UNAVAILABLE: connect refused"
    assert rpc_failure(Failed(grpc.StatusCode.DEADLINE_EXCEEDED, "")) == "DEADLINE_EXCEEDED"
    assert rpc_failure(grpc.RpcError()) == "ERROR", "an error without a status still says something"


def test_every_sidecar_is_asked_at_once_and_answers_come_back_in_order() -> None:
    addresses = [f"10.0.0.{i}:8478" for i in range(6)]
    arrived = threading.Barrier(len(addresses), timeout=10)

    def ask(address: str) -> str:
        arrived.wait()  # returns only once every address is being asked at the same time
        return f"asked {address}"

    assert each_sidecar(ask, addresses) == [f"asked {a}" for a in addresses]
    assert each_sidecar(ask, []) == []
