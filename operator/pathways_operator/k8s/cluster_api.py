"""Every call the operator makes to the Kubernetes API, in one thin adapter.

Reconcilers never touch ``kubernetes.client`` directly: they call
:class:`ClusterApi`, which returns objects as the API serves them (JSON
decoded into dicts, skipping the client's slow model classes), maps "not found"
to ``None`` and "already exists" to :class:`AlreadyExists`, and wraps every other
failure in :class:`KubeError` naming the verb and the object, so a log line
says what the operator was doing when the API said no.

Reads are plain GET/LIST requests to the API server, not an informer cache:
admission decisions must see the pods created a moment ago, and at the scale
of islands of accelerator hosts the extra requests cost nothing.
"""

from __future__ import annotations

import datetime
import json
import socket
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from pathways_wire.kube_names import (
    FIELD_MANAGER,
    GROUP,
    PROGRAM_PLURAL,
    SLICE_PLURAL,
    VERSION,
)

Json = dict[str, Any]
"""A Kubernetes object as the API serves it."""

T = TypeVar("T")


class KubeError(Exception):
    """The API server refused or failed a request; the message names what was attempted."""

    def __init__(self, doing: str, status: int, detail: str) -> None:
        super().__init__(f"{doing}: HTTP {status}: {detail}")
        self.status = status


class AlreadyExists(KubeError):
    """A create found an object of that name (possibly one still being deleted)."""


def error_detail(err: ApiException) -> str:
    """The API server's message for a refused or failed request (its reason if the body has none)."""
    try:
        body = json.loads(err.body or "{}")
    except (TypeError, ValueError):
        return str(err.reason)
    return str(body.get("message") or err.reason)


def _decode(response: Any) -> Json:
    data: Json = json.loads(response.data)
    return data


def _precondition(uid: str, grace_seconds: int | None = None) -> kclient.V1DeleteOptions:
    """DeleteOptions that make the API server refuse (409) if the name now holds another object.

    The grace period goes in the body too: with a body, the API server reads no query parameters.
    """
    return kclient.V1DeleteOptions(preconditions=kclient.V1Preconditions(uid=uid),
                                   grace_period_seconds=grace_seconds)


