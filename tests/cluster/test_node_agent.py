"""The node agent keeps the kubelet contract that the operator and workers rely on.

In-cluster clients authenticate with the projected service-account token and verify
the API server with the published CA; volumes appear at their mountPath (mount
namespace) or through rewritten paths (fallback); init containers run first and
restarts follow ``restartPolicy``; extra agents serve extra islands on their own IPs;
an API server restart does not lose the agent; and a volume on an ancestor of the
container's interpreter (the chart's emptyDir on ``/tmp`` for a checkout under ``/tmp``)
does not hide it. Pod logs come through the API server, as from a kubelet, and only the
API server is given them.
"""

from __future__ import annotations

import socket
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.builders import (
    configmap,
    configmap_volume,
    container,
    empty_dir_volume,
    field_env,
    pod,
    value_env,
)
from tests.cluster.harness import Cluster

IN_CLUSTER_WHOAMI = (
    "from kubernetes import client, config\n"
    "config.load_incluster_config()\n"
    "review = client.AuthenticationV1Api().create_self_subject_review("
    "{'apiVersion': 'authentication.k8s.io/v1', 'kind': 'SelfSubjectReview'})\n"
    "print('user=' + review.status.user_info.username)\n"
    "print('greeting=' + open('/etc/harness-config/greeting').read())\n"
)


def greeting_config(cluster: Cluster, namespace: str) -> Any:
    """Creates the ConfigMap ``harness`` (greeting: hello) that pods mount; returns the core API."""
    core = cluster.core
    core.create_namespaced_config_map(namespace, configmap("harness", {"greeting": "hello"}))
    return core


@pytest.mark.timeout(60, func_only=True)
def test_in_cluster_client_uses_projected_token_and_sees_config_volume(
    cluster: Cluster, namespace: str
) -> None:
    core = greeting_config(cluster, namespace)
    body = pod(
        "whoami",
        container(
            "main", "python", "-c", IN_CLUSTER_WHOAMI, mounts={"config": "/etc/harness-config"}
        ),
        volumes=[configmap_volume("config", "harness")],
    )
    core.create_namespaced_pod(namespace, body)
    done = cluster.wait_pod_phase(namespace, "whoami", {"Succeeded", "Failed"}, timeout=45)
    log = cluster.container_log(namespace, "whoami", "main").read_text()
    assert done.status.phase == "Succeeded", log
    assert f"user=system:serviceaccount:{namespace}:default" in log
    assert "greeting=hello" in log


RESTART_ONCE = (
    "import sys\n"
    "path = '/scratch/trace'\n"
    "open(path, 'a').write('b')\n"
    "trace = open(path).read()\n"
    "print('trace=' + trace)\n"
    "sys.exit(1 if trace == 'ab' else 0)\n"
)


@pytest.mark.timeout(60, func_only=True)
def test_init_container_runs_first_and_on_failure_restarts(
    cluster: Cluster, namespace: str
) -> None:
    body = pod(
        "restarts",
        container("main", "python", "-c", RESTART_ONCE, mounts={"scratch": "/scratch"}),
        init_containers=[
            container(
                "init",
                "python",
                "-c",
                "open('/scratch/trace', 'w').write('a')",
                mounts={"scratch": "/scratch"},
            )
        ],
        volumes=[empty_dir_volume("scratch")],
        restart_policy="OnFailure",
    )
    cluster.core.create_namespaced_pod(namespace, body)
    done = cluster.wait_pod_phase(namespace, "restarts", {"Succeeded", "Failed"}, timeout=45)
    assert done.status.phase == "Succeeded"
    main = done.status.container_statuses[0]
    assert main.restart_count == 1 and main.state.terminated.exit_code == 0
    assert main.last_state.terminated.exit_code == 1
    assert done.status.init_container_statuses[0].state.terminated.reason == "Completed"
    assert "trace=ab" in cluster.container_log(namespace, "restarts", "main").read_text()
    assert (
        "trace=abb" in cluster.container_log(namespace, "restarts", "main", restart=1).read_text()
    )


