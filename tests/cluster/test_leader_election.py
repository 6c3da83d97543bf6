"""With ``--leader-election=on`` only the operator holding the Lease acts.

Two operators are started against one cluster, each with a 3 s Lease. The second
waits, naming the first, and starts nothing (no controller, no handlers) while the
first serves a slice. When someone else writes itself into the Lease, the leader
stops at once (exit status 1) rather than act beside it, and the second takes the
Lease once that writer's hold lapses, and serves. A leader that stops cleanly gives
the Lease back, and the next takes it at once.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest
from kubernetes import client

from tests.cluster.builders import virtual_slice
from tests.cluster.harness import Objects, OperatorProcess

LEASE = "kube-pathways-operator-test"
LEASE_NAMESPACE = "default"
LEASE_S = 3


@pytest.fixture(scope="module")
def operator_args() -> tuple[str, ...]:
    return ("--leader-election", "on", "--operator-namespace", LEASE_NAMESPACE,
            "--leader-election-lease", LEASE, "--leader-election-lease-seconds", str(LEASE_S))


def _log(operator: OperatorProcess) -> str:
    return operator.log_path.read_text(errors="replace")


def _leader(operator: OperatorProcess) -> str:
    found = re.findall(rf"Lease {LEASE_NAMESPACE}/{LEASE} taken by (\S+): this operator leads", _log(operator))
    assert found, f"the operator never led:\n{operator.log_tail()}"
    return str(found[-1])


def _holder(objects: Objects) -> str:
    lease = client.CoordinationV1Api(objects.cluster.api).read_namespaced_lease(LEASE, LEASE_NAMESPACE)
    return str(lease.spec.holder_identity or "") if lease.spec else ""


INTRUDE_TRIES = 10


def _intrude(objects: Objects) -> None:
    """Someone else writes itself into the Lease, as a leader elsewhere would: read, then
    replace at the version read, again where the leader's renewal came in between (409)."""
    api = client.CoordinationV1Api(objects.cluster.api)
    for _ in range(INTRUDE_TRIES):
        lease = api.read_namespaced_lease(LEASE, LEASE_NAMESPACE)
        assert lease.spec is not None
        lease.spec.holder_identity = "intruder"
        lease.spec.renew_time = datetime.datetime.now(datetime.UTC)
        try:
            api.replace_namespaced_lease(LEASE, LEASE_NAMESPACE, lease)
            return
        except client.ApiException as err:
            if err.status != 409:
                raise
    raise AssertionError(f"the Lease changed under each of {INTRUDE_TRIES} writes of the intruder")


@pytest.mark.timeout(300, func_only=True)
def test_only_the_lease_holder_acts_and_a_waiting_operator_takes_over_when_the_lease_is_free(
    objects: Objects, operator: OperatorProcess, tmp_path: Path
) -> None:
    first = _leader(operator)
    assert _holder(objects) == first
    (tmp_path / "second").mkdir()
    second = OperatorProcess(operator.kubeconfig, tmp_path / "second", *operator.extra_args).start(until_live=False)
    try:
        objects.cluster.poll(lambda: f"is held by {first}: waiting" in _log(second), timeout=30, interval=0.2,
                             what="the second operator waiting for the first's Lease")
        objects.apply(virtual_slice("led", 4))
        objects.wait_slice("led", "Ready", 120, operator)
        assert second.alive() and "controller listening" not in _log(second), "the waiting operator started nothing"

        _intrude(objects)
        objects.cluster.poll(lambda: operator.process is not None and operator.process.poll() is not None,
                             timeout=3 * LEASE_S, interval=0.1, what="the leader stopping once another holds its Lease")
        assert operator.process is not None and operator.process.returncode == 1
        assert "this operator stops at once" in _log(operator)
        operator.process = None

        objects.cluster.poll(lambda: "this operator leads" in _log(second), timeout=6 * LEASE_S, interval=0.2,
                             what="the second operator taking the Lease once the intruder's hold lapsed")
        taker = _leader(second)
        assert _holder(objects) == taker != first
        objects.apply(virtual_slice("taken-over", 4))
        objects.wait_slice("taken-over", "Ready", 120, second)
        led = objects.get("virtualslices", "led")
        assert led is not None and led["status"]["phase"] == "Ready"
    finally:
        second.close()
    assert f"Lease {LEASE_NAMESPACE}/{LEASE} given back" in _log(second)
    assert _holder(objects) == ""

    before = len(_log(operator))
    operator.start()
    assert _holder(objects) == _leader(operator) != first
    assert "waiting until it is given back" not in _log(operator)[before:], "a given-back Lease is taken at once"
