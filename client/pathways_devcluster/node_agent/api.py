"""The node agent's view of the API server: JSON in, JSON out.

The agent is a stand-in for the kubelet, not a kubelet; it talks to the real API
server through the ``kubernetes`` client but asks for raw JSON (``_preload_content=False``)
instead of the client's model classes. That keeps it independent of the models and lets
it read fields they do not know. Every call is bounded by ``API_TIMEOUT``; a failed call
raises ``ApiError`` with the HTTP status, which the callers branch on (404 gone, 409
conflict, 410 expired).

``KubeApi`` is also the ``ObjectSource`` through which ``pod_env`` and ``pod_volumes``
read Secrets, ConfigMaps and service-account tokens. Timestamps are written as the API
server writes them (``now``, ``now_micro``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pathways_devcluster.node_agent.pod_env import ContainerConfigError, TokenRequest

API_TIMEOUT = (5.0, 15.0)
"""Connect and read timeouts of one API call, in seconds."""


def now() -> str:
    """The time as the API's ``metav1.Time`` (seconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """The time as the API's ``metav1.MicroTime`` (Lease renewals)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KubeApi:
    """One ``ApiClient`` for the agent's threads, with the handles they call through."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
        configuration.connection_pool_maxsize = 32
        self.host = str(configuration.host)
        self.ca_file: str | None = configuration.ssl_ca_cert
        """The cluster CA's file (the kubeconfig's own, or where its inlined one was written)."""
        self._client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self._client)
        self.coordination = client.CoordinationV1Api(self._client)
        self._exception: type[Exception] = client.ApiException

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)``, bounded in time, its reply as parsed JSON."""
        kwargs.setdefault("_request_timeout", API_TIMEOUT)
        try:
            resp = method(*args, _preload_content=False, **kwargs)
        except self._exception as e:
            body = getattr(e, "body", None) or e
            raise ApiError(int(getattr(e, "status", 0) or 0), str(body)) from None
        data = resp.data
        return json.loads(data) if data else None

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_or_none(self.core.read_namespaced_secret, name, namespace)

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_or_none(self.core.read_namespaced_config_map, name, namespace)

    def _get_or_none(self, method: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = self.call(method, *args)
            return result
        except ApiError as e:
            if e.status == 404:
                return None
            raise ContainerConfigError(str(e)) from None

    def request_token(self, namespace: str, serviceaccount: str, request: TokenRequest) -> str:
        create = self.core.create_namespaced_service_account_token
        try:
            result = self.call(create, serviceaccount, namespace, request.body())
        except ApiError as e:
            raise ContainerConfigError(f"token for serviceaccount {serviceaccount}: {e}") from None
        return str(result["status"]["token"])