@pytest.mark.timeout(90, func_only=True)
def test_extra_agent_serves_its_island_with_rewritten_mount_paths(
    cluster: Cluster, namespace: str
) -> None:
    core = greeting_config(cluster, namespace)
    script = "import os, sys; print(open(sys.argv[1]).read(), os.environ['CONF'], os.environ['KPW_MOUNT_ETC_HARNESS_CONFIG'])"
    body = pod(
        "rewritten",
        container(
            "main", "python", "-c", script, "/etc/harness-config/greeting",
            env=[value_env("CONF", "/etc/harness-config")], mounts={"config": "/etc/harness-config"},
        ),
        volumes=[configmap_volume("config", "harness")],
        node_selector={"pathways.dev/island": "island-c"},
    )  # fmt: skip
    with cluster.start_agent(["c-0:island-c:2"], env={"KPW_NODE_AGENT_MOUNTS": "rewrite"}) as agent:
        core.create_namespaced_pod(namespace, body)
        done = cluster.wait_pod_phase(namespace, "rewritten", {"Succeeded", "Failed"}, timeout=45)
        log = (agent.state_dir / "pods" / f"{namespace}_rewritten" / "main.log").read_text()
        assert done.status.phase == "Succeeded", log
        assert done.spec.node_name == "c-0" and done.status.pod_ip.startswith(
            agent.pod_subnet + "."
        )
        assert agent.pod_subnet != cluster.agent.pod_subnet
        hello, conf, mount_env = log.split()
        assert hello == "hello" and conf == mount_env and conf.startswith(str(agent.state_dir))
    cluster.poll(
        lambda: "c-0" not in {n.metadata.name for n in core.list_node().items},
        timeout=10,
        what="node c-0 removed",
    )


@pytest.mark.timeout(240, func_only=True)
def test_agent_rides_out_an_apiserver_restart(cluster: Cluster, namespace: str) -> None:
    started = time.monotonic()
    cluster.control_plane.restart("kube-apiserver", down_seconds=2.0)
    print(f"apiserver restart took {time.monotonic() - started:.1f} s")
    core = cluster.core
    body = pod("after-restart", container("main", "python", "-c", "print('still here')"))
    core.create_namespaced_pod(namespace, body)
    # Scheduling waits for kube-scheduler's and the agent's watches to come back (and, on a
    # machine loaded by a second cluster tier, for the Node's lease to be seen fresh again).
    done = cluster.wait_pod_phase(namespace, "after-restart", {"Succeeded", "Failed"}, timeout=90)
    assert done.status.phase == "Succeeded"
    # The controller-manager, whose watches the restart cut too, serves a new namespace
    # again before the next test needs one.
    cluster.create_namespace("after-restart-probe", timeout=90)


@pytest.mark.timeout(60, func_only=True)
def test_missing_executable_fails_the_pod_with_start_error(
    cluster: Cluster, namespace: str
) -> None:
    cluster.core.create_namespaced_pod(
        namespace, pod("nobin", container("main", "/nonexistent/tool"))
    )
    done = cluster.wait_pod_phase(namespace, "nobin", {"Succeeded", "Failed"})
    terminated = done.status.container_statuses[0].state.terminated
    assert done.status.phase == "Failed"
    assert (terminated.exit_code, terminated.reason) == (128, "StartError")
    assert "/nonexistent/tool" in terminated.message


@pytest.mark.timeout(60, func_only=True)
def test_exec_readiness_and_http_liveness_probes(cluster: Cluster, namespace: str) -> None:
    server = container(
        "web", "python", "-u", "-m", "http.server", "8080", "--bind", "$(POD_IP)",  # -u: its banner reaches the log
        env=[field_env("POD_IP", "status.podIP")], mounts={"podinfo": "/etc/podinfo"},
    )  # fmt: skip
    server["readinessProbe"] = {
        "exec": {"command": ["python", "-c", "open('/etc/podinfo/name').read()"]},
        "periodSeconds": 1,
    }
    server["livenessProbe"] = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
    podinfo = {
        "name": "podinfo",
        "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]},
    }
    body = pod("probed", server, restart_policy="Always", volumes=[podinfo])
    cluster.core.create_namespaced_pod(namespace, body)

    def ready() -> Any:
        p = cluster.core.read_namespaced_pod("probed", namespace)
        conditions = {c.type: c.status for c in p.status.conditions or []}
        return p if conditions.get("Ready") == "True" else None

    probed = cluster.poll(ready, timeout=30, what="pod Ready through its probes")
    log = cluster.container_log(namespace, "probed", "web")
    liveness_probe = '"GET / HTTP/1.1" 200'
    cluster.poll(
        lambda: log.read_text().count(liveness_probe) >= 3 or None, timeout=30,
        what="three liveness probes answered by the server",
    )  # fmt: skip
    status = cluster.core.read_namespaced_pod("probed", namespace).status.container_statuses[0]
    assert status.ready and status.restart_count == 0 and status.state.running is not None
    # $(POD_IP) was expanded: the server bound the pod's own IP, where the probes reached it
    assert f"Serving HTTP on {probed.status.pod_ip} port 8080" in log.read_text(), log.read_text()


