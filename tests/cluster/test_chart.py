"""The Helm chart against a real API server: lint, server-side validation, RBAC, and the
operator started exactly as the rendered Deployment would start it.

helm is the pinned v3 client that ``make helm`` (``tests/cluster/toolchain/build_helm.sh``)
builds through the Go module proxy into ``$KPW_CACHE``; without it every test here fails
saying so. What the chart renders is applied with ``kubectl apply --dry-run=server`` and
then for real, so the API server's own validation (and the controller-manager, which
turns the Deployment into a pod) judges it. RBAC is checked with ``kubectl auth can-i`` as
the chart's ServiceAccount, through a token from the TokenRequest API. The last test runs
the operator from the rendered container's command, args and env with that token, and
checks that a program runs to completion and that the operator never hit a Forbidden.

Also here: ``helm/label-nodes.sh`` (the kind workflow's island labelling) run against Nodes
of this cluster.

Order matters in one way: the operator test runs a namespaced operator, and this file
sorts before ``test_operator.py``, whose session-wide operator would otherwise serve the
same namespace.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from pathways_devcluster import processes
from pathways_devcluster.binaries import MissingBinariesError, find_helm, pinned_helm_version
from pathways_devcluster.controlplane import REPO_ROOT
from tests.cluster.harness import Cluster
from pathways_devcluster.node_agent.pod_env import expand
from pathways_devcluster.ports import reserve_port

CHART = REPO_ROOT / "helm" / "kube-pathways"
LABEL_NODES = REPO_ROOT / "helm" / "label-nodes.sh"
Manifest = dict[str, Any]


@dataclass(frozen=True)
class Helm:
    binary: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "HELM_CACHE_HOME": "/tmp/kpw-helm-cache", "HELM_CONFIG_HOME": "/tmp/kpw-helm-config"}
        result = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, timeout=60, env=env, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}{result.stdout}")
        return result

    def template(self, release: str, namespace: str, *sets: str, crds: bool = True) -> list[Manifest]:
        args = ["template", release, str(CHART), "--namespace", namespace]
        if crds:
            args.append("--include-crds")
        for s in sets:
            args += ["--set", s]
        return [d for d in yaml.safe_load_all(self(*args).stdout) if d]


@pytest.fixture(scope="module")
def helm() -> Helm:
    try:
        return Helm(find_helm())
    except MissingBinariesError as e:
        pytest.fail(f"the chart tests need helm: {e}", pytrace=False)


def apply(cluster: Cluster, docs: list[Manifest], *flags: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", *flags, "-f", "-", input=yaml.safe_dump_all(docs), check=check, timeout=90)


def by_kind(docs: list[Manifest], kind: str) -> Manifest:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def delete_cluster_scoped(cluster: Cluster, docs: list[Manifest]) -> None:
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            cluster.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found", check=False)


# -- lint and render ---------------------------------------------------------------------


def test_helm_binary_is_the_pinned_version(helm: Helm) -> None:
    assert helm("version", "--template", "{{.Version}}").stdout == pinned_helm_version()


def test_chart_lints_clean_and_its_schema_rejects_bad_values(helm: Helm) -> None:
    helm("lint", "--strict", str(CHART))
    bad = helm("lint", str(CHART), "--set", "operator.logLevel=verbose", check=False)
    assert bad.returncode != 0
    assert "operator/logLevel" in bad.stdout + bad.stderr
    typo = helm("template", "x", str(CHART), "--set", "operator.loglevel=debug", check=False)
    assert typo.returncode != 0 and "loglevel" in typo.stderr


def test_rendered_deployment_is_what_the_issue_asks_for(helm: Helm) -> None:
    docs = helm.template("kp", "pathways-system", crds=False)
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "NetworkPolicy", "Role", "RoleBinding", "Service",
        "ServiceAccount",
    ]
    deployment = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"} and deployment["spec"]["replicas"] == 1
    assert container["command"] == ["python", "-m", "pathways_operator"]
    assert container["args"][:4] == [
        "--all-namespaces", "--controller-listen=0.0.0.0:8470", "--controller-calls-port=8471",
        "--liveness=http://0.0.0.0:8080/healthz",
    ]  # fmt: skip
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 8470, "calls": 8471, "healthz": 8080, "metrics": 9090}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert pod["serviceAccountName"] == by_kind(docs, "ServiceAccount")["metadata"]["name"]
    service = by_kind(docs, "Service")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"grpc": 8470, "calls": 8471, "metrics": 9090}
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PATHWAYS_CONTROLLER_ADDRESS"] == "kp-kube-pathways.pathways-system.svc:8470"
    assert env["PATHWAYS_HOST_NETWORK_POLICY"] == "on"
    assert (env["PATHWAYS_LEADER_ELECTION"], env["PATHWAYS_LEADER_ELECTION_LEASE"]) == ("on", "kp-kube-pathways")
    lease_rules = by_kind(docs, "Role")["rules"]
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["kp-kube-pathways"],
            "verbs": ["get", "update"]} in lease_rules
    assert json.loads(env["PATHWAYS_OPERATOR_POD_LABELS"]) == deployment["spec"]["selector"]["matchLabels"]
    policy = by_kind(docs, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    controller_rule = next(r for r in policy["ingress"] if r["ports"] == [{"port": "grpc", "protocol": "TCP"}])
    admitted = [{e["key"] for e in peer["podSelector"]["matchExpressions"]} for peer in controller_rule["from"]]
    assert admitted == [{"pathways.dev/driver", "app.kubernetes.io/managed-by"},
                        {"pathways.dev/slice", "app.kubernetes.io/managed-by"}]
    calls_rule = next(r for r in policy["ingress"] if r["ports"] == [{"port": "calls", "protocol": "TCP"}])
    assert [{e["key"] for e in peer["podSelector"]["matchExpressions"]} for peer in calls_rule["from"]] == [
        {"pathways.dev/driver", "app.kubernetes.io/managed-by"}], "only driver pods call over the calls port"
    without = helm.template("kp", "pathways-system", "operator.callsPort=0", crds=False)
    (bare,) = by_kind(without, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--controller-calls-port=0" in bare["args"] and "calls" not in {p["name"] for p in bare["ports"]}
    assert "calls" not in {p["name"] for p in by_kind(without, "Service")["spec"]["ports"]}
    crds = {p.name for p in (REPO_ROOT / "crds").glob("*.yaml")}
    rendered_crds = [d for d in helm.template("kp", "pathways-system") if d["kind"] == "CustomResourceDefinition"]
    assert len(rendered_crds) == len(crds) == 2


def test_system_priority_classes_stay_refused_unless_the_chart_allows_them(helm: Helm) -> None:
    def env(*sets: str) -> dict[str, str]:
        (container,) = by_kind(helm.template("kp", "pathways-system", *sets, crds=False), "Deployment")[
            "spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value", "") for e in container["env"]}

    assert env()["PATHWAYS_ALLOW_SYSTEM_PRIORITY_CLASSES"] == "false"
    assert env("operator.allowSystemPriorityClasses=true")["PATHWAYS_ALLOW_SYSTEM_PRIORITY_CLASSES"] == "true"
    bad = helm("template", "x", str(CHART), "--set", "worker.resources.requests.cpu=lots", check=False)
    assert bad.returncode != 0 and "worker.resources.requests.cpu" in bad.stderr.replace("/", "."), bad.stderr


# -- applied to the API server -----------------------------------------------------------


def test_helm_install_dry_run_tells_the_user_what_to_do_next(cluster: Cluster, helm: Helm, namespace: str) -> None:
    result = helm(
        "install", "kp-notes", str(CHART), "--namespace", namespace,
        "--kubeconfig", str(cluster.kubeconfig), "--dry-run=server",
    )  # fmt: skip
    notes = result.stdout.partition("NOTES:")[2]
    assert f"kubectl -n {namespace} rollout status deployment/kp-notes-kube-pathways" in notes
    assert "pathways status -w" in notes and "pathways describe slice" in notes
    assert f"kp-notes-kube-pathways.{namespace}.svc:8470" in notes


@dataclass(frozen=True)
class Installed:
    namespace: str
    release: str
    docs: list[Manifest]
    serviceaccount: str
    kubeconfig: Path


@pytest.fixture(scope="module")
def installed(cluster: Cluster, helm: Helm) -> Iterator[Installed]:
    """The chart rendered and applied for real; the operator pod cannot be scheduled
    (nodeSelector matches no Node), so nothing runs while the objects are checked."""
    namespace = cluster.create_namespace("chart")
    release = f"kp-{secrets.token_hex(3)}"
    docs = helm.template(release, namespace, "operator.nodeSelector.kube-pathways/test=nowhere")
    try:
        dry = apply(cluster, docs, "--dry-run=server")
        assert "(server dry run)" in dry.stdout
        apply(cluster, docs)
        serviceaccount = by_kind(docs, "ServiceAccount")["metadata"]["name"]
        kubeconfig = cluster.control_plane.make_user_kubeconfig(serviceaccount, namespace)
        yield Installed(namespace, release, docs, serviceaccount, kubeconfig)
    finally:
        delete_cluster_scoped(cluster, docs)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_server_side_validation_rejects_what_the_schema_lets_through(cluster: Cluster, helm: Helm) -> None:
    docs = helm.template("kp-bad", "default", "operator.resources.requests.cpu=lots", crds=False)
    result = apply(cluster, [by_kind(docs, "Deployment")], "--dry-run=server", check=False)
    assert result.returncode != 0
    assert "quantities must match the regular expression" in result.stderr


def test_applied_chart_creates_every_object_and_the_operator_pod(cluster: Cluster, installed: Installed) -> None:
    for doc in installed.docs:
        kind, name = doc["kind"].lower(), doc["metadata"]["name"]
        where = [] if kind in ("clusterrole", "clusterrolebinding", "customresourcedefinition") else ["-n", installed.namespace]
        cluster.kubectl("get", kind, name, *where)
    deployment = by_kind(installed.docs, "Deployment")["metadata"]["name"]
    core: Any = client.CoreV1Api(cluster.api)
    selector = ",".join(f"{k}={v}" for k, v in by_kind(installed.docs, "Deployment")["spec"]["selector"]["matchLabels"].items())

    def unschedulable_pod() -> Any:
        pods = core.list_namespaced_pod(installed.namespace, label_selector=selector).items
        for pod in pods:
            for cond in pod.status.conditions or []:
                if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
                    return pod
        return None

    pod = cluster.poll(unschedulable_pod, timeout=30, what=f"a pod of Deployment {deployment} (Unschedulable by design)")
    assert pod.spec.security_context.run_as_non_root is True
    assert pod.spec.service_account_name == installed.serviceaccount


RBAC = [  # verb, resource, subresource, scope; whether the operator's ServiceAccount may
    ("create", "pods", "binding", "", True),
    ("create", "pods", "", "", True),
    ("get", "pods", "log", "", True),
    ("delete", "pods", "", "", True),
    ("watch", "pods", "", "-A", True),
    ("patch", "virtualslices.pathways.dev", "status", "", True),
    ("patch", "pathwaysprograms.pathways.dev", "status", "", True),
    ("create", "virtualslices.pathways.dev", "", "", True),
    ("list", "nodes", "", "", True),
    ("create", "events", "", "", True),
    ("get", "configmaps", "", "", True),
    ("create", "secrets", "", "", True),
    ("get", "secrets", "", "", True),
    ("delete", "secrets", "", "", True),
    ("create", "networkpolicies.networking.k8s.io", "", "", True),
    ("get", "networkpolicies.networking.k8s.io", "", "", True),
    ("watch", "networkpolicies.networking.k8s.io", "", "-A", True),
    ("update", "networkpolicies.networking.k8s.io", "", "", True),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io", "", "", True),
    ("list", "priorityclasses.scheduling.k8s.io", "", "", True),
    ("list", "secrets", "", "-A", False),
    ("list", "secrets", "", "", False),
    ("watch", "secrets", "", "-A", False),
    ("update", "secrets", "", "", False),
    ("patch", "secrets", "", "", False),
    ("delete", "deployments.apps", "", "", False),
    ("create", "deployments.apps", "", "", False),
    ("patch", "nodes", "", "", False),
    ("create", "pods", "exec", "", False),
    ("delete", "configmaps", "", "", False),
    ("list", "namespaces", "", "", False),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", "", "", False),
    ("create", "leases.coordination.k8s.io", "", "", True),
    ("create", "leases.coordination.k8s.io", "", "-A", False),
    ("get", "leases.coordination.k8s.io/someone-elses", "", "", False),
    ("update", "leases.coordination.k8s.io/someone-elses", "", "", False),
    ("delete", "networkpolicies.networking.k8s.io", "", "", False),
    ("patch", "networkpolicies.networking.k8s.io", "", "", False),
]
CAN = [rule[:4] for rule in RBAC if rule[4]]
CANNOT = [rule[:4] for rule in RBAC if not rule[4]]


def can_i(cluster: Cluster, installed: Installed, verb: str, resource: str, sub: str, scope: str) -> bool:
    args = ["auth", "can-i", verb, resource, *(["--subresource", sub] if sub else [])]
    args += [scope] if scope else ["-n", installed.namespace]
    result = cluster.kubectl(*args, check=False, kubeconfig=installed.kubeconfig)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {result.stderr}"
    return answer == "yes"


def test_operator_serviceaccount_gets_exactly_what_it_uses(cluster: Cluster, installed: Installed) -> None:
    lease = f"leases.coordination.k8s.io/{installed.release}-kube-pathways"
    can = [*CAN, ("get", lease, "", ""), ("update", lease, "", "")]
    missing = [c for c in can if not can_i(cluster, installed, *c)]
    excess = [c for c in CANNOT if can_i(cluster, installed, *c)]
    assert not missing, f"the chart's ClusterRole lacks {missing}"
    assert not excess, f"the chart's ClusterRole grants more than the operator uses: {excess}"


# -- the operator, as the Deployment runs it ----------------------------------------------


def field_value(path: str, namespace: str, pod_name: str) -> str:
    return {"metadata.name": pod_name, "metadata.namespace": namespace, "status.podIP": "127.0.0.1"}[path]


def container_process(container: Manifest, namespace: str, pod_name: str) -> tuple[list[str], dict[str, str]]:
    """argv and env of the rendered container, resolved as a kubelet would (python = this one)."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = field_value(var["valueFrom"]["fieldRef"]["fieldPath"], namespace, pod_name)
        else:
            env[var["name"]] = expand(str(var.get("value", "")), env)
    argv = [expand(a, env) for a in [*container["command"], *container.get("args", [])]]
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv, env


