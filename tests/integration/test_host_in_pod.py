"""A multi-host slice's workers start in a pod's environment: Kubernetes variables set,
no service account mounted (host pods set ``automountServiceAccountToken: false``).

JAX's `jax.distributed.initialize` probes for a Kubernetes cluster whenever
``KUBERNETES_SERVICE_HOST`` is set, even with every parameter given: it imports the
kubernetes client and loads an in-cluster config, which fails without a mounted token.
The workers must form their JAX job from their flags alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pathways_wire import pathways_pb2 as pb

from tests.integration.test_host import health, start_slice, stop_hosts

pytestmark = pytest.mark.timeout(180)

POD_ENV = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}


def test_two_host_slice_forms_its_jax_job_with_kubernetes_variables_and_no_service_account(
    tmp_path: Path,
) -> None:
    hosts = start_slice("in-pod", ["127.0.0.27", "127.0.0.28"], 2, tmp_path, worker_env=POD_ENV)
    try:
        replies: list[pb.HealthReply] = [health(host.address) for host in hosts]
        assert [reply.worker_ready for reply in replies] == [True, True]
        for host in hosts:
            log = host.logs[0].read_text()
            assert "ready with" in log, log[-2000:]
            assert "Kubernetes" not in log, log[-2000:]
    finally:
        stop_hosts(hosts)
