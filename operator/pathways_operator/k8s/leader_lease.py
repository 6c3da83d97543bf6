"""The operator's Lease (coordination.k8s.io/v1): it acts only while it holds it.

With ``--leader-election=on`` the operator takes the Lease ``--leader-election-lease``
in its own namespace before it starts anything (the controller, kopf's handlers),
waits while another operator holds it, renews it in a thread of its own, and stops
the process at once (exit status 1) when it could not renew it within the renew
deadline: a second replica, an operator started by hand against the same cluster, or
an old pod cut off from the API server while its replacement starts never acts at the
same time as the leader. The decisions are ``core.leadership``'s; here they are read
from and written to the API, each write naming the resourceVersion it read, so two
operators that try at once cannot both win. A clean stop gives the Lease back.

Every request has a timeout shorter than the renew period, so a hung request cannot
carry a leader past its deadline.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from pathways_operator.core.leadership import Act, LeaseRecord, Leadership, renewal_lost
from pathways_operator.k8s.cluster_api import error_detail

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 15.0
"""How long a Lease holds without renewal (client-go's default); the renew deadline is
two thirds of it and the retry period a seventh and a half, as there (10 s, 2 s)."""
MIN_LEASE_S = 1.0
"""The shortest Lease: below it a renewal's round trip to the API server takes a good
part of the renew deadline."""


def lease_length_problem(duration_s: float) -> str:
    """Why a Lease of ``duration_s`` cannot be kept ("" if it can)."""
    if duration_s < MIN_LEASE_S:
        return f"a Lease of {duration_s:g} s is too short to renew (at least {MIN_LEASE_S:g} s)"
    return ""


def _micro_time(at: float) -> str:
    """A Lease timestamp (MicroTime) for the epoch time ``at``."""
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _why(err: Exception) -> str:
    """An API failure in a line: its status and the API server's message."""
    return f"HTTP {err.status}: {error_detail(err)}" if isinstance(err, ApiException) else str(err)


def _acquired(lease: dict[str, Any]) -> str:
    """When the Lease's holder took it, as written ("" if not written)."""
    return str((lease.get("spec") or {}).get("acquireTime") or "")


def _record(lease: dict[str, Any]) -> LeaseRecord:
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        renewed=str(spec.get("renewTime") or ""),
        duration_s=float(spec.get("leaseDurationSeconds") or DEFAULT_LEASE_S),
        transitions=int(spec.get("leaseTransitions") or 0),
    )