def paper_example(name: str) -> Manifest:
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {"name": name},
        "spec": {
            "slices": [{"name": "main", "template": {"devices": 2}}],
            "source": {"entrypoint": "examples.programs:paper_example"},
            "steps": 2,
        },
    }


def wait_live(url: str, operator: subprocess.Popen[bytes], log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while processes.wait_until(deadline, 0.3):
        if operator.poll() is not None:
            raise AssertionError(f"the operator exited with {operator.returncode}:\n{processes.log_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            continue
    raise AssertionError(f"the operator's liveness endpoint {url} did not answer:\n{processes.log_tail(log)}")


@pytest.mark.timeout(300)
def test_operator_from_rendered_deployment_runs_a_program(
    cluster: Cluster, helm: Helm, namespace: str, tmp_path: Path
) -> None:
    if not (REPO_ROOT / "operator" / "pathways_operator" / "__main__.py").exists():
        pytest.fail("the operator (`python -m pathways_operator`, issue 4) is not there yet", pytrace=False)
    release = f"kp-{secrets.token_hex(3)}"
    # The chart's ports are fixed numbers (1-65535): reserved ones, held until the session ends.
    liveness = reserve_port().port
    docs = helm.template(
        release, namespace,
        f"operator.watchNamespace={namespace}",
        f"operator.controllerPort={reserve_port().port}",
        f"operator.callsPort={reserve_port().port}",
        f"operator.livenessPort={liveness}",
        f"metrics.port={reserve_port().port}",
    )  # fmt: skip
    deployment = by_kind(docs, "Deployment")
    try:
        apply(cluster, [d for d in docs if d["kind"] != "Deployment"])
        cluster.kubectl("wait", "--for", "condition=Established", "--timeout=30s",
                        "crd/virtualslices.pathways.dev", "crd/pathwaysprograms.pathways.dev", timeout=40)  # fmt: skip
        pod_spec = deployment["spec"]["template"]["spec"]
        kubeconfig = cluster.control_plane.make_user_kubeconfig(pod_spec["serviceAccountName"], namespace)
        (container,) = pod_spec["containers"]
        argv, env = container_process(container, namespace, f"{release}-operator-0")
        env.update(
            PATH=os.environ.get("PATH", ""),
            KUBECONFIG=str(kubeconfig),
            # the emptyDir on /tmp, which holds the operator's --state-dir, is this test's
            PATHWAYS_OPERATOR_STATE_DIR=str(tmp_path / "state"),
        )
        # Driver pods dial the chart's Service by its DNS name; the test cluster has no
        # cluster DNS or Service proxy, so they dial the operator's loopback port instead.
        assert env["PATHWAYS_CONTROLLER_ADDRESS"].startswith(f"{release}-kube-pathways.{namespace}.svc:")
        env["PATHWAYS_CONTROLLER_ADDRESS"] = "127.0.0.1:" + env["PATHWAYS_CONTROLLER_ADDRESS"].rsplit(":", 1)[1]
        probe = container["livenessProbe"]["httpGet"]
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == probe["port"])
        log = tmp_path / "operator.log"
        operator = processes.spawn(argv, log=log, env=env, cwd=REPO_ROOT)
        try:
            wait_live(f"http://127.0.0.1:{port}{probe['path']}", operator, log)
            name = "paper"
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(paper_example(name)))
            custom: Any = client.CustomObjectsApi(cluster.api)

            networking: Any = client.NetworkingV1Api(cluster.api)
            policies: list[Any] = []

            def finished() -> Manifest | None:
                if not policies:  # the inline slice's, read while it lives: it goes with the slice
                    policies.extend(networking.list_namespaced_network_policy(
                        namespace, label_selector="pathways.dev/slice").items)
                obj = custom.get_namespaced_custom_object("pathways.dev", "v1alpha1", namespace, "pathwaysprograms", name)
                return obj if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

            try:
                done = cluster.poll(finished, timeout=180, interval=0.5, what=f"PathwaysProgram {name} finished")
            except AssertionError as e:
                raise AssertionError(f"{e}\noperator log:\n{processes.log_tail(log, 8000)}") from None
            status = done["status"]
            assert status["phase"] == "Succeeded", f"{json.dumps(status, indent=1)}\n{processes.log_tail(log, 8000)}"
            assert status["stepsCompleted"] == 2
            core: Any = client.CoreV1Api(cluster.api)
            results = core.read_namespaced_config_map(status["results"]["configMap"], namespace)
            assert json.loads(results.data["y"]) == [3.0, 5.0] and json.loads(results.data["z"]) == [2.0, 4.0]
            # the program's inline slice stood behind a host NetworkPolicy admitting this operator's pods
            assert policies, "no host NetworkPolicy was seen while the program's slice lived"
            operator_peer = policies[0].spec.ingress[0]._from[2]
            assert operator_peer.namespace_selector.match_labels == {"kubernetes.io/metadata.name": namespace}
            assert operator_peer.pod_selector.match_labels == deployment["spec"]["selector"]["matchLabels"]
            custom.delete_namespaced_custom_object("pathways.dev", "v1alpha1", namespace, "pathwaysprograms", name)
            cluster.poll(
                lambda: not custom.list_namespaced_custom_object(
                    "pathways.dev", "v1alpha1", namespace, "virtualslices")["items"],
                timeout=60, what="the program's inline slice deleted by the operator",
            )  # fmt: skip
        finally:
            processes.stop(operator, grace_seconds=15.0)
        lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease(f"{release}-kube-pathways", namespace)
        assert lease.spec is not None
        assert lease.spec.holder_identity == "", "the operator led while it ran and gave its Lease back when stopped"
        assert lease.spec.lease_transitions == 0
        text = log.read_text(errors="replace")
        denied = [line for line in text.splitlines() if re.search(r"Forbidden|forbidden|Not enough permissions", line)]
        assert not denied, "the operator was denied by the chart's RBAC:\n" + "\n".join(denied[:10])
    finally:
        delete_cluster_scoped(cluster, docs)


