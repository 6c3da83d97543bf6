"""What the slice machine decides about a gang's objects, carried out against the API.

Pods are created and bound by the operator itself (``schedulerName: pathways``,
the Binding API) in the order of the machine's pod plan; a pod of that name
that the slice does not control is never used or deleted (:class:`PodInTheWay`),
and a pod the API server refuses on its merits ends the plan
(:class:`PodRefused`). Each slice's token (the credential its hosts demand)
lives in a Secret the slice controls, created before it is admitted
(:func:`slice_secret`), and, where the operator is told to, a NetworkPolicy in
front of its hosts is made before its first pod (:func:`slice_host_policy`). The
operator acts only on objects whose controller ownerReference is the slice's uid
(``core.ownership``).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
from collections.abc import Sequence

from pathways_wire.slice_token import new_token
from pathways_operator.core.ownership import Ownership, describe_controller, owner_refs, ownership
from pathways_operator.core.reasons import Reason
from pathways_operator.core.slice_look import (
    BindHostPod,
    CreateHostPod,
    DeletePods,
    InTheWay,
    PodStep,
)
from pathways_operator.core.slice_phase import SliceRecord
from pathways_operator.k8s.cluster_api import AlreadyExists, ClusterApi, Json, KubeError
from pathways_operator.k8s.gang_pods import (
    TOKEN_KEY,
    PodView,
    WorkerDefaults,
    host_pod_manifest,
    token_secret_manifest,
    token_secret_name,
)
from pathways_operator.k8s.host_policy import OperatorPods, host_policy_manifest, host_policy_name
from pathways_operator.k8s.inventory import Reservation
from pathways_wire.kube_names import FAILURE_ANNOTATION, RESTARTS_ANNOTATION, SLICE_KIND, SLICE_LABEL
from pathways_operator.k8s.virtual_slice import VirtualSliceObject

log = logging.getLogger(__name__)

REFUSED_STATUSES = frozenset({400, 403, 422})
"""HTTP statuses of a pod creation the API server refused on its merits (quota, policy, validation)."""


class PodRefused(Exception):
    """Creating a pod of the gang was refused by the API server; carries its answer."""

    def __init__(self, error: KubeError) -> None:
        super().__init__(str(error))
        self.error = error


class PodInTheWay(Exception):
    """Creating a host pod found a pod of that name that the slice does not control."""

    def __init__(self, pod: str, why: InTheWay) -> None:
        super().__init__(why.message)
        self.pod = pod
        self.why = why


@dataclasses.dataclass(frozen=True)
class SliceSecret:
    """The slice's own token Secret: the hosts' credential."""

    uid: str
    token: str


def pod_ownership(vslice: VirtualSliceObject, pod: Json) -> Ownership:
    return ownership(owner_refs(pod.get("metadata") or {}), kind=SLICE_KIND, name=vslice.name, uid=vslice.uid)


def foreign_pod(vslice: VirtualSliceObject, name: str, pod: Json) -> InTheWay:
    refs = owner_refs(pod.get("metadata") or {})
    return InTheWay(
        f"pod {vslice.namespace}/{name} exists and is not this VirtualSlice's ({describe_controller(refs)}); "
        "host pods of the slice take that name and the operator neither uses nor deletes a pod it does "
        "not control: delete or rename that pod, or give the VirtualSlice another name",
        warning=True,
    )


def carry_out_pod_plan(
    api: ClusterApi,
    vslice: VirtualSliceObject,
    reservation: Reservation,
    steps: Sequence[PodStep],
    defaults: WorkerDefaults,
) -> list[str]:
    """Create and bind as planned; returns what each creation reported ("pod x-1 created on m").

    Raises :class:`PodRefused` or :class:`PodInTheWay`, which end the plan.
    """
    reports = []
    for step in steps:
        if isinstance(step, BindHostPod):
            api.bind_pod(vslice.namespace, step.pod, step.machine)
        elif isinstance(step, CreateHostPod):
            reports.append(_create(api, vslice, reservation, step, defaults))
    return [r for r in reports if r]


def _create(
    api: ClusterApi,
    vslice: VirtualSliceObject,
    reservation: Reservation,
    step: CreateHostPod,
    defaults: WorkerDefaults,
) -> str:
    host = reservation.placement.hosts[step.index]
    manifest = host_pod_manifest(
        vslice, reservation.placement, host.index, reservation.generation, defaults,
    )
    name = manifest["metadata"]["name"]
    try:
        api.create_pod(vslice.namespace, manifest)
    except AlreadyExists:
        found = api.get_pod(vslice.namespace, name)
        if found is None:
            return f"pod {name} was deleted while creating it; creating it again"
        owner = pod_ownership(vslice, found)
        if owner is Ownership.FOREIGN:
            raise PodInTheWay(name, foreign_pod(vslice, name, found)) from None
        if owner is Ownership.EARLIER:
            return f"pod {name} of an earlier VirtualSlice {vslice.name} is still terminating"
        return f"pod {name} of an earlier gang of this slice is still terminating"
    except KubeError as err:
        if err.status in REFUSED_STATUSES:
            raise PodRefused(err) from None
        raise
    api.bind_pod(vslice.namespace, name, host.machine)
    log.info("%s: created pod %s bound to %s", vslice.key, name, host.machine)
    return f"pod {name} created on {host.machine}"


def delete_pods(api: ClusterApi, vslice: VirtualSliceObject, action: DeletePods) -> None:
    """Delete the gang's pods; those on a deleted Node at once (grace 0: no kubelet will confirm)."""
    for pod in action.pods:
        if not isinstance(pod, PodView) or pod.controller_uid != vslice.uid:
            log.error("%s: not deleting pod %s: it is not this slice's", vslice.key, pod.name)
            continue
        if pod.name in action.at_once:
            api.delete_pod(pod.namespace, pod.name, pod.uid, grace_seconds=0)
        elif not pod.deleting:
            api.delete_pod(pod.namespace, pod.name, pod.uid)


