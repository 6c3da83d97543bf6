"""The cluster harness is the real thing: these tests pin down what it provides.

Real API server (versions, validation incl. CEL), real scheduler and controller-manager
(a Deployment gets pods placed and started), and a node agent that behaves like a kubelet
where the project depends on it: env from the downward API, per-pod loopback IPs that
are reachable, exit codes and phases, logs, graceful deletion.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.builders import container, field_env, pod
from tests.cluster.harness import Cluster

TCP_SERVER = (
    "import os, socket\n"
    "s = socket.create_server((os.environ['POD_IP'], 8080))\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(('hello from ' + os.environ['POD_NAME']).encode()); c.close()\n"
)


# -- the API server ----------------------------------------------------------------------------


@pytest.mark.timeout(30, func_only=True)
def test_apiserver_is_ready_and_reports_its_version(cluster: Cluster) -> None:
    cp = cluster.control_plane
    request = urllib.request.Request(
        f"{cp.server}/readyz?verbose", headers={"Authorization": f"Bearer {cp.admin_token}"}
    )
    context = ssl.create_default_context(cafile=str(cp.ca_file))
    with urllib.request.urlopen(request, timeout=10, context=context) as resp:
        body = resp.read().decode()
    assert resp.status == 200 and "readyz check passed" in body

    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert (version["gitVersion"], version["major"], version["minor"]) == ("v1.34.4", "1", "34")
    print(f"start-up seconds: {cluster.startup_seconds}")


@pytest.mark.timeout(60, func_only=True)
def test_crd_schema_minimum_and_cel_transition_rule_are_enforced(
    cluster: Cluster, namespace: str
) -> None:
    ext = cluster.apiextensions
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.harness.test"},
        "spec": {
            "group": "harness.test",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "x": {
                                            "type": "integer",
                                            "minimum": 1,
                                            "x-kubernetes-validations": [
                                                {
                                                    "rule": "self == oldSelf",
                                                    "message": "x is immutable",
                                                }
                                            ],
                                        },
                                        "note": {"type": "string"},
                                    },
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    ext.create_custom_resource_definition(crd)

    def established() -> bool:
        got = ext.read_custom_resource_definition("widgets.harness.test")
        return any(
            c.type == "Established" and c.status == "True" for c in got.status.conditions or []
        )

    cluster.poll(established, timeout=20, what="CRD established")
    custom = cluster.custom

    def widget(x: int, note: str = "") -> dict[str, Any]:
        return {
            "apiVersion": "harness.test/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"x": x, "note": note},
        }

    def create(body: dict[str, Any]) -> Any:
        return custom.create_namespaced_custom_object(
            "harness.test", "v1", namespace, "widgets", body
        )

    with pytest.raises(client.ApiException) as too_small:
        cluster.poll(lambda: create(widget(0)), timeout=10, what="creating a widget")
    assert too_small.value.status == 422 and "spec.x" in str(too_small.value.body)

    cluster.poll(lambda: create(widget(2)), timeout=10, what="creating a widget")
    custom.patch_namespaced_custom_object(
        "harness.test", "v1", namespace, "widgets", "w", {"spec": {"note": "ok"}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    with pytest.raises(client.ApiException) as changed:
        custom.patch_namespaced_custom_object(
            "harness.test", "v1", namespace, "widgets", "w", {"spec": {"x": 3}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
    assert changed.value.status == 422
    assert "spec.x" in str(changed.value.body) and "x is immutable" in str(changed.value.body)
    ext.delete_custom_resource_definition("widgets.harness.test")


# -- nodes ---------------------------------------------------------------------------------------


@pytest.mark.timeout(30, func_only=True)
def test_nodes_are_ready_with_devices_and_island_labels(cluster: Cluster) -> None:
    nodes = {n.metadata.name: n for n in cluster.core.list_node().items}
    expected = {"a-0": "island-a", "a-1": "island-a", "b-0": "island-b", "b-1": "island-b"}
    assert (
        expected.items()
        <= {k: v.metadata.labels.get("pathways.dev/island") for k, v in nodes.items()}.items()
    )
    for name in expected:
        node = nodes[name]
        assert node.status.allocatable["pathways.dev/device"] == "4"
        assert node.status.capacity["pathways.dev/device"] == "4"
        assert {(c.type, c.status) for c in node.status.conditions} >= {("Ready", "True")}
        assert not [t for t in node.spec.taints or [] if t.key == "node.kubernetes.io/not-ready"]
        assert node.metadata.labels["kubernetes.io/hostname"] == name
    lease = cluster.coordination.read_namespaced_lease("a-0", "kube-node-lease")
    assert lease.spec.holder_identity == "a-0"


# -- pods --------------------------------------------------------------------------------------


@pytest.mark.timeout(60, func_only=True)
def test_pod_runs_with_downward_api_env_and_succeeds(cluster: Cluster, namespace: str) -> None:
    script = "import os; print('name=' + os.environ['MY_NAME'], 'ip=' + os.environ['MY_IP'], 'msg=' + os.environ['MSG'])"
    body = pod(
        "hello",
        container(
            "main", "python", "-c", script,
            env=[field_env("MY_NAME", "metadata.name"), field_env("MY_IP", "status.podIP"),
                 {"name": "MSG", "value": "hi-$(MY_NAME)"}],
        ),
    )  # fmt: skip
    cluster.core.create_namespaced_pod(namespace, body)
    done = cluster.wait_pod_phase(namespace, "hello", {"Succeeded", "Failed"})
    status = done.status
    assert status.phase == "Succeeded", status
    assert (
        status.pod_ip.startswith(cluster.agent.pod_subnet + ".") and status.host_ip == "127.0.0.1"
    )
    assert status.start_time is not None
    terminated = status.container_statuses[0].state.terminated
    assert terminated.exit_code == 0 and terminated.reason == "Completed"
    assert done.spec.node_name in {"a-0", "a-1", "b-0", "b-1"}
    log = cluster.container_log(namespace, "hello", "main").read_text()
    assert f"name=hello ip={status.pod_ip} msg=hi-hello" in log


@pytest.mark.timeout(60, func_only=True)
def test_failing_container_fails_the_pod_with_its_exit_code(
    cluster: Cluster, namespace: str
) -> None:
    body = pod("fails", container("main", "python", "-c", "import sys; print('bye'); sys.exit(3)"))
    cluster.core.create_namespaced_pod(namespace, body)
    done = cluster.wait_pod_phase(namespace, "fails", {"Succeeded", "Failed"})
    assert done.status.phase == "Failed"
    terminated = done.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")
    assert "bye" in cluster.container_log(namespace, "fails", "main").read_text()


@pytest.mark.timeout(90, func_only=True)
def test_deployment_pods_get_distinct_reachable_ips(cluster: Cluster, namespace: str) -> None:
    template = pod(
        "web",
        container(
            "server", "python", "-c", TCP_SERVER,
            env=[field_env("POD_IP", "status.podIP"), field_env("POD_NAME", "metadata.name")],
            ports=[8080], readiness_tcp=8080,
        ),
        restart_policy="Always",
    )  # fmt: skip
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }
    cluster.apps.create_namespaced_deployment(namespace, deployment)
    core = cluster.core

    def ready_pods() -> list[Any]:
        pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
        ready = [
            p for p in pods
            if p.status.phase == "Running"
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        ]  # fmt: skip
        return ready if len(ready) == 2 else []

    pods = cluster.poll(ready_pods, timeout=60, what="2 ready web pods")
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == 2 and all(ip.startswith(cluster.agent.pod_subnet + ".") for ip in ips)
    for p in pods:
        with socket.create_connection((p.status.pod_ip, 8080), timeout=5) as conn:
            assert conn.recv(100).decode() == f"hello from {p.metadata.name}"
        assert p.status.container_statuses[0].ready and p.status.container_statuses[0].started
    cluster.poll(
        lambda: cluster.apps.read_namespaced_deployment(namespace=namespace, name="web").status.ready_replicas == 2,
        timeout=30, what="deployment readyReplicas == 2",
    )  # fmt: skip


@pytest.mark.timeout(60, func_only=True)
def test_deleting_a_running_pod_stops_its_process_and_removes_it(
    cluster: Cluster, namespace: str
) -> None:
    script = (
        "import os, time; open(os.environ['PIDFILE'], 'w').write(str(os.getpid())); time.sleep(600)"
    )
    pidfile = cluster.run_dir / f"{namespace}-sleeper.pid"
    body = pod(
        "sleeper",
        container("main", "python", "-c", script, env=[{"name": "PIDFILE", "value": str(pidfile)}]),
    )
    core = cluster.core
    core.create_namespaced_pod(namespace, body)
    cluster.wait_pod_phase(namespace, "sleeper", {"Running"})
    pid = int(
        cluster.poll(
            lambda: pidfile.read_text() if pidfile.exists() else None, timeout=20, what="pid file"
        )
    )
    os.kill(pid, 0)  # running

    core.delete_namespaced_pod("sleeper", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("sleeper", namespace)
            return False
        except client.ApiException as e:
            return bool(e.status == 404)

    cluster.poll(gone, timeout=30, what="pod object deleted")

    def process_dead() -> bool:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True

    cluster.poll(process_dead, timeout=10, what=f"process {pid} terminated")
