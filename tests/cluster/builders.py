"""Small typed builders for the Kubernetes objects that cluster tests create.

Tests describe what matters to them (a command, an env var, a probe; a slice's devices,
a program's entrypoint and steps) and get a complete, valid object; nothing is pasted
YAML. Pods and their parts come first, then the project's VirtualSlices and
PathwaysPrograms.
"""

from __future__ import annotations

from typing import Any

Manifest = dict[str, Any]
GROUP, VERSION = "pathways.dev", "v1alpha1"


def field_env(name: str, field_path: str) -> Manifest:
    """An env var from the downward API (``metadata.name``, ``status.podIP``, ...)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def value_env(name: str, value: str) -> Manifest:
    return {"name": name, "value": value}


def container(
    name: str,
    *command: str,
    env: list[Manifest] | None = None,
    ports: list[int] | None = None,
    readiness_tcp: int | None = None,
    mounts: dict[str, str] | None = None,
) -> Manifest:
    """A container running ``command`` (``python`` is the test interpreter on the agent).

    ``mounts`` maps volume name to mountPath.
    """
    spec: Manifest = {"name": name, "image": "python:3.11", "command": list(command)}
    if env:
        spec["env"] = env
    if ports:
        spec["ports"] = [{"containerPort": p} for p in ports]
    if readiness_tcp is not None:
        spec["readinessProbe"] = {"tcpSocket": {"port": readiness_tcp}, "periodSeconds": 1}
    if mounts:
        spec["volumeMounts"] = [{"name": v, "mountPath": p} for v, p in mounts.items()]
    return spec


def pod(
    name: str,
    *containers: Manifest,
    restart_policy: str = "Never",
    init_containers: list[Manifest] | None = None,
    volumes: list[Manifest] | None = None,
    node_selector: dict[str, str] | None = None,
    grace_seconds: int = 5,
) -> Manifest:
    spec: Manifest = {
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": grace_seconds,
        "containers": list(containers),
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if volumes:
        spec["volumes"] = volumes
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": spec,
    }


def configmap(name: str, data: dict[str, str]) -> Manifest:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def configmap_volume(name: str, configmap_name: str) -> Manifest:
    return {"name": name, "configMap": {"name": configmap_name}}


def empty_dir_volume(name: str, memory: bool = False) -> Manifest:
    return {"name": name, "emptyDir": {"medium": "Memory"} if memory else {}}


# -- VirtualSlices and PathwaysPrograms ------------------------------------------------


def virtual_slice(
    name: str,
    devices: int,
    *,
    island: str | None = None,
    devices_per_host: int | None = None,
    max_restarts: int | None = None,
) -> Manifest:
    spec: Manifest = {"devices": devices}
    if island is not None:
        spec["island"] = island
    if devices_per_host is not None:
        spec["devicesPerHost"] = devices_per_host
    if max_restarts is not None:
        spec["failurePolicy"] = {"maxRestarts": max_restarts}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VirtualSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


def ref_slice(name: str, ref: str) -> Manifest:
    return {"name": name, "ref": ref}


def inline_slice(name: str, devices: int, **template: Any) -> Manifest:
    return {"name": name, "template": {"devices": devices, **template}}


def program(
    name: str,
    entrypoint: str,
    *slices: Manifest,
    steps: int = 1,
    args: Manifest | None = None,
) -> Manifest:
    spec: Manifest = {"slices": list(slices), "source": {"entrypoint": entrypoint}, "steps": steps}
    if args:
        spec["args"] = args
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PathwaysProgram",
        "metadata": {"name": name},
        "spec": spec,
    }
