"""The test node agent's pure pieces: pod IPs, probe thresholds, options, pod status."""

from __future__ import annotations

from pathlib import Path

import pytest

from pathways_devcluster.node_agent.agent import AgentOptions
from pathways_devcluster.node_agent.containers import Container
from pathways_devcluster.node_agent.ip_pool import IpAllocator
from pathways_devcluster.node_agent.node_registrar import NodeSpec, node_is_ready
from pathways_devcluster.node_agent.pod_status import PodState, PodStatusBuilder
from pathways_devcluster.node_agent.probes import Probe, container_port


def test_pod_ips_are_the_lowest_free_and_reused_once_released() -> None:
    ips = IpAllocator("127.0.3", first=250)
    assert [ips.allocate() for _ in range(3)] == ["127.0.3.250", "127.0.3.251", "127.0.3.252"]
    ips.release("127.0.3.251")
    assert ips.allocate() == "127.0.3.251"
    ips.allocate(), ips.allocate()
    with pytest.raises(RuntimeError, match=r"no free pod IP left in 127\.0\.3\.250-254"):
        ips.allocate()


def test_probe_fails_after_failure_threshold_in_a_row_and_a_success_resets_it() -> None:
    spec = {"failureThreshold": 2, "periodSeconds": 5, "initialDelaySeconds": 3}
    probe = Probe(spec, "liveness", 100.0)
    assert probe.next_at == 103.0
    assert probe.record(False, 103.0) is None
    assert probe.record(True, 108.0) is True
    assert probe.record(False, 113.0) is True, "one failure is under the threshold"
    assert probe.record(False, 118.0) is False
    assert probe.next_at == 123.0


def test_probe_port_by_name_or_number() -> None:
    spec = {"name": "worker", "ports": [{"name": "grpc", "containerPort": 8471}]}
    assert container_port(spec, "grpc") == 8471
    assert container_port(spec, "9000") == 9000
    with pytest.raises(ValueError, match="container worker has no port named 'http'"):
        container_port(spec, "http")


def test_agent_options_read_back_the_command_line_they_write() -> None:
    options = AgentOptions(
        Path("/k/config"), (NodeSpec("a-0", "island-a", 4), NodeSpec("b-0", "island-b", 2)),
        Path("/state"), "127.0.7", 2.5,
    )  # fmt: skip
    assert AgentOptions.parse(options.argv()) == options


def test_a_bad_node_is_refused_naming_the_expected_form(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        AgentOptions.parse(["--kubeconfig", "k", "--state-dir", "s", "--node", "a-0:4"])
    assert "--node 'a-0:4': expected NAME:ISLAND:DEVICES" in capsys.readouterr().err


def test_a_node_is_ready_only_without_the_not_ready_taint() -> None:
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    tainted = {**ready, "spec": {"taints": [{"key": "node.kubernetes.io/not-ready"}]}}
    assert node_is_ready(ready) and not node_is_ready(tainted)


def test_pod_status_names_unready_containers_and_keeps_transition_times() -> None:
    builder = PodStatusBuilder("uid-1", "127.0.0.10", "127.0.0.1")
    main, side = Container({"name": "main"}), Container({"name": "side"})
    state = PodState(phase="Running", initialized=True)
    first = builder.build(state, [main, side], [], {})
    ready = {c["type"]: c for c in first["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "ContainersNotReady"
    assert ready["message"] == "containers with unready status: [main side]"
    assert first["podIP"] == "127.0.0.10" and first["containerStatuses"][0]["name"] == "main"

    again = builder.build(state, [main, side], [], {"conditions": [{"type": "PodScheduled"}]})
    kept = {c["type"]: c for c in again["conditions"]}
    assert "PodScheduled" not in kept, "the scheduler's condition is not written over"
    assert kept["Ready"]["lastTransitionTime"] == ready["lastTransitionTime"]

    done = builder.build(PodState(phase="Succeeded", initialized=True), [main], [], {})
    assert {c["type"]: c for c in done["conditions"]}["Ready"]["reason"] == "PodCompleted"