def slice_secret(api: ClusterApi, vslice: VirtualSliceObject) -> SliceSecret | InTheWay:
    """The slice's token Secret (made first if missing), or what is in its way.

    The Secret is used only if this slice controls it: one of that name that is
    someone else's is neither adopted nor changed, and the slice says so.
    """
    namespace, name = vslice.namespace, token_secret_name(vslice.name)
    secret = api.get_secret(namespace, name)
    if secret is None:
        try:
            secret = api.create_secret(namespace, token_secret_manifest(vslice, new_token()))
        except AlreadyExists:
            return InTheWay(f"Secret {namespace}/{name} appeared while creating it; looking again")
        log.info("%s: created Secret %s with the slice token", vslice.key, name)
    meta = secret["metadata"]
    not_ours = _not_the_slices(vslice, "Secret", meta)
    if not_ours is not None:
        return not_ours
    raw = (secret.get("data") or {}).get(TOKEN_KEY, "")
    token = base64.b64decode(raw).decode() if raw else ""
    if not token:
        return InTheWay(
            f"Secret {namespace}/{name} has no data.{TOKEN_KEY}; delete it and the operator makes a new one",
            warning=True,
        )
    return SliceSecret(uid=str(meta.get("uid") or ""), token=token)


def slice_host_policy(api: ClusterApi, vslice: VirtualSliceObject, operator: OperatorPods) -> InTheWay | None:
    """The NetworkPolicy in front of the slice's hosts, made if missing and its spec put back if
    changed; None once it is the slice's own, else what is in its way. No pod is created
    before it is, and a gang whose policy cannot be kept is stopped (fail closed)."""
    namespace, name = vslice.namespace, host_policy_name(vslice.name)
    desired = host_policy_manifest(vslice, operator)
    try:
        policy = api.get_network_policy(namespace, name)
        if policy is None:
            try:
                policy = api.create_network_policy(namespace, desired)
            except AlreadyExists:
                return InTheWay(f"NetworkPolicy {namespace}/{name} appeared while creating it; looking again")
            log.info("%s: created NetworkPolicy %s in front of its hosts", vslice.key, name)
        not_ours = _not_the_slices(vslice, "NetworkPolicy", policy["metadata"])
        if not_ours is not None:
            return not_ours
        _restore_host_policy(api, vslice, policy, desired)
    except KubeError as err:
        if err.status != 403:
            raise
        return InTheWay(
            f"the operator may not read, create or restore NetworkPolicy {namespace}/{name} ({err}); no "
            "host runs without it: grant the operator get, create, update, list and watch on "
            "networkpolicies.networking.k8s.io, or run it with --host-network-policy=off",
            warning=True,
            reason=Reason.HOST_POLICY_FORBIDDEN,
        )
    return None


