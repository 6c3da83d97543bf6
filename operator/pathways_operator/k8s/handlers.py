"""kopf wiring: a daemon per object that calls the reconcilers, and events that wake it.

Every VirtualSlice and every PathwaysProgram gets a kopf *daemon*: a loop that
calls the (blocking) reconciler in a worker thread, then sleeps for the delay
the reconciler asks for, or until something wakes it. Kopf starts these loops
for objects that exist when the operator starts (resume) and for new ones
(create), and stops them when an object is deleted, which makes the operator
level-based: a restart simply starts looking again.

What wakes a loop early: a change of the object's spec (``on.update``), an
event of one of a slice's pods, and, for programs, any change of a slice in
their namespace, an event of their driver pod (it started, it ended) and a step
their driver reported (``DriverPods``' ``wake``), and, where the operator keeps host
NetworkPolicies, a change or deletion of a slice's. The watch of Nodes keeps the Nodes the
gangs' looks read (``node_cache``), and wakes every slice and program when a Node is
added or changes in what admission reads of it (``inventory.admission_view``: it joined,
turned Ready, was uncordoned, its devices or labels changed), so a gang or driver
waiting for room looks again at once, not at its next look. Handlers here are a few lines
each; all decisions live in ``slices`` and ``programs`` (and, below them,
``pathways_operator.core``).

Deletion never waits on the operator for long: kopf's finalizer is removed once the
daemon has stopped (at once: a loop does not wait for a reconcile in progress; at worst
``cancellation_timeout``) and the deletion handler has succeeded or
used up its ``DELETE_RETRIES``, so an object the operator cannot serve (one stored before
the CRD refused its name, say) is still deleted by ``kubectl delete``.

Kopf's own bookkeeping (handler progress, the last-handled spec) is kept in
annotations with the ``pathways.dev`` prefix, not in ``status``: status is the
operator's report and is written only by the reconcilers, through the status
subresource, so a status write never looks like a spec change and no handler
triggers itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import kopf

from pathways_operator.k8s import log_context
from pathways_operator.k8s.host_policy import slice_of_host_policy
from pathways_operator.k8s.program_reconciler import ProgramReconciler
from pathways_wire.kube_names import (
    ANNOTATION_PREFIX,
    DRIVER_LABEL,
    GROUP,
    PROGRAM_PLURAL,
    SLICE_LABEL,
    SLICE_PLURAL,
    VERSION,
)
from pathways_operator.k8s.slice_reconciler import SliceReconciler

log = logging.getLogger(__name__)

Logger = logging.Logger | logging.LoggerAdapter[Any]
RECONCILE_THREADS = 32
ERROR_RETRY_S = 2.0
DELETE_RETRIES = 5
DELETE_BACKOFF_S = 3.0
"""A deletion clean-up that keeps failing is tried this many times, this far apart, then
given up (kopf records it as failed and posts a Warning Event), so the finalizer always
goes: what the clean-up missed is owned by the deleted object and garbage-collected."""
DAEMON_EXIT_WAIT_S = 0.1
"""How long kopf awaits the end of a stopped loop (it ends within a few event-loop cycles,
``_run_loop``) before it puts the object's deletion off for the daemon's whole
``cancellation_backoff`` (5 s); kopf's default counts ten cycles instead of awaiting the end."""


def slice_key(namespace: str, name: str) -> str:
    return f"slice:{namespace}/{name}"


def program_key(namespace: str, name: str) -> str:
    return f"program:{namespace}/{name}"


class Wakeups:
    """One asyncio.Event per object loop; :meth:`wake` may be called from any thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[str, asyncio.Event] = {}
        self._lock = threading.Lock()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def event(self, key: str) -> asyncio.Event:
        with self._lock:
            return self._events.setdefault(key, asyncio.Event())

    def drop(self, key: str) -> None:
        with self._lock:
            self._events.pop(key, None)

    def wake(self, key: str) -> None:
        loop = self._loop
        if loop is None:
            return
        with self._lock:
            event = self._events.get(key)
        if event is not None:
            loop.call_soon_threadsafe(event.set)

    def wake_prefix(self, prefix: str) -> None:
        with self._lock:
            keys = [k for k in self._events if k.startswith(prefix)]
        for key in keys:
            self.wake(key)


def configure(settings: kopf.OperatorSettings) -> None:
    """Kopf settings the operator relies on (see the module docstring)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/operator"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.background.cancellation_polling = 1.0
    settings.background.instant_exit_timeout = DAEMON_EXIT_WAIT_S