# -- the kind workflow's labelling step ----------------------------------------------------


def fake_node(name: str) -> Manifest:
    """A Node with no agent behind it: NotReady, tainted and cordoned, so nothing lands on it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {
            "unschedulable": True,
            "taints": [{"key": "kube-pathways/label-test", "effect": "NoSchedule"}],
        },
    }


def test_label_nodes_makes_two_islands_with_device_capacity(cluster: Cluster) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    names = [f"kind-test-{secrets.token_hex(2)}-w{i}" for i in range(4)]
    try:
        for name in names:
            core.create_node(fake_node(name))
            core.patch_node_status(name, {"status": {"capacity": {"cpu": "2", "memory": "1Gi", "pods": "10"}}})
        run = subprocess.run(
            ["bash", str(LABEL_NODES), "--kubeconfig", str(cluster.kubeconfig), "--devices", "8", *names],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        nodes = {n: core.read_node(n) for n in names}
        islands = [nodes[n].metadata.labels.get("pathways.dev/island") for n in names]
        assert islands == ["island-a", "island-a", "island-b", "island-b"]
        for node in nodes.values():
            assert node.status.capacity["pathways.dev/device"] == "8"
            assert node.status.allocatable["pathways.dev/device"] == "8"
            assert node.status.capacity["cpu"] == "2", "the patch must add to capacity, not replace it"
        again = subprocess.run(
            ["bash", str(LABEL_NODES), "--kubeconfig", str(cluster.kubeconfig), *names[:3]],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert again.returncode == 1
        assert "expected 4 worker Nodes (2 per island for island-a island-b), found 3" in again.stderr
    finally:
        for name in names:
            cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)