def now_rfc3339() -> str:
    """The current time as the API server writes timestamps (seconds, UTC, 'Z')."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ClusterApi:
    """Typed entry points to the API for pods, nodes, the two CRDs, ConfigMaps, Secrets, NetworkPolicies and events."""

    def __init__(self, api_client: kclient.ApiClient, namespace: str | None) -> None:
        self.namespace = namespace
        """The one namespace watched, or None for all namespaces."""
        self.core = kclient.CoreV1Api(api_client)
        self.custom = kclient.CustomObjectsApi(api_client)
        self.scheduling = kclient.SchedulingV1Api(api_client)
        self.networking = kclient.NetworkingV1Api(api_client)
        self._instance = socket.gethostname()

    def _call(self, doing: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except ApiException as err:
            kind = AlreadyExists if err.status == 409 else KubeError
            raise kind(doing, int(err.status or 0), error_detail(err)) from None

    def _get_or_none(self, doing: str, fn: Callable[[], Json]) -> Json | None:
        try:
            return fn()
        except ApiException as err:
            if err.status == 404:
                return None
            raise KubeError(doing, int(err.status or 0), error_detail(err)) from None

    # ------------------------------------------------------------ nodes and pods

    def list_nodes(self) -> list[Json]:
        reply = self._call("listing Nodes", lambda: self.core.list_node(_preload_content=False))
        return list(_decode(reply).get("items", []))

    def get_node(self, name: str) -> Json | None:
        return self._get_or_none(
            f"reading Node {name}", lambda: _decode(self.core.read_node(name, _preload_content=False))
        )

    def list_pods(self, namespace: str | None = None, label_selector: str = "") -> list[Json]:
        """Pods in ``namespace`` (None: every namespace), optionally by label selector."""
        if namespace is None:
            reply = self._call(
                f"listing pods ({label_selector or 'all'}) in all namespaces",
                lambda: self.core.list_pod_for_all_namespaces(
                    label_selector=label_selector, _preload_content=False
                ),
            )
        else:
            ns = namespace
            reply = self._call(
                f"listing pods ({label_selector or 'all'}) in {ns}",
                lambda: self.core.list_namespaced_pod(
                    ns, label_selector=label_selector, _preload_content=False
                ),
            )
        return list(_decode(reply).get("items", []))

    def _create(self, kind: str, namespace: str, body: Json, create: Callable[..., Any]) -> Json:
        """Create a namespaced built-in object; :class:`AlreadyExists` when one of that name exists."""
        name = body["metadata"]["name"]
        return _decode(
            self._call(
                f"creating {kind} {namespace}/{name}",
                lambda: create(namespace, cast(Any, body), field_manager=FIELD_MANAGER, _preload_content=False),
            )
        )

    @staticmethod
    def _delete_if_same(doing: str, delete: Callable[[], object]) -> None:
        """Delete with a uid precondition: gone already (404) or replaced (409) deletes nothing."""
        try:
            delete()
        except ApiException as err:
            if err.status not in (404, 409):
                raise KubeError(doing, int(err.status or 0), error_detail(err)) from None

    def create_pod(self, namespace: str, body: Json) -> Json:
        return self._create("pod", namespace, body, self.core.create_namespaced_pod)

    def bind_pod(self, namespace: str, pod: str, node: str) -> None:
        """Bind a pod to a Node with the Binding API, as a scheduler does."""
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self._call(
            f"binding pod {namespace}/{pod} to node {node}",
            lambda: self.core.create_namespaced_pod_binding(
                pod, namespace, cast(Any, binding), _preload_content=False
            ),
        )

    def get_pod(self, namespace: str, name: str) -> Json | None:
        return self._get_or_none(
            f"reading pod {namespace}/{name}",
            lambda: _decode(self.core.read_namespaced_pod(name, namespace, _preload_content=False)),
        )

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int | None = None) -> None:
        """Delete the pod of that name only if it is still the object ``uid`` (names are reused).

        Gone already, or replaced by another object of the same name: nothing is deleted.
        """
        self._delete_if_same(f"deleting pod {namespace}/{name}", lambda: self.core.delete_namespaced_pod(
            name, namespace, body=_precondition(uid, grace_seconds), _preload_content=False,
        ))

    def pod_log(self, namespace: str, name: str, container: str, tail_lines: int) -> str:
        """The last lines of a container's log through the kubelet; "" when it cannot be read (no kubelet, gone)."""
        try:
            reply = self.core.read_namespaced_pod_log(
                name, namespace, container=container, tail_lines=tail_lines, _preload_content=False,
                _request_timeout=10,
            )
        except (ApiException, OSError, ValueError):
            return ""
        return bytes(cast(Any, reply).data).decode(errors="replace")

    # ------------------------------------------------------------ custom resources

    def _list_custom(self, plural: str, namespace: str | None) -> list[Json]:
        scope = namespace or self.namespace
        if scope is None:
            reply: Json = self._call(
                f"listing {plural} in all namespaces",
                lambda: cast(Json, self.custom.list_cluster_custom_object(GROUP, VERSION, plural)),
            )
        else:
            ns = scope
            reply = self._call(
                f"listing {plural} in {ns}",
                lambda: cast(Json, self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, plural)),
            )
        return list(reply.get("items", []))

    def _get_custom(self, plural: str, namespace: str, name: str) -> Json | None:
        return self._get_or_none(
            f"reading {plural} {namespace}/{name}",
            lambda: cast(Json, self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)),
        )

    def _patch_status(self, plural: str, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, plural, name, {"status": dict(status)},
                field_manager=FIELD_MANAGER,
            )
        except ApiException as err:
            if err.status == 404:
                return  # deleted meanwhile: nothing to report on
            raise KubeError(
                f"writing status of {plural} {namespace}/{name}", int(err.status or 0), error_detail(err)
            ) from None

    def list_slices(self, namespace: str | None = None) -> list[Json]:
        return self._list_custom(SLICE_PLURAL, namespace)

    def get_slice(self, namespace: str, name: str) -> Json | None:
        return self._get_custom(SLICE_PLURAL, namespace, name)

    def create_slice(self, namespace: str, body: Json) -> Json:
        name = body["metadata"]["name"]
        reply: Json = self._call(
            f"creating VirtualSlice {namespace}/{name}",
            lambda: cast(Json, self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, SLICE_PLURAL, body, field_manager=FIELD_MANAGER
            )),
        )
        return reply

    def delete_slice(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Delete the VirtualSlice; given ``uid``, only if the name still holds that object."""
        self._delete_if_same(f"deleting VirtualSlice {namespace}/{name}", lambda: (
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, SLICE_PLURAL, name, propagation_policy="Background",
                body=_precondition(uid) if uid else None,
            )
        ))

    def annotate_slice(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str | None]) -> None:
        """Set (None: remove) annotations of the VirtualSlice, provided it is still the object ``uid``."""
        patch = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        self._call(
            f"annotating VirtualSlice {namespace}/{name}",
            lambda: self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, SLICE_PLURAL, name, patch, field_manager=FIELD_MANAGER
            ),
        )

    def patch_slice_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self._patch_status(SLICE_PLURAL, namespace, name, status)

    def get_program(self, namespace: str, name: str) -> Json | None:
        return self._get_custom(PROGRAM_PLURAL, namespace, name)

    def list_programs(self, namespace: str | None = None) -> list[Json]:
        return self._list_custom(PROGRAM_PLURAL, namespace)

    def patch_program_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self._patch_status(PROGRAM_PLURAL, namespace, name, status)

    # ------------------------------------------------------------ other objects

    def get_configmap(self, namespace: str, name: str) -> Json | None:
        """The ConfigMap as served (``binaryData`` base64), or None when it does not exist."""
        return self._get_or_none(
            f"reading ConfigMap {namespace}/{name}",
            lambda: _decode(self.core.read_namespaced_config_map(name, namespace, _preload_content=False)),
        )

    def apply_configmap(self, namespace: str, body: Json) -> None:
        """Create the ConfigMap, or replace its data if it exists."""
        name = body["metadata"]["name"]
        try:
            self.core.create_namespaced_config_map(namespace, cast(Any, body), _preload_content=False)
            return
        except ApiException as err:
            if err.status != 409:
                raise KubeError(f"creating ConfigMap {namespace}/{name}", int(err.status or 0), error_detail(err)) from None
        self._call(
            f"replacing ConfigMap {namespace}/{name}",
            lambda: self.core.patch_namespaced_config_map(
                name, namespace, {"data": body.get("data", {})}, _preload_content=False
            ),
        )

    def get_secret(self, namespace: str, name: str) -> Json | None:
        """The Secret (``data`` base64), or None when it does not exist."""
        return self._get_or_none(
            f"reading Secret {namespace}/{name}",
            lambda: _decode(self.core.read_namespaced_secret(name, namespace, _preload_content=False)),
        )

    def create_secret(self, namespace: str, body: Json) -> Json:
        """Create the Secret; :class:`AlreadyExists` when one of that name exists."""
        return self._create("Secret", namespace, body, self.core.create_namespaced_secret)

    def delete_secret(self, namespace: str, name: str, uid: str) -> None:
        """Delete the Secret of that name only if it is still the object ``uid``."""
        self._delete_if_same(f"deleting Secret {namespace}/{name}", lambda: self.core.delete_namespaced_secret(
            name, namespace, body=_precondition(uid), _preload_content=False
        ))

    def get_network_policy(self, namespace: str, name: str) -> Json | None:
        """The NetworkPolicy, or None when it does not exist."""
        return self._get_or_none(
            f"reading NetworkPolicy {namespace}/{name}",
            lambda: _decode(self.networking.read_namespaced_network_policy(name, namespace, _preload_content=False)),
        )

    def create_network_policy(self, namespace: str, body: Json) -> Json:
        """Create the NetworkPolicy; :class:`AlreadyExists` when one of that name exists."""
        return self._create("NetworkPolicy", namespace, body, self.networking.create_namespaced_network_policy)

    def replace_network_policy(self, namespace: str, name: str, body: Json) -> Json:
        """Replace the NetworkPolicy with ``body``, whose ``metadata.resourceVersion`` is the one read
        (a :class:`KubeError` of status 409 when it changed since)."""
        try:
            return _decode(self.networking.replace_namespaced_network_policy(
                name, namespace, cast(Any, body), field_manager=FIELD_MANAGER, _preload_content=False
            ))
        except ApiException as err:
            raise KubeError(f"replacing NetworkPolicy {namespace}/{name}", int(err.status or 0), error_detail(err)) from None

    def delete_network_policy(self, namespace: str, name: str, uid: str) -> None:
        """Delete the NetworkPolicy of that name only if it is still the object ``uid``."""
        self._delete_if_same(
            f"deleting NetworkPolicy {namespace}/{name}",
            lambda: self.networking.delete_namespaced_network_policy(
                name, namespace, body=_precondition(uid), _preload_content=False
            ),
        )

    def priority_value(self, priority_class: str) -> int | None:
        """The value of a PriorityClass, or None when it does not exist."""
        found = self._get_or_none(
            f"reading PriorityClass {priority_class}",
            lambda: _decode(
                self.scheduling.read_priority_class(priority_class, _preload_content=False)
            ),
        )
        return None if found is None else int(found.get("value", 0))

    def post_event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Record a core/v1 Event about ``obj`` (shown by ``kubectl describe``)."""
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        now = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", ""),
                "kind": obj.get("kind", ""),
                "name": meta["name"],
                "namespace": namespace,
                "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call(
            f"recording event {reason} on {namespace}/{meta['name']}",
            lambda: self.core.create_namespaced_event(namespace, cast(Any, event), _preload_content=False),
        )