def _restore_host_policy(api: ClusterApi, vslice: VirtualSliceObject, policy: Json, desired: Json) -> None:
    """Put the slice's own spec back into its NetworkPolicy ``policy`` if it was changed.

    The replacement names the resourceVersion read: a policy changed again meanwhile
    fails it (HTTP 409), and the reconciler looks again.
    """
    if policy.get("spec") == desired["spec"]:
        return
    meta = policy["metadata"]
    body = {**desired, "metadata": {**desired["metadata"], "resourceVersion": meta.get("resourceVersion")}}
    api.replace_network_policy(vslice.namespace, meta["name"], body)
    log.warning("%s: NetworkPolicy %s had been changed; its spec is the slice's own again",
                vslice.key, meta["name"])


def _not_the_slices(vslice: VirtualSliceObject, kind: str, meta: Json) -> InTheWay | None:
    """Why the ``kind`` object with ``meta``, named for the slice, is in its way: an earlier
    slice's (the garbage collector deletes it) or no slice's; None when it is this slice's."""
    where = f"{kind} {vslice.namespace}/{meta.get('name', '')}"
    refs = owner_refs(meta)
    owner = ownership(refs, kind=SLICE_KIND, name=vslice.name, uid=vslice.uid)
    if owner is Ownership.EARLIER:
        return InTheWay(
            f"{where} belongs to an earlier VirtualSlice {vslice.name} that was "
            "deleted; waiting for the garbage collector to delete it"
        )
    if owner is Ownership.FOREIGN:
        return InTheWay(
            f"{where} exists and is not this VirtualSlice's ({describe_controller(refs)}); the operator "
            f"neither uses nor deletes a {kind} it does not control: delete or rename that {kind}, or give "
            "the VirtualSlice another name",
            warning=True,
        )
    return None


def save_record(api: ClusterApi, vslice: VirtualSliceObject, record: SliceRecord) -> None:
    """Keep ``record`` in the slice's annotations, where a restarted operator finds it."""
    try:
        api.annotate_slice(
            vslice.namespace, vslice.name, vslice.uid,
            {RESTARTS_ANNOTATION: str(record.restarts), FAILURE_ANNOTATION: record.failure or None},
        )
    except KubeError as err:
        if err.status not in (404, 409, 422):
            raise
        log.info("%s: the slice was deleted or replaced; its record (%s) is not kept: %s",
                 vslice.key, record, err)


def delete_slice_objects(api: ClusterApi, namespace: str, name: str, uid: str) -> None:
    """Delete the Secret and pods that the slice ``uid`` controls; others that bear its name stay.
    Its host NetworkPolicy stays until the garbage collector takes it with the slice, so the
    pods are not opened up while they terminate."""
    key = f"{namespace}/{name}"
    secret_name = token_secret_name(name)
    secret = api.get_secret(namespace, secret_name)
    if secret is not None:
        meta = secret["metadata"]
        refs = owner_refs(meta)
        if ownership(refs, kind=SLICE_KIND, name=name, uid=uid) is Ownership.OWNED:
            api.delete_secret(namespace, secret_name, str(meta.get("uid") or ""))
        else:
            log.info("%s: leaving Secret %s alone: it is not this VirtualSlice's (%s)",
                     key, secret_name, describe_controller(refs))
    for raw in api.list_pods(namespace, f"{SLICE_LABEL}={name}"):
        pod = PodView.from_manifest(raw)
        if pod.controller_uid == uid and not pod.deleting:
            api.delete_pod(namespace, pod.name, pod.uid)
