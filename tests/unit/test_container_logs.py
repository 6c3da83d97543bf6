"""The node agent's container-log endpoint, its pure pieces: the request, the run, the tail."""

from __future__ import annotations

import pytest

from pathways_devcluster.node_agent.container_logs import (
    LogRequest,
    LogRequestError,
    chosen_run,
    common_names,
    parse_log_request,
    tail,
)


def test_a_request_says_the_container_and_what_kubectl_logs_asks() -> None:
    assert parse_log_request("/containerLogs/team-a/lm-0/worker?tailLines=20&follow=true&timestamps=true") == (
        LogRequest("team-a", "lm-0", "worker", tail_lines=20, follow=True)
    )
    assert parse_log_request("/containerLogs/ns/p/c?previous=true&limitBytes=100") == (
        LogRequest("ns", "p", "c", limit_bytes=100, previous=True)
    )


@pytest.mark.parametrize(
    ("target", "status", "says"),
    [
        ("/pods", 404, "this node serves only /containerLogs/<namespace>/<pod>/<container>"),
        ("/containerLogs/ns/p", 404, "serves only"),
        ("/containerLogs/ns/../c", 400, "pod '..' is not a Kubernetes object name"),
        ("/containerLogs/ns/p/%2e%2e%2fx", 400, "container '../x' is not"),
        ("/containerLogs/ns/p/c?tailLines=-1", 400, "query tailLines='-1': expected an integer of at least 0"),
        ("/containerLogs/ns/p/c?limitBytes=0", 400, "limitBytes='0'"),
        ("/containerLogs/ns/p/c?follow=maybe", 400, "query follow='maybe': expected true or false"),
    ],
)
def test_a_request_for_anything_else_is_refused_saying_why(target: str, status: int, says: str) -> None:
    with pytest.raises(LogRequestError) as refused:
        parse_log_request(target)
    assert refused.value.status == status
    assert says in str(refused.value)


def test_the_current_run_is_the_highest_restart_and_previous_the_one_before() -> None:
    names = ["worker.log", "worker.log.2", "worker.log.1", "worker.pid", "dataflow.log", "worker.logger"]
    assert chosen_run(names, "worker", previous=False) == "worker.log.2"
    assert chosen_run(names, "worker", previous=True) == "worker.log.1"
    assert chosen_run(names, "dataflow", previous=False) == "dataflow.log"
    assert chosen_run(names, "dataflow", previous=True) is None
    assert chosen_run(names, "driver", previous=False) is None


@pytest.mark.parametrize(
    ("data", "lines", "want"),
    [(b"a\nb\nc\n", 2, b"b\nc\n"), (b"a\nb\nc", 2, b"b\nc"), (b"a\nb\n", 5, b"a\nb\n"), (b"a\n", 0, b""),
     (b"", 3, b"")],
)
def test_tail_keeps_the_last_lines(data: bytes, lines: int, want: bytes) -> None:
    assert tail(data, lines) == want


def test_only_the_api_servers_certificate_names_its_client() -> None:
    apiserver = {"subject": ((("organizationName", "system:masters"),), (("commonName", "kube-apiserver-kubelet-client"),))}
    assert common_names(apiserver) == ["kube-apiserver-kubelet-client"]
    assert common_names({"subject": ((("commonName", "kube-apiserver"),),)}) == ["kube-apiserver"]
    assert common_names(None) == [] and common_names({}) == []
