"""Kube-Pathways objects through the Kubernetes API, as the ``pathways`` CLI sees them.

The CLI is a client like kubectl: it reads a kubeconfig (``--kubeconfig``, else
``KUBECONFIG``, else ``~/.kube/config``; in a pod, the service account), picks a context
(``--context``) and a namespace (``-n``, else the context's, else ``default``), and talks
to the API server with the kubernetes python client. Nothing here talks to the operator:
what ``pathways status`` shows is what the operator wrote into ``status``, so it works
the same whether the operator is running, restarting or absent.

Two halves:

* typed, read-only views of the objects the CLI shows (:class:`SliceView`,
  :class:`ProgramView`, :class:`PodView`, :class:`EventView`), parsed once from the JSON
  the API returns, with the CRDs' documented defaults applied -- renderers take these,
  never raw dicts;
* :class:`Kube`, a session for one cluster: list/get/create of the two custom resources,
  ConfigMaps, pods, events and pod logs, with every API failure turned into a
  :class:`KubeError` whose message says what to do (install the CRDs, check the context,
  ask for RBAC, ...).

The resource names below must match ``crds/`` and the operator's
``pathways_wire.kube_names``; the client package may not import the operator,
so they are repeated here, once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pathways_wire.errors import PathwaysError
from pathways_wire.kube_names import GROUP, HOST_INDEX_LABEL, PROGRAM_KIND, PROGRAM_PLURAL, SLICE_LABEL, SLICE_PLURAL, VERSION

DEFAULT_MAX_RESTARTS = 3
TERMINAL_PROGRAM_PHASES = frozenset({"Succeeded", "Failed"})
REQUEST_TIMEOUT = (5.0, 30.0)
"""(connect, read) seconds for every API call: a CLI must not hang on a dead server."""

Manifest = dict[str, Any]
"""A Kubernetes object as JSON (what the API returns, what ``-o yaml`` prints)."""


class KubeError(PathwaysError):
    """An API call failed; the message names the object and what to do."""


class NotFoundError(KubeError):
    """The named object (or the CRD that serves it) does not exist."""


# -- views -------------------------------------------------------------------------------


def parse_time(text: object) -> datetime | None:
    """An RFC 3339 timestamp as the API writes it, or None when absent or malformed."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _int(value: object, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class Condition:
    """One metav1-style condition of a slice or program."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition: datetime | None = None

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> Condition:
        return cls(
            type=_str(raw.get("type")),
            status=_str(raw.get("status")) or "Unknown",
            reason=_str(raw.get("reason")),
            message=_str(raw.get("message")),
            last_transition=parse_time(raw.get("lastTransitionTime")),
        )


def _conditions(status: Mapping[str, Any]) -> tuple[Condition, ...]:
    return tuple(Condition.from_object(_map(c)) for c in _list(status.get("conditions")))


@dataclass(frozen=True)
class Host:
    """One entry of ``VirtualSlice.status.hosts``: a worker pod of the gang."""

    index: int
    pod: str = ""
    node: str = ""
    pod_ip: str = ""
    devices: int = 0


@dataclass(frozen=True)
class SliceView:
    """A VirtualSlice: the spec the user asked for and the status the operator wrote."""

    namespace: str
    name: str
    devices: int
    devices_per_host: int | None = None
    island_pin: str = ""
    max_restarts: int = DEFAULT_MAX_RESTARTS
    suspend: bool = False
    created: datetime | None = None
    phase: str = ""
    island: str = ""
    ready_hosts: str = ""
    restarts: int = 0
    conditions: tuple[Condition, ...] = ()
    hosts: tuple[Host, ...] = ()
    reconciled: bool = False

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> SliceView:
        meta, spec, status = _map(raw.get("metadata")), _map(raw.get("spec")), _map(raw.get("status"))
        dph = spec.get("devicesPerHost")
        return cls(
            namespace=_str(meta.get("namespace")),
            name=_str(meta.get("name")),
            devices=_int(spec.get("devices")),
            devices_per_host=_int(dph) if _int(dph) > 0 else None,
            island_pin=_str(spec.get("island")),
            max_restarts=_int(_map(spec.get("failurePolicy")).get("maxRestarts"), DEFAULT_MAX_RESTARTS),
            suspend=bool(spec.get("suspend", False)),
            created=parse_time(meta.get("creationTimestamp")),
            phase=_str(status.get("phase")),
            island=_str(status.get("island")),
            ready_hosts=_str(status.get("readyHosts")),
            restarts=_int(status.get("restarts")),
            conditions=_conditions(status),
            hosts=tuple(
                Host(
                    index=_int(h.get("index")),
                    pod=_str(h.get("pod")),
                    node=_str(h.get("node")),
                    pod_ip=_str(h.get("podIP")),
                    devices=_int(h.get("devices")),
                )
                for h in map(_map, _list(status.get("hosts")))
            ),
            reconciled=bool(status),
        )

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def waiting_reason(self) -> Condition | None:
        """Why the gang is not placed: the Admitted condition while it is False."""
        admitted = self.condition("Admitted")
        return admitted if admitted is not None and admitted.status == "False" else None


@dataclass(frozen=True)
class ProgramSlice:
    """One entry of ``PathwaysProgram.spec.slices``: a shared VirtualSlice or an inline one."""

    name: str
    ref: str = ""
    template_devices: int = 0

    @property
    def inline(self) -> bool:
        return not self.ref


@dataclass(frozen=True)
class ProgramView:
    """A PathwaysProgram: its slices, source and progress."""

    namespace: str
    name: str
    slices: tuple[ProgramSlice, ...] = ()
    entrypoint: str = ""
    config_map: str = ""
    steps: int = 1
    weight: float = 1.0
    suspend: bool = False
    created: datetime | None = None
    phase: str = ""
    steps_completed: int = 0
    slice_names: str = ""
    conditions: tuple[Condition, ...] = ()
    start_time: datetime | None = None
    completion_time: datetime | None = None
    results_config_map: str = ""
    message: str = ""
    reconciled: bool = False

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> ProgramView:
        meta, spec, status = _map(raw.get("metadata")), _map(raw.get("spec")), _map(raw.get("status"))
        source = _map(spec.get("source"))
        weight = spec.get("weight", 1)
        return cls(
            namespace=_str(meta.get("namespace")),
            name=_str(meta.get("name")),
            slices=tuple(
                ProgramSlice(
                    name=_str(s.get("name")),
                    ref=_str(s.get("ref")),
                    template_devices=_int(_map(s.get("template")).get("devices")),
                )
                for s in map(_map, _list(spec.get("slices")))
            ),
            entrypoint=_str(source.get("entrypoint")),
            config_map=_str(_map(source.get("configMapRef")).get("name")),
            steps=_int(spec.get("steps"), 1),
            weight=float(weight) if isinstance(weight, (int, float)) else 1.0,
            suspend=bool(spec.get("suspend", False)),
            created=parse_time(meta.get("creationTimestamp")),
            phase=_str(status.get("phase")),
            steps_completed=_int(status.get("stepsCompleted")),
            slice_names=_str(status.get("sliceNames")),
            conditions=_conditions(status),
            start_time=parse_time(status.get("startTime")),
            completion_time=parse_time(status.get("completionTime")),
            results_config_map=_str(_map(status.get("results")).get("configMap")),
            message=_str(status.get("message")),
            reconciled=bool(status),
        )

    def virtual_slices(self) -> dict[str, str]:
        """Each slice name of the program -> the VirtualSlice it runs on.

        From ``status.sliceNames`` once the operator wrote it; before that, refs as given
        and inline slices by the operator's naming rule ``<program>-<slice name>``.
        """
        found: dict[str, str] = {}
        for pair in self.slice_names.split(","):
            key, sep, value = pair.partition("=")
            if sep and key.strip():
                found[key.strip()] = value.strip()
        for s in self.slices:
            found.setdefault(s.name, s.ref or f"{self.name}-{s.name}")
        return found

    @property
    def done(self) -> bool:
        return self.phase in TERMINAL_PROGRAM_PHASES


@dataclass(frozen=True)
class PodView:
    """A worker pod, as far as the CLI reports it."""

    namespace: str
    name: str
    slice: str = ""
    host_index: int | None = None
    node: str = ""
    pod_ip: str = ""
    phase: str = ""
    ready: bool = False
    restarts: int = 0
    containers: tuple[str, ...] = ()

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> PodView:
        meta, spec, status = _map(raw.get("metadata")), _map(raw.get("spec")), _map(raw.get("status"))
        labels = _map(meta.get("labels"))
        index = _str(labels.get(HOST_INDEX_LABEL))
        statuses = [_map(s) for s in _list(status.get("containerStatuses"))]
        return cls(
            namespace=_str(meta.get("namespace")),
            name=_str(meta.get("name")),
            slice=_str(labels.get(SLICE_LABEL)),
            host_index=int(index) if index.isdigit() else None,
            node=_str(spec.get("nodeName")),
            pod_ip=_str(status.get("podIP")),
            phase=_str(status.get("phase")),
            ready=any(
                _str(c.get("type")) == "Ready" and _str(c.get("status")) == "True"
                for c in map(_map, _list(status.get("conditions")))
            ),
            restarts=sum(_int(s.get("restartCount")) for s in statuses),
            containers=tuple(_str(_map(c).get("name")) for c in _list(spec.get("containers"))),
        )


@dataclass(frozen=True)
class EventView:
    """A core/v1 Event about a slice or program ("Admitted on island-a", ...)."""

    type: str
    reason: str
    message: str
    count: int = 1
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    source: str = ""

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> EventView:
        meta, series = _map(raw.get("metadata")), _map(raw.get("series"))
        last = (
            parse_time(series.get("lastObservedTime"))
            or parse_time(raw.get("lastTimestamp"))
            or parse_time(raw.get("eventTime"))
            or parse_time(meta.get("creationTimestamp"))
        )
        return cls(
            type=_str(raw.get("type")) or "Normal",
            reason=_str(raw.get("reason")),
            message=_str(raw.get("message")),
            count=max(_int(raw.get("count"), 1), _int(series.get("count"), 1)),
            first_seen=parse_time(raw.get("firstTimestamp")) or parse_time(raw.get("eventTime")) or last,
            last_seen=last,
            source=_str(_map(raw.get("source")).get("component")) or _str(raw.get("reportingComponent")),
        )


# -- the session -------------------------------------------------------------------------


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
        default_ns = _str(_map(chosen.get("context")).get("namespace")) or "default"
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
        message = _str(_map(body).get("message")) or str(err.reason)
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
        items = [dict(i) for i in _list(_map(out).get("items"))]
        return sorted(items, key=lambda o: (_str(o["metadata"].get("namespace")), _str(o["metadata"]["name"])))

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
        return {str(k): str(v) for k, v in _map(_map(out).get("data")).items()}

    # -- pods, events, logs --------------------------------------------------------------

    def pods(self, namespace: str, label_selector: str) -> list[PodView]:
        out = self._call(
            f"listing pods {label_selector} in namespace {namespace}",
            self._api("CoreV1Api").list_namespaced_pod, namespace, label_selector=label_selector,
        )  # fmt: skip
        pods = [PodView.from_object(_map(p)) for p in _list(_map(out).get("items"))]
        return sorted(pods, key=lambda p: (p.slice, p.host_index if p.host_index is not None else 1 << 30, p.name))

    def events(self, namespace: str, kind: str, name: str) -> list[EventView]:
        """Events about one object, oldest first."""
        out = self._call(
            f"listing events of {kind} {name} in namespace {namespace}",
            self._api("CoreV1Api").list_namespaced_event, namespace,
            field_selector=f"involvedObject.name={name},involvedObject.kind={kind}",
        )  # fmt: skip
        events = [EventView.from_object(_map(e)) for e in _list(_map(out).get("items"))]
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
        out = _map(self._call(f"listing {plural}.{GROUP} {where}", fn, *args, **selector))
        items = [dict(i) for i in _list(out.get("items"))]
        return items, _str(_map(out.get("metadata")).get("resourceVersion"))

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
                yield str(event["type"]), dict(_map(event.get("raw_object")))
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