LIST_AND_WRITE = (
    "import os, sys\n"
    "volume = sys.argv[1]\n"
    "print('before=' + ','.join(sorted(os.listdir(volume))))\n"
    "open(os.path.join(volume, 'written-by-pod'), 'w').write('x')\n"
    "print('after=' + ','.join(sorted(os.listdir(volume))))\n"
    "print('python=' + sys.executable)\n"
)


@pytest.mark.timeout(60, func_only=True)
def test_a_volume_on_an_ancestor_of_the_interpreter_does_not_hide_it(
    cluster: Cluster, namespace: str
) -> None:
    venv = Path(sys.prefix)
    ancestor = str(venv.parent)
    body = pod(
        "ancestor",
        container("main", "python", "-c", LIST_AND_WRITE, ancestor, mounts={"scratch": ancestor}),
        volumes=[empty_dir_volume("scratch")],
    )
    cluster.core.create_namespaced_pod(namespace, body)
    done = cluster.wait_pod_phase(namespace, "ancestor", {"Succeeded", "Failed"}, timeout=45)
    log_file = cluster.container_log(namespace, "ancestor", "main")
    log = log_file.read_text() if log_file.exists() else "(no log: the container never started)"
    assert done.status.phase == "Succeeded", (done.status.container_statuses, log)
    assert f"before={venv.name}\n" in log, "the volume is empty but for the interpreter's path"
    assert f"after={venv.name},written-by-pod\n" in log
    assert f"python={sys.executable}\n" in log
    assert not (venv.parent / "written-by-pod").exists(), "the write went to the volume"


TWO_RUNS = (
    "import os, sys, time\n"
    "first = not os.path.exists('/scratch/ran')\n"
    "open('/scratch/ran', 'w').close()\n"
    "for i in range(4):\n"
    "    print(('first' if first else 'second') + f' run line {i}', flush=True)\n"
    "    time.sleep(0.1)\n"
    "sys.exit(1 if first else 0)\n"
)
TICKER = "import time\nfor i in range(10):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.2)\n"


@pytest.mark.timeout(90, func_only=True)
def test_pod_logs_come_through_the_api_server_as_a_kubelet_serves_them(
    cluster: Cluster, namespace: str
) -> None:
    core = cluster.core
    core.create_namespaced_pod(namespace, pod(
        "two-runs", container("main", "python", "-c", TWO_RUNS, mounts={"scratch": "/scratch"}),
        volumes=[empty_dir_volume("scratch")], restart_policy="OnFailure",
    ))  # fmt: skip
    core.create_namespaced_pod(namespace, pod("ticker", container("main", "python", "-c", TICKER)))
    cluster.wait_pod_phase(namespace, "ticker", {"Running", "Succeeded"}, timeout=45)
    followed = core.read_namespaced_pod_log(
        "ticker", namespace, container="main", follow=True, _preload_content=False, _request_timeout=30
    )
    assert followed.data.decode() == "".join(f"tick {i}\n" for i in range(10)), (
        "the followed log ends with its container, every line in it"
    )
    done = cluster.wait_pod_phase(namespace, "two-runs", {"Succeeded", "Failed"}, timeout=45)
    assert done.status.phase == "Succeeded"

    def log(**query: Any) -> str:
        return str(core.read_namespaced_pod_log("two-runs", namespace, container="main", _request_timeout=30, **query))

    assert log() == "".join(f"second run line {i}\n" for i in range(4))
    assert log(previous=True) == "".join(f"first run line {i}\n" for i in range(4))
    assert log(tail_lines=2) == "second run line 2\nsecond run line 3\n"
    assert log(limit_bytes=6) == "second"
    assert log(follow=True) == log(), "following a container that has ended ends at once"
    with pytest.raises(Exception) as missing:
        core.read_namespaced_pod_log("ticker", namespace, container="main", previous=True, _request_timeout=30)
    assert "container main of pod " + f"{namespace}/ticker has no previous run on this node" in str(missing.value)


@pytest.mark.timeout(60, func_only=True)
def test_the_container_log_endpoint_serves_no_one_but_the_api_server(cluster: Cluster) -> None:
    node = cluster.core.read_node(cluster.core.list_node().items[0].metadata.name)
    port = node.status.daemon_endpoints.kubelet_endpoint.port
    assert port, "the agent publishes its container-log port as the kubelet's"
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw) as tls:  # no client certificate
                tls.sendall(b"GET /containerLogs/default/any/main HTTP/1.1\r\nHost: node\r\n\r\n")
                answer = tls.recv(64)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            pass
    assert answer == b"", f"a client without the API server's certificate got {answer!r}"
