"""Flags of ``python -m pathways_operator`` that change admission, read from argv or PATHWAYS_* variables."""

from __future__ import annotations

import pytest

from pathways_operator.__main__ import ANY_PORT, _parser, main


def test_system_priority_classes_are_refused_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PATHWAYS_ALLOW_SYSTEM_PRIORITY_CLASSES", raising=False)
    assert _parser().parse_args([]).allow_system_priority_classes is False
    assert _parser().parse_args(["--allow-system-priority-classes"]).allow_system_priority_classes is True
    monkeypatch.setenv("PATHWAYS_ALLOW_SYSTEM_PRIORITY_CLASSES", "true")
    assert _parser().parse_args([]).allow_system_priority_classes is True
    monkeypatch.setenv("PATHWAYS_ALLOW_SYSTEM_PRIORITY_CLASSES", "false")
    assert _parser().parse_args([]).allow_system_priority_classes is False


def test_a_flag_variable_that_is_not_a_boolean_stops_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATHWAYS_ALLOW_SYSTEM_PRIORITY_CLASSES", "maybe")
    with pytest.raises(SystemExit, match="PATHWAYS_ALLOW_SYSTEM_PRIORITY_CLASSES='maybe': expected true or false"):
        _parser()


def test_malformed_worker_resources_stop_the_operator_naming_the_quantity(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--worker-resources", '{"requests": {"cpu": "lots"}}'])
    assert stopped.value.code == 2
    assert "--worker-resources.requests.cpu: 'lots' is not a Kubernetes quantity" in capsys.readouterr().err


def test_metrics_port_any_asks_for_a_free_port_and_a_bad_one_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PATHWAYS_METRICS_PORT", raising=False)
    assert _parser().parse_args([]).metrics_port == 0
    assert _parser().parse_args(["--metrics-port", "any"]).metrics_port == ANY_PORT
    monkeypatch.setenv("PATHWAYS_METRICS_PORT", "9100")
    assert _parser().parse_args([]).metrics_port == 9100
    with pytest.raises(SystemExit):
        _parser().parse_args(["--metrics-port", "http"])
    assert "--metrics-port: expected a port number, 0 (off) or any, got 'http'" in capsys.readouterr().err


def test_suspend_grace_defaults_to_60_seconds_and_a_bad_one_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PATHWAYS_SUSPEND_GRACE_SECONDS", raising=False)
    assert _parser().parse_args([]).suspend_grace_seconds == 60.0
    assert _parser().parse_args(["--suspend-grace-seconds", "2.5"]).suspend_grace_seconds == 2.5
    monkeypatch.setenv("PATHWAYS_SUSPEND_GRACE_SECONDS", "4")
    assert _parser().parse_args([]).suspend_grace_seconds == 4.0
    with pytest.raises(SystemExit):
        _parser().parse_args(["--suspend-grace-seconds", "0"])
    assert "--suspend-grace-seconds: expected a number of seconds above 0, got '0'" in capsys.readouterr().err


def test_host_network_policy_is_off_by_default_and_needs_where_the_operator_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("PATHWAYS_HOST_NETWORK_POLICY", "POD_NAMESPACE", "PATHWAYS_OPERATOR_POD_LABELS"):
        monkeypatch.delenv(name, raising=False)
    assert _parser().parse_args([]).host_network_policy == "off"
    with pytest.raises(SystemExit) as stopped:
        main(["--host-network-policy", "on"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--host-network-policy=on: the operator's namespace is empty" in err
    assert "--operator-namespace (POD_NAMESPACE)" in err
    monkeypatch.setenv("PATHWAYS_HOST_NETWORK_POLICY", "on")
    monkeypatch.setenv("POD_NAMESPACE", "kube-pathways")
    monkeypatch.setenv("PATHWAYS_OPERATOR_POD_LABELS", '{"app.kubernetes.io/name": "kube-pathways"}')
    args = _parser().parse_args([])
    assert (args.host_network_policy, args.operator_namespace, args.operator_pod_labels) == (
        "on", "kube-pathways", {"app.kubernetes.io/name": "kube-pathways"})
    monkeypatch.setenv("PATHWAYS_HOST_NETWORK_POLICY", "sometimes")
    with pytest.raises(SystemExit):
        _parser().parse_args([])
    assert "choose from 'on', 'off'" in capsys.readouterr().err


def test_leader_election_is_off_by_default_and_needs_the_namespace_of_its_lease(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("PATHWAYS_LEADER_ELECTION", "PATHWAYS_LEADER_ELECTION_LEASE",
                 "PATHWAYS_LEADER_ELECTION_LEASE_SECONDS", "POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    args = _parser().parse_args([])
    assert (args.leader_election, args.leader_election_lease, args.leader_election_lease_seconds) == (
        "off", "kube-pathways-operator", 15.0)
    with pytest.raises(SystemExit) as stopped:
        main(["--leader-election", "on"])
    assert stopped.value.code == 2
    assert "--leader-election=on: give --operator-namespace (POD_NAMESPACE)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        main(["--leader-election", "on", "--operator-namespace", "kp", "--leader-election-lease-seconds", "0.5"])
    assert stopped.value.code == 2
    assert "--leader-election-lease-seconds 0.5: a Lease of 0.5 s is too short to renew (at least 1 s)" in (
        capsys.readouterr().err)
    monkeypatch.setenv("PATHWAYS_LEADER_ELECTION", "on")
    monkeypatch.setenv("PATHWAYS_LEADER_ELECTION_LEASE", "kp-kube-pathways")
    monkeypatch.setenv("PATHWAYS_LEADER_ELECTION_LEASE_SECONDS", "30")
    args = _parser().parse_args([])
    assert (args.leader_election, args.leader_election_lease, args.leader_election_lease_seconds) == (
        "on", "kp-kube-pathways", 30.0)


def test_controller_calls_port_is_off_by_default_and_needs_driver_pods(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PATHWAYS_CONTROLLER_CALLS_PORT", raising=False)
    monkeypatch.delenv("PATHWAYS_DRIVER_RUNTIME", raising=False)
    assert _parser().parse_args([]).controller_calls_port == 0
    assert _parser().parse_args(["--controller-calls-port", "any"]).controller_calls_port == ANY_PORT
    monkeypatch.setenv("PATHWAYS_CONTROLLER_CALLS_PORT", "8471")
    assert _parser().parse_args([]).controller_calls_port == 8471
    with pytest.raises(SystemExit):
        _parser().parse_args(["--controller-calls-port", "70000"])
    assert "--controller-calls-port: expected a port number, 0 (off) or any, got '70000'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        main(["--driver-runtime", "processes"])
    assert stopped.value.code == 2
    assert ("--controller-calls-port: a calls port checks the tokens of driver pods; it needs "
            "--driver-runtime pods (or give 0, off)") in capsys.readouterr().err
