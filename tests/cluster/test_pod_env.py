"""The node agent's environment rules, checked without a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pathways_devcluster.node_agent.pod_env import (
    ContainerConfigError,
    PodNetwork,
    container_argv,
    container_environment,
    expand,
    field_ref,
)
from pathways_devcluster.node_agent.pod_volumes import (
    Mount,
    MountPoints,
    apply_mounts,
    mount_env_name,
    mount_order,
)

NET = PodNetwork("127.0.0.12", "127.0.0.1", "127.0.0.1", 6443)
POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
    "spec": {"nodeName": "a-0"},
}


class NoObjects:
    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"data": {"k": "dmFsdWU="}} if name == "s" else None

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"data": {"A": "1", "B": "2"}} if name == "c" else None

    def request_token(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("not used")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-$(B)", "1-2"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$A $(A", "$A $(A"),
        ("cost: $5", "cost: $5"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "2"}) == expected


def test_field_refs_and_env_order() -> None:
    assert field_ref(POD, "metadata.labels['app']", NET) == "x"
    assert field_ref(POD, "status.podIP", NET) == "127.0.0.12"
    container = {
        "name": "c",
        "command": ["python", "-c", "$(GREETING)"],
        "envFrom": [{"configMapRef": {"name": "c"}, "prefix": "CM_"}],
        "env": [
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "GREETING", "value": "on $(NODE) with $(CM_A)"},
            {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ],
    }
    env = container_environment(POD, container, NET, NoObjects())
    assert env["GREETING"] == "on a-0 with 1" and env["SECRET"] == "value"
    assert (
        env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1" and env["KUBERNETES_SERVICE_PORT"] == "6443"
    )
    assert "KUBECONFIG" not in env
    assert container_argv(container, env) == ["python", "-c", "on a-0 with 1"]
    with pytest.raises(ContainerConfigError, match='secret "gone" not found'):
        missing = {
            "name": "c",
            "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}}],
        }
        container_environment(POD, missing, NET, NoObjects())


def test_rewrite_mode_points_paths_at_the_volume_directory() -> None:
    mounts = [Mount(Path("/state/v/config"), "/etc/config", read_only=True)]
    argv, env = apply_mounts(
        ["python", "/etc/config/run.py", "/etc/configuration"],
        {"CONF": "/etc/config"},
        mounts,
        "rewrite",
        MountPoints(),
    )
    assert argv == ["python", "/state/v/config/run.py", "/etc/configuration"]
    assert env["CONF"] == "/state/v/config"
    assert env[mount_env_name("/etc/config")] == "/state/v/config"
    assert mount_env_name("/etc/config") == "KPW_MOUNT_ETC_CONFIG"


def test_a_mount_over_the_directory_holding_other_volumes_is_bound_last() -> None:
    volumes = Path("/tmp/agent/volumes/uid")
    tmp = Mount(volumes / "tmp", "/tmp", False)
    token = Mount(volumes / "token", "/var/run/secrets/kubernetes.io/serviceaccount", True)
    data = Mount(volumes / "data", "/data", False)
    nested = Mount(volumes / "nested", "/data/nested", False)
    assert mount_order([tmp, nested, token, data]) == [data, nested, token, tmp]
