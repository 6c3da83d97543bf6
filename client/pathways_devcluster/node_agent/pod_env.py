"""What a container sees of its pod: environment, ``$(VAR)`` expansion, downward API.

The node agent is a stand-in for the kubelet, not a kubelet: it runs containers as
local processes, so it must build their environment the way the kubelet does, or code
that works here would break on a real node (and the other way round):

* a small "image" environment (``PATH``, ``HOME``, ``LANG``, ``HOSTNAME``) -- nothing else
  of the agent's own environment leaks in, so a pod cannot accidentally use the test
  runner's ``KUBECONFIG``;
* ``KUBERNETES_SERVICE_HOST``/``_PORT`` (and the ``KUBERNETES_PORT*`` family), pointing at
  the real API server on loopback, since there is no kube-proxy to make the
  ``kubernetes`` Service's cluster IP reachable: in-cluster clients work unchanged;
* ``envFrom`` (ConfigMaps and Secrets, with ``prefix`` and ``optional``), then ``env`` in
  order: ``value`` with ``$(VAR)`` expansion over what is defined so far, and
  ``valueFrom`` with ``fieldRef``, ``secretKeyRef`` and ``configMapKeyRef``;
* ``command`` and ``args`` expanded with ``$(VAR)`` over the final environment.

Everything here is pure apart from ``ObjectSource``, through which Secrets, ConfigMaps
and service-account tokens are read.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

Pod = Mapping[str, Any]
"""A Pod as the API returns it (JSON)."""


class ContainerConfigError(Exception):
    """The container cannot be configured yet (the kubelet's CreateContainerConfigError)."""


class ObjectSource(Protocol):
    """Reads the API objects that a pod's environment and volumes refer to."""

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def request_token(self, namespace: str, serviceaccount: str, request: TokenRequest) -> str: ...


@dataclass(frozen=True)
class TokenRequest:
    """A service-account token bound to one pod, as a projected token volume asks for it."""

    audiences: list[str]
    expiration_seconds: int
    pod_name: str
    pod_uid: str

    def body(self) -> dict[str, Any]:
        """The ``authentication.k8s.io/v1`` TokenRequest the API server takes."""
        return {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": self.audiences,
                "expirationSeconds": self.expiration_seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": self.pod_name,
                    "uid": self.pod_uid,
                },
            },
        }


@dataclass(frozen=True)
class PodNetwork:
    """The addresses that the downward API and the service environment expose."""

    pod_ip: str
    host_ip: str
    apiserver_host: str
    apiserver_port: int


_LABEL_KEY = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: Pod, field_path: str, net: PodNetwork) -> str:
    """Value of a downward-API ``fieldRef`` (the paths the kubelet supports)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": net.pod_ip,
        "status.podIPs": net.pod_ip,
        "status.hostIP": net.host_ip,
        "status.hostIPs": net.host_ip,
    }
    if field_path in simple:
        return str(simple[field_path])
    if field_path in ("metadata.labels", "metadata.annotations"):
        values = meta.get(field_path.split(".")[1]) or {}
        return "\n".join(f'{k}="{_quote(v)}"' for k, v in sorted(values.items()))
    match = _LABEL_KEY.match(field_path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ContainerConfigError(f"fieldRef {field_path!r} is not supported")


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, ``$$`` escapes, others stay."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close == -1:
                out.append(text[i:])
                break
            name = text[i + 2 : close]
            out.append(env[name] if name and name in env else text[i : close + 1])
            i = close + 1
        else:
            out.append("$")
            i += 1
    return "".join(out)


def decoded_secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def configmap_data(configmap: Mapping[str, Any]) -> dict[str, bytes]:
    data = {k: str(v).encode() for k, v in (configmap.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (configmap.get("binaryData") or {}).items()})
    return data


def _keyed(
    source: ObjectSource, namespace: str, kind: str, ref: Mapping[str, Any]
) -> dict[str, bytes] | None:
    name = ref.get("name", "")
    if kind == "secret":
        secret = source.get_secret(namespace, name)
        data = decoded_secret_data(secret) if secret is not None else None
    else:
        configmap = source.get_configmap(namespace, name)
        data = configmap_data(configmap) if configmap is not None else None
    if data is None and not ref.get("optional", False):
        raise ContainerConfigError(f'{kind} "{name}" not found')
    return data


def base_environment(pod: Pod, net: PodNetwork) -> dict[str, str]:
    """The "image" environment plus the API server's service variables."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "HOSTNAME": str((pod.get("metadata") or {}).get("name", "")),
    }
    for key in ("LANG", "LC_ALL", "TMPDIR", "TZ"):
        if key in os.environ:
            env[key] = os.environ[key]
    host, port = net.apiserver_host, str(net.apiserver_port)
    env.update(
        {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
            "KUBERNETES_PORT_443_TCP": f"tcp://{host}:{port}",
            "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
            "KUBERNETES_PORT_443_TCP_PORT": port,
            "KUBERNETES_PORT_443_TCP_ADDR": host,
        }
    )
    return env


def container_environment(
    pod: Pod, container: Mapping[str, Any], net: PodNetwork, source: ObjectSource
) -> dict[str, str]:
    """The container's environment, resolved as the kubelet resolves it."""
    namespace = str(pod["metadata"]["namespace"])
    env = base_environment(pod, net)
    for item in container.get("envFrom") or []:
        prefix = item.get("prefix", "")
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            if key in item:
                found = _keyed(source, namespace, kind, item[key]) or {}
                env.update({prefix + k: v.decode("utf-8", "replace") for k, v in found.items()})
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(str(var.get("value", "")), env)
            continue
        value_from = var["valueFrom"]
        if "fieldRef" in value_from:
            env[name] = field_ref(pod, value_from["fieldRef"]["fieldPath"], net)
        elif "secretKeyRef" in value_from or "configMapKeyRef" in value_from:
            kind, ref = (
                ("secret", value_from["secretKeyRef"])
                if "secretKeyRef" in value_from
                else ("configmap", value_from["configMapKeyRef"])
            )
            data = _keyed(source, namespace, kind, ref)
            key = ref.get("key", "")
            if data is not None and key in data:
                env[name] = data[key].decode("utf-8", "replace")
            elif not ref.get("optional", False):
                raise ContainerConfigError(
                    f"couldn't find key {key} in {kind} {namespace}/{ref.get('name')}"
                )
        else:
            raise ContainerConfigError(
                f"env {name}: valueFrom {sorted(value_from)} is not supported by the node agent"
            )
    return env


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded; the test agent has no image entrypoint."""
    command = [expand(str(a), env) for a in container.get("command") or []]
    args = [expand(str(a), env) for a in container.get("args") or []]
    if not command:
        raise ContainerConfigError(
            f"container {container.get('name')!r} has no command; the node agent runs "
            "processes, not images, so every container needs an explicit command"
        )
    return command + args