def _reconcile_about(key: str, reconcile: Callable[[], float]) -> float:
    """One reconcile in an executor thread, every line it logs naming ``key``."""
    with log_context.about(key):
        return reconcile()


async def _run_loop(
    key: str,
    reconcile: Callable[[], float],
    wakeups: Wakeups,
    executor: ThreadPoolExecutor,
    stopped: kopf.DaemonStopped,
    logger: Logger,
) -> None:
    """Reconcile ``key`` until ``stopped``, leaving as soon as it is, even during a reconcile.

    Kopf waits only ``DAEMON_EXIT_WAIT_S`` for a stopped daemon to end; one still running then
    holds its object's deletion for the daemon's whole ``cancellation_backoff``. A reconcile
    in progress when the object is deleted (the look that wrote the status a client waited
    for, say) finishes in its thread after the loop has gone; the deletion handler waits for
    it, as both take the reconciler's lock of the object.
    """
    event = wakeups.event(key)
    loop = asyncio.get_running_loop()
    log_context.set_for_task(key)
    stopping: asyncio.Future[Any] = asyncio.ensure_future(stopped.wait())
    reconciling: asyncio.Future[float] | None = None
    try:
        while not stopped:
            event.clear()
            reconciling = loop.run_in_executor(executor, functools.partial(_reconcile_about, key, reconcile))
            await asyncio.wait({reconciling, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not reconciling.done():
                return
            try:
                delay = reconciling.result()
            except Exception:
                logger.exception("reconciling %s failed; looking again in %.0f s", key, ERROR_RETRY_S)
                delay = ERROR_RETRY_S
            woken: asyncio.Future[Any] = asyncio.ensure_future(event.wait())
            await asyncio.wait({woken, stopping}, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
    finally:
        stopping.cancel()
        if reconciling is not None and not reconciling.done():
            reconciling.add_done_callback(functools.partial(_log_late_failure, key, logger))
        wakeups.drop(key)


def _log_late_failure(key: str, logger: Logger, reconciling: asyncio.Future[float]) -> None:
    """A reconcile that outlived its loop: nobody awaits it, so its failure is logged here."""
    if not reconciling.cancelled() and reconciling.exception() is not None:
        logger.error("reconciling %s failed after its loop stopped: %s", key, reconciling.exception())


class _Reconciler(Protocol):
    def reconcile(self, namespace: str, name: str) -> float: ...
    def deleted(self, namespace: str, name: str, uid: str) -> None: ...


def _register_kind(
    registry: kopf.OperatorRegistry,
    kind: str,
    plural: str,
    daemon_id: str,
    key_of: Callable[[str, str], str],
    reconciler: _Reconciler,
    wakeups: Wakeups,
    executor: ThreadPoolExecutor,
    *,
    after_delete: Callable[[], None] = lambda: None,
) -> None:
    """One kind's handlers: a reconcile loop per object, woken by changes, and its deletion.

    The deletion handler keeps the id kopf gave the functions these handlers were
    written as before (``register.<locals>.slice_deleted``), so the progress of a
    deletion under way survives an upgrade of the operator.
    """
    @kopf.daemon(GROUP, VERSION, plural, id=daemon_id, registry=registry,
                 cancellation_backoff=5.0, cancellation_timeout=10.0)
    async def loop(
        name: str, namespace: str | None, stopped: kopf.DaemonStopped, logger: Logger, **_: Any
    ) -> None:
        ns = namespace or "default"
        reconcile = functools.partial(reconciler.reconcile, ns, name)
        await _run_loop(key_of(ns, name), reconcile, wakeups, executor, stopped, logger)

    @kopf.on.create(GROUP, VERSION, plural, id="wake-on-create", registry=registry)
    @kopf.on.resume(GROUP, VERSION, plural, id="wake-on-resume", registry=registry)
    @kopf.on.update(GROUP, VERSION, plural, id="wake-on-update", field="spec", registry=registry)
    async def changed(name: str, namespace: str | None, **_: Any) -> None:
        wakeups.wake(key_of(namespace or "default", name))

    @kopf.on.delete(GROUP, VERSION, plural, id=f"register.<locals>.{kind}_deleted", registry=registry,
                    retries=DELETE_RETRIES, backoff=DELETE_BACKOFF_S)
    async def deleted(name: str, namespace: str | None, uid: str, **_: Any) -> None:
        running = asyncio.get_running_loop()
        await running.run_in_executor(executor, reconciler.deleted, namespace or "default", name, uid)
        after_delete()


def register(
    registry: kopf.OperatorRegistry,
    slices: SliceReconciler,
    programs: ProgramReconciler,
    wakeups: Wakeups,
) -> None:
    """Register every handler of the operator on ``registry``."""
    executor = ThreadPoolExecutor(max_workers=RECONCILE_THREADS, thread_name_prefix="reconcile")

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def started(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        wakeups.bind(asyncio.get_running_loop())

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        executor.shutdown(wait=False, cancel_futures=True)

    _register_kind(registry, "slice", SLICE_PLURAL, "gang", slice_key, slices, wakeups, executor,
                   after_delete=lambda: wakeups.wake_prefix("slice:"))  # queued slices may fit now

    @kopf.on.event(GROUP, VERSION, SLICE_PLURAL, registry=registry)
    async def slice_event(namespace: str | None, **_: Any) -> None:
        slices.cluster_changed()
        wakeups.wake_prefix(program_key(namespace or "default", ""))

    @kopf.on.event("", "v1", "pods", labels={SLICE_LABEL: kopf.PRESENT}, registry=registry)
    async def pod_event(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        slices.cluster_changed()
        wakeups.wake(slice_key(namespace or "default", labels[SLICE_LABEL]))

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(name: str, event: Mapping[str, Any], **_: Any) -> None:
        slices.cluster_changed()
        if event.get("type") == "DELETED":
            slices.nodes.gone(name)
        elif isinstance(event.get("object"), dict):
            changed = slices.nodes.seen(event["object"])
            if changed and event.get("type") in ("ADDED", "MODIFIED"):  # not a listing (type None)
                # A Node that joined, turned Ready, was uncordoned or grew may fit a queued
                # gang, or a driver waiting for a Node.
                log.info("Node %s %s what admission reads of it: every slice and program looks again",
                         name, "joined with" if event.get("type") == "ADDED" else "changed in")
                wakeups.wake_prefix("slice:")
                wakeups.wake_prefix("program:")

    if slices.keeps_host_policies:
        @kopf.on.event("networking.k8s.io", "v1", "networkpolicies", registry=registry)
        async def host_policy_event(
            name: str, namespace: str | None, event: Mapping[str, Any], **_: Any
        ) -> None:
            slice_name = slice_of_host_policy(name)
            if slice_name is None or event.get("type") not in ("MODIFIED", "DELETED"):
                return  # not a host policy, or one seen as it is (the operator made it, or starts)
            ns = namespace or "default"
            running = asyncio.get_running_loop()
            await running.run_in_executor(executor, slices.host_policy_changed, ns, slice_name)
            wakeups.wake(slice_key(ns, slice_name))

    _register_kind(registry, "program", PROGRAM_PLURAL, "run", program_key, programs, wakeups, executor)

    @kopf.on.event("", "v1", "pods", labels={DRIVER_LABEL: kopf.PRESENT}, registry=registry)
    async def driver_pod_event(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        slices.cluster_changed()
        wakeups.wake(program_key(namespace or "default", labels[DRIVER_LABEL]))
