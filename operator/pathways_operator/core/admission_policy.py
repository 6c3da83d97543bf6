"""Admission policy: PriorityClasses a user's slice may not use, and the pause after a refused gang.

Priority decides who waits and who is preempted, across every namespace the
operator serves. Kubernetes reserves PriorityClass names starting with
``system-`` for the cluster's own components (``system-node-critical``,
``system-cluster-critical``, values above two billion): a VirtualSlice using
one would be admitted before, and preempt, every other namespace's slices. So
:func:`priority_class_refusal` refuses them unless the operator was started
with ``--allow-system-priority-classes`` (chart value
``operator.allowSystemPriorityClasses``). Ordinary classes stay the cluster
admin's to hand out: the class is put on every pod of the gang, so a
ResourceQuota scoped to it (``scopeSelector`` on ``PriorityClass``) limits what
each namespace may run at that priority.

The API server may still refuse a gang's pods (an exceeded ResourceQuota, an
admission policy). The gang is then torn down, so it holds no devices, and waits
:func:`refused_backoff` before it is placed again: 5 s, doubling up to 2 min,
like kubelet's back-off of a crashing container, so a quota that stays full
costs one attempt every two minutes, not a pod created and deleted every second.
"""

from __future__ import annotations

SYSTEM_PREFIX = "system-"
"""PriorityClass names with this prefix are reserved by Kubernetes for cluster components."""

REFUSED_BACKOFF_S = 5.0
REFUSED_BACKOFF_MAX_S = 120.0


def priority_class_refusal(name: str, *, allow_system: bool) -> str | None:
    """Why a slice may not use PriorityClass ``name`` (the condition message), or None if it may."""
    if not name.startswith(SYSTEM_PREFIX) or allow_system:
        return None
    return (
        f"spec.priorityClassName {name!r} is reserved for the cluster's own components "
        f"(classes named {SYSTEM_PREFIX}*): a slice using it would outrank and preempt every "
        "other namespace's slices. Use a PriorityClass of your own (kubectl create priorityclass "
        "team-high --value=1000) or remove the field; a cluster admin may allow system classes "
        "with the operator's --allow-system-priority-classes (chart value "
        "operator.allowSystemPriorityClasses=true)"
    )


def refused_backoff(refusals: int) -> float:
    """Seconds a gang waits before it is placed again after its ``refusals``-th refused attempt (1, 2, ...)."""
    if refusals < 1:
        return 0.0
    return min(REFUSED_BACKOFF_MAX_S, REFUSED_BACKOFF_S * 2.0 ** min(refusals - 1, 16))