class LeaderLease:
    """Takes, keeps and gives back the operator's Lease ``namespace/name`` as ``identity``."""

    def __init__(
        self,
        api_client: kclient.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        duration_s: float = DEFAULT_LEASE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not namespace:
            raise ValueError("the operator's Lease needs a namespace")
        problem = lease_length_problem(duration_s)
        if problem:
            raise ValueError(problem)
        self._api = kclient.CoordinationV1Api(api_client)
        self.namespace, self.name = namespace, name
        self._leadership = Leadership(identity)
        self.duration_s = duration_s
        self.renew_deadline_s = duration_s * 2 / 3
        self.retry_s = duration_s / 7.5
        self._clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        """Held around each look at the Lease, so giving it back never races a renewal."""

    @property
    def identity(self) -> str:
        return self._leadership.identity

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    # ------------------------------------------------------------ API

    def _read(self) -> dict[str, Any] | None:
        try:
            reply = self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self.retry_s
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        found: dict[str, Any] = json.loads(cast(Any, reply).data)
        return found

    def _body(self, holder: str, transitions: int, acquired: str, version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if version is not None:
            metadata["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": max(1, round(self.duration_s)),
                "acquireTime": acquired,
                "renewTime": _micro_time(time.time()),
                "leaseTransitions": transitions,
            },
        }

    def _replace(self, lease: dict[str, Any], holder: str, transitions: int, acquired: str,
                 duration_s: int | None = None) -> None:
        """Writes the Lease over ``lease`` as read, naming its resourceVersion, so that a write
        by another operator since makes this one fail (409). ``duration_s`` overrides the
        Lease's length (a Lease given back holds 1 s)."""
        body = self._body(holder, transitions, acquired, str(lease["metadata"].get("resourceVersion") or ""))
        if duration_s is not None:
            body["spec"]["leaseDurationSeconds"] = duration_s
        self._api.replace_namespaced_lease(self.name, self.namespace, cast(Any, body),
                                           _preload_content=False, _request_timeout=self.retry_s)

    def _try(self) -> tuple[Act, str]:
        """One look at the Lease and what it led to: the act carried out (WAIT: none), and
        while waiting, who holds it. A write that lost a race to another operator waits."""
        with self._lock:
            lease = self._read()
            record = None if lease is None else _record(lease)
            step = self._leadership.observe(record, self._clock())
            if step.act is Act.WAIT:
                return Act.WAIT, step.holder
            now = _micro_time(time.time())
            try:
                if lease is None:
                    self._api.create_namespaced_lease(
                        self.namespace, cast(Any, self._body(self.identity, 0, now, None)),
                        _preload_content=False, _request_timeout=self.retry_s,
                    )
                else:
                    acquired = (_acquired(lease) or now) if step.act is Act.RENEW else now
                    self._replace(lease, self.identity, step.transitions, acquired)
            except ApiException as err:
                if err.status == 409:  # another operator wrote it first
                    return Act.WAIT, "another operator"
                raise
            return step.act, self.identity

    # ------------------------------------------------------------ life cycle

    def acquire(self) -> None:
        """Waits until this operator holds the Lease: a follower waits for as long as another leads."""
        told = failed = ""
        while True:
            try:
                act, holder = self._try()
            except (ApiException, OSError, ValueError) as err:
                act, holder = Act.WAIT, ""
                why = _why(err)
                if why != failed:  # once per distinct failure, not every period
                    hint = (f": grant get, create and update on leases.coordination.k8s.io in namespace "
                            f"{self.namespace}, or run with --leader-election=off"
                            if isinstance(err, ApiException) and err.status == 403 else "")
                    log.warning("taking %s failed (%s)%s; trying again every %.1f s", self.where, why, hint,
                                self.retry_s)
                    failed = why
            if act is not Act.WAIT:
                log.info("%s taken by %s: this operator leads", self.where, self.identity)
                return
            if holder and holder != told:
                log.info("%s is held by %s: waiting until it is given back or lapses", self.where, holder)
                told = holder
            time.sleep(self.retry_s)

    def keep(self, lost: Callable[[str], None]) -> None:
        """Renews the Lease every retry period in a thread; calls ``lost`` (which must stop
        the operator) once it could not for the renew deadline, or another holds it."""
        def renew() -> None:
            last = self._clock()
            while not self._stop.wait(self.retry_s):
                try:
                    act, holder = self._try()
                except (ApiException, OSError, ValueError) as err:
                    act, holder = Act.WAIT, ""
                    log.warning("renewing %s failed: %s", self.where, _why(err))
                if self._stop.is_set():
                    return
                if act is not Act.WAIT:
                    last = self._clock()
                elif holder:
                    lost(f"{self.where} is held by {holder} now")
                    return
                if renewal_lost(last, self._clock(), self.renew_deadline_s):
                    lost(f"{self.where} was not renewed for {self.renew_deadline_s:.1f} s")
                    return

        threading.Thread(target=renew, name="leader-lease", daemon=True).start()

    def release(self) -> None:
        """Stops renewing and gives the Lease back if this operator still holds it."""
        self._stop.set()
        with self._lock:
            try:
                lease = self._read()
                if lease is None:
                    return
                record = _record(lease)
                if record.holder != self.identity:
                    return
                self._replace(lease, "", record.transitions, _acquired(lease) or _micro_time(time.time()),
                              duration_s=1)
                log.info("%s given back", self.where)
            except (ApiException, OSError) as err:
                log.warning("giving back %s failed (%s); it lapses in %.0f s", self.where, _why(err),
                            self.duration_s)
