"""Kube-Pathways objects through the Kubernetes API, as the ``pathways`` CLI sees them.

The CLI is a client like kubectl: it reads a kubeconfig (``--kubeconfig``, else
``KUBECONFIG``, else ``~/.kube/config``; in a pod, the service account), picks a context
(``--context``) and a namespace (``-n``, else the context's, else ``default``), and talks
to the API server with the kubernetes python client. Nothing here talks to the operator:
what ``pathways status`` shows is what the operator wrote into ``status``, so it works
the same whether the operator is running, restarting or absent.

:class:`Kube` is a session for one cluster: list/get/create of the two custom
resources, ConfigMaps, pods, events and pod logs, and watch streams, with every API
failure turned into a :class:`KubeError` whose message says what to do (install the
CRDs, check the context, ask for RBAC, ...). What it reads it hands back as the typed
views of :mod:`pathways.kube_views`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import yaml

from pathways.kube_views import EventView, PodView, json_list, json_map, json_str
from pathways_wire.errors import PathwaysError
from pathways_wire.kube_names import GROUP, PROGRAM_KIND, PROGRAM_PLURAL, SLICE_PLURAL, VERSION

REQUEST_TIMEOUT = (5.0, 30.0)
"""(connect, read) seconds for every API call: a CLI must not hang on a dead server."""

Manifest = dict[str, Any]
"""A Kubernetes object as JSON (what the API returns, what ``-o yaml`` prints)."""


class KubeError(PathwaysError):
    """An API call failed; the message names the object and what to do."""


class NotFoundError(KubeError):
    """The named object (or the CRD that serves it) does not exist."""


@dataclass
class Kube:
    """One cluster, one identity: what a kubeconfig context (or a pod's account) names."""

    api_client: Any
    namespace: str
    context: str = ""
    server: str = ""
    _apis: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def connect(
        cls, kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None
    ) -> Kube:
        """A session from the kubeconfig (or the in-cluster account), as kubectl would pick it."""
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        files = [p for p in path.split(os.pathsep) if p]
        have_file = any(os.path.exists(p) for p in files)
        if not have_file and kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            ns_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
            default_ns = open(ns_file).read().strip() if os.path.exists(ns_file) else "default"
            api_client = client.ApiClient()
            return cls(api_client, namespace or default_ns, "in-cluster", api_client.configuration.host)
        if not have_file:
            raise KubeError(
                f"no kubeconfig at {path}: pass --kubeconfig FILE, set KUBECONFIG, or create "
                "a cluster first (e.g. `make kind-up`)"
            )
        try:
            contexts, active = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
        except ConfigException as err:
            raise KubeError(f"kubeconfig {path}: {err}") from None
        except yaml.YAMLError as err:
            raise KubeError(f"kubeconfig {path} is not valid YAML: {' '.join(str(err).split())}") from None
        except OSError as err:
            raise KubeError(f"kubeconfig {path} cannot be read: {err}") from None
        names = [c["name"] for c in contexts or []]
        if context is not None and context not in names:
            raise KubeError(
                f"context {context!r} is not in kubeconfig {path} (contexts: {', '.join(names) or 'none'})"
            )
        chosen = next((c for c in contexts or [] if c["name"] == context), None) if context else active
        if chosen is None:
            raise KubeError(f"kubeconfig {path} has no current context: pass --context NAME ({', '.join(names)})")
        configuration = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=chosen["name"], client_configuration=configuration
            )
        except ConfigException as err:
            raise KubeError(f"kubeconfig {path}, context {chosen['name']!r}: {err}") from None
        default_ns = json_str(json_map(chosen.get("context")).get("namespace")) or "default"
        return cls(client.ApiClient(configuration), namespace or default_ns, chosen["name"], configuration.host)

    def close(self) -> None:
        self.api_client.close()

    def _api(self, name: str) -> Any:
        if name not in self._apis:
            from kubernetes import client

            self._apis[name] = getattr(client, name)(self.api_client)
        return self._apis[name]

    def _call(self, doing: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One API call, JSON in and out, failures as KubeError saying what to do."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            response = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as err:
            raise self._explain(doing, err) from None
        except (HTTPError, OSError) as err:
            raise KubeError(
                f"{doing}: cannot reach the API server at {self.server or 'the configured address'} "
                f"({type(err).__name__}: {err}); check --context/--kubeconfig and that the cluster is up"
            ) from None
        data = response.data
        return json.loads(data) if data else None

    def _explain(self, doing: str, err: Any) -> KubeError:
        try:
            body = json.loads(err.body or "{}")
        except (TypeError, ValueError):
            body = {}
        message = json_str(json_map(body).get("message")) or str(err.reason)
        if err.status == 404:
            if "could not find the requested resource" in message and GROUP in doing:
                return NotFoundError(
                    f"{doing}: the API server does not serve {GROUP}/{VERSION}: install the CRDs "
                    "(`helm install kube-pathways helm/kube-pathways` or `kubectl apply -f crds/`)"
                )
            return NotFoundError(f"{doing}: {message}")
        if err.status in (401, 403):
            return KubeError(
                f"{doing}: {message} (as context {self.context!r}); ask your cluster admin for "
                "access, or pick another --context"
            )
        if err.status == 409:
            return KubeError(f"{doing}: {message}")
        return KubeError(f"{doing}: HTTP {err.status}: {message}")

    # -- custom resources ----------------------------------------------------------------

    def _list_custom(self, plural: str, namespace: str | None) -> list[Manifest]:
        api = self._api("CustomObjectsApi")
        where = f"in namespace {namespace}" if namespace else "in all namespaces"
        if namespace is None:
            out = self._call(
                f"listing {plural}.{GROUP} {where}", api.list_cluster_custom_object, GROUP, VERSION, plural
            )
        else:
            out = self._call(
                f"listing {plural}.{GROUP} {where}",
                api.list_namespaced_custom_object, GROUP, VERSION, namespace, plural,
            )  # fmt: skip
        items = [dict(i) for i in json_list(json_map(out).get("items"))]
        return sorted(items, key=lambda o: (json_str(o["metadata"].get("namespace")), json_str(o["metadata"]["name"])))

    def _get_custom(self, plural: str, namespace: str, name: str) -> Manifest:
        api = self._api("CustomObjectsApi")
        out = self._call(
            f'getting {plural}.{GROUP} "{name}" in namespace {namespace}',
            api.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name,
        )  # fmt: skip
        return dict(out)

    def list_slices(self, namespace: str | None) -> list[Manifest]:
        """VirtualSlices of one namespace, or of all (``None``), by namespace and name."""
        return self._list_custom(SLICE_PLURAL, namespace)

    def list_programs(self, namespace: str | None) -> list[Manifest]:
        return self._list_custom(PROGRAM_PLURAL, namespace)

    def get_slice(self, namespace: str, name: str) -> Manifest:
        return self._get_custom(SLICE_PLURAL, namespace, name)

    def get_program(self, namespace: str, name: str) -> Manifest:
        return self._get_custom(PROGRAM_PLURAL, namespace, name)

    def create(self, obj: Mapping[str, Any], namespace: str) -> Manifest:
        """Creates a ConfigMap or a PathwaysProgram; an existing one is an error, never replaced."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        doing = f'creating {kind} "{name}" in namespace {namespace}'
        if kind == "ConfigMap":
            return dict(self._call(doing, self._api("CoreV1Api").create_namespaced_config_map, namespace, obj))
        if kind == PROGRAM_KIND:
            api = self._api("CustomObjectsApi")
            out = self._call(doing, api.create_namespaced_custom_object, GROUP, VERSION, namespace, PROGRAM_PLURAL, obj)
            return dict(out)
        raise KubeError(f"{doing}: the CLI creates only ConfigMaps and PathwaysPrograms")

    def adopt_config_map(self, namespace: str, name: str, owner: Mapping[str, Any]) -> None:
        """Makes ``owner`` (a created object) the ConfigMap's owner, so deleting it deletes both."""
        meta = owner["metadata"]
        reference = {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
        }
        self._call(
            f'setting the owner of ConfigMap "{name}" to {owner["kind"]} "{meta["name"]}"',
            self._api("CoreV1Api").patch_namespaced_config_map,
            name, namespace, {"metadata": {"ownerReferences": [reference]}},
        )  # fmt: skip

    def config_map_data(self, namespace: str, name: str) -> dict[str, str]:
        """A ConfigMap's ``data``; :class:`NotFoundError` when it does not exist."""
        out = self._call(
            f'getting ConfigMap "{name}" in namespace {namespace}',
            self._api("CoreV1Api").read_namespaced_config_map, name, namespace,
        )  # fmt: skip
        return {str(k): str(v) for k, v in json_map(json_map(out).get("data")).items()}

    # -- pods, events, logs --------------------------------------------------------------

    def pods(self, namespace: str, label_selector: str) -> list[PodView]:
        out = self._call(
            f"listing pods {label_selector} in namespace {namespace}",
            self._api("CoreV1Api").list_namespaced_pod, namespace, label_selector=label_selector,
        )  # fmt: skip
        pods = [PodView.from_object(json_map(p)) for p in json_list(json_map(out).get("items"))]
        return sorted(pods, key=lambda p: (p.slice, p.host_index if p.host_index is not None else 1 << 30, p.name))

    def events(self, namespace: str, kind: str, name: str) -> list[EventView]:
        """Events about one object, oldest first."""
        out = self._call(
            f"listing events of {kind} {name} in namespace {namespace}",
            self._api("CoreV1Api").list_namespaced_event, namespace,
            field_selector=f"involvedObject.name={name},involvedObject.kind={kind}",
        )  # fmt: skip
        events = [EventView.from_object(json_map(e)) for e in json_list(json_map(out).get("items"))]
        epoch = datetime.min.replace(tzinfo=timezone.utc)
        return sorted(events, key=lambda e: e.last_seen or epoch)

    def pod_log(self, namespace: str, pod: str, container: str, tail: int | None = None) -> str:
        """A container's log through the API server (which asks the node's kubelet)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        kwargs: dict[str, Any] = {"container": container}
        if tail is not None:
            kwargs["tail_lines"] = tail
        doing = f"reading the log of container {container} of pod {pod} in namespace {namespace}"
        try:
            response = self._api("CoreV1Api").read_namespaced_pod_log(
                pod, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs
            )
        except ApiException as err:
            raise self._explain(doing, err) from None
        except (HTTPError, OSError) as err:
            raise KubeError(f"{doing}: {type(err).__name__}: {err}") from None
        data: bytes = response.data
        return data.decode("utf-8", "replace")


    # -- watching ------------------------------------------------------------------------

    def list_custom(
        self, plural: str, namespace: str | None, name: str | None = None
    ) -> tuple[list[Manifest], str]:
        """VirtualSlices or PathwaysPrograms (``plural``; only ``name``'s when given) and the
        list's resourceVersion to watch from."""
        api = self._api("CustomObjectsApi")
        where = f"in namespace {namespace}" if namespace else "in all namespaces"
        args = (GROUP, VERSION, plural) if namespace is None else (GROUP, VERSION, namespace, plural)
        fn = api.list_cluster_custom_object if namespace is None else api.list_namespaced_custom_object
        selector = {"field_selector": f"metadata.name={name}"} if name else {}
        out = json_map(self._call(f"listing {plural}.{GROUP} {where}", fn, *args, **selector))
        items = [dict(i) for i in json_list(out.get("items"))]
        return items, json_str(json_map(out.get("metadata")).get("resourceVersion"))

    def watch_custom(
        self, plural: str, namespace: str | None, resource_version: str, timeout_s: int,
        watcher: Any = None, name: str | None = None,
    ) -> Iterator[tuple[str, Manifest]]:  # fmt: skip
        """Changes to ``plural`` (``name`` only, when given) after ``resource_version``, as
        (type, object), for at most ``timeout_s`` seconds.

        ``watcher`` is the :class:`kubernetes.watch.Watch` to stream with, so that another
        thread can ``stop()`` it. Bookmarks come through (type ``BOOKMARK``) to carry the
        resourceVersion forward; a version the server no longer has raises
        :class:`ResourceVersionGone` (list again); a dropped connection
        :class:`WatchInterrupted` (watch again from the last version).
        """
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        api = self._api("CustomObjectsApi")
        where = f"in namespace {namespace}" if namespace else "in all namespaces"
        doing = f"watching {plural}.{GROUP} {where}"
        args = (GROUP, VERSION, plural) if namespace is None else (GROUP, VERSION, namespace, plural)
        fn = api.list_cluster_custom_object if namespace is None else api.list_namespaced_custom_object
        stream = watcher if watcher is not None else watch.Watch()  # type: ignore[no-untyped-call]
        selector = {"field_selector": f"metadata.name={name}"} if name else {}
        try:
            for event in stream.stream(
                fn, *args, resource_version=resource_version, timeout_seconds=timeout_s, **selector,
                allow_watch_bookmarks=True, _request_timeout=(REQUEST_TIMEOUT[0], timeout_s + REQUEST_TIMEOUT[1]),
            ):  # fmt: skip
                yield str(event["type"]), dict(json_map(event.get("raw_object")))
        except ApiException as err:
            if err.status == 410:
                gone = f"{doing}: resourceVersion {resource_version} is gone: {err.reason}"
                raise ResourceVersionGone(gone) from None
            raise self._explain(doing, err) from None
        except (HTTPError, OSError) as err:
            raise WatchInterrupted(f"{doing}: the connection to {self.server} dropped ({type(err).__name__})") from None
        finally:
            stream.stop()


class ResourceVersionGone(KubeError):
    """HTTP 410: the server no longer keeps the version a watch asked to start from."""


class WatchInterrupted(KubeError):
    """A watch's connection ended before its timeout; watching again from the last version goes on."""
