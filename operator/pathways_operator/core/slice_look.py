"""What one look at a VirtualSlice reads, and what the slice machine hands back.

The observation (:class:`SliceLook`) is frozen: the slice's own fields, its
pods (anything shaped like :class:`GangPod`), the operator's memory of the
slice (registered, preempted, seen, refused) and the time, as values. The
machine answers with a :class:`SliceDecision` (the status to write once and the
Events to post) and typed actions, carried out by the reconciler in order:
:class:`ReleaseGang`, :class:`DeletePods`, :class:`SaveRecord`, ... and the
pod plan's :class:`CreateHostPod` and :class:`BindHostPod`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Protocol

from pathways_operator.core.phases import SlicePhase
from pathways_operator.core.placement import Placement, Unplaceable
from pathways_operator.core.reasons import Condition, Reason
from pathways_operator.core.slice_phase import SliceRecord
from pathways_operator.core.status_report import Event


class GangPod(Protocol):
    """What the machine reads of one pod of the slice (``k8s.gang_pods.PodView`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def ip(self) -> str: ...
    @property
    def ready(self) -> bool: ...
    @property
    def deleting(self) -> bool: ...
    @property
    def failure(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class InTheWay:
    """An object the slice needs is not its own (or not usable yet); the message says which and what to do."""

    message: str
    warning: bool = False
    """True when a person must act (a Warning Event); False while it resolves by itself."""
    reason: Reason = Reason.OBJECT_NOT_OWNED
    """The reason the slice's conditions give."""


@dataclasses.dataclass(frozen=True)
class HostReport:
    """One entry of ``status.hosts``."""

    index: int
    node: str
    devices: int
    pod: str = ""
    pod_ip: str = ""





@dataclasses.dataclass(frozen=True)
class ReleaseGang:
    """Free the gang's devices and forget its registration; tell the controller the gang is lost.

    ``always_tell``: tell the controller even if this process never registered the gang
    (a lost host: the controller may hold it from before a restart).
    """

    why: str
    always_tell: bool = False


@dataclasses.dataclass(frozen=True)
class DeletePods:
    """Delete these pods; those in ``at_once`` with grace 0: no kubelet will confirm their end.

    That is every pod whose Node is gone, and every pod already being deleted (evicted, or
    deleted by this operator) on a Node whose kubelet stopped reporting: such a pod would
    stay Terminating until the Node came back, holding up the gang's re-placement.
    """

    pods: tuple[GangPod, ...]
    at_once: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class SaveRecord:
    """Keep the slice record in the slice's annotations, where a restarted operator finds it."""

    record: SliceRecord


@dataclasses.dataclass(frozen=True)
class Requeue:
    """The slice is waiting for devices again from now (for the admission-wait metric)."""


@dataclasses.dataclass(frozen=True)
class MarkDrained:
    """Pods of ``generation`` are being removed; they must not be adopted again as the slice's placement."""

    generation: int


@dataclasses.dataclass(frozen=True)
class Block:
    """Keep the slice out of the admission queue while ``why`` holds; None: back in the queue."""

    why: str | None


@dataclasses.dataclass(frozen=True)
class SeeHosts:
    """Remember that these hosts' pods existed for the current placement (to notice one that vanishes)."""

    indices: frozenset[int]


@dataclasses.dataclass(frozen=True)
class BackOff:
    """The API server refused the gang's pods ``count`` times in a row: place it again in ``wait_s``."""

    count: int
    """Refusals in a row, this one included (the wait grows with it)."""
    wait_s: float
    """Seconds from now (the reconciler's clock) before the gang is placed again."""
    why: Unplaceable


@dataclasses.dataclass(frozen=True)
class ClearBackOff:
    """The gang is up: forget earlier refusals."""


@dataclasses.dataclass(frozen=True)
class CreateHostPod:
    """Create and bind the pod of host ``index``. Host 0 serves the JAX coordinator on its own
    pod IP; the others are told that address through their sidecars once it exists."""

    index: int


@dataclasses.dataclass(frozen=True)
class BindHostPod:
    """Bind an existing, unbound pod of the gang to its machine."""

    pod: str
    machine: str


SliceAction = (
    ReleaseGang | DeletePods | SaveRecord | Requeue | MarkDrained | Block | SeeHosts | BackOff | ClearBackOff
)
PodStep = CreateHostPod | BindHostPod


class Next(enum.Enum):
    """What the reconciler does after :meth:`SliceMachine.start`."""

    DONE = "done"
    ADMIT = "admit"
    """Run an admission pass; answer with :meth:`SliceMachine.admitted` or :meth:`SliceMachine.queued`."""
    LAUNCH = "launch"
    """Launch the placed gang (:meth:`SliceMachine.launch`)."""





@dataclasses.dataclass(frozen=True)
class SliceLook:
    """What one look at a slice read: the object, its pods, the operator's memory of it, the time."""

    key: str
    name: str
    namespace: str
    generation: int
    """``metadata.generation``: the conditions' observedGeneration."""
    now: str
    """When the look was taken, RFC 3339."""
    conditions: tuple[Condition, ...]
    """The conditions read back (only to keep transition times and post Events on changes)."""
    suspend: bool
    max_restarts: int
    record: SliceRecord
    restarts: int
    """The current generation of the gang (``core.slice_phase.current_generation``)."""
    placement: Placement | None = None
    """The admitted placement of this generation, if any."""
    current: Mapping[int, GangPod] = dataclasses.field(default_factory=dict)
    """Pods of the current gang by host index (empty unless placed)."""
    strays: tuple[GangPod, ...] = ()
    """The slice's other pods (earlier gangs, or all of them while it is not placed)."""
    registered: bool = False
    """The controller has this generation of the gang."""
    preempted: bool = False
    """The operator evicted this generation itself."""
    evicting: str | None = None
    """Why a slice of higher priority evicts this one, if it does."""
    missing_nodes: frozenset[str] = frozenset()
    """Nodes the slice's pods are bound to that no longer exist."""
    unreachable_nodes: frozenset[str] = frozenset()
    """Nodes the slice's pods are bound to whose kubelet stopped reporting (the node
    lifecycle controller's ``node.kubernetes.io/unreachable`` taint)."""
    seen: frozenset[int] = frozenset()
    """Host indices whose pods this operator has seen for the current placement."""
    in_the_way: InTheWay | None = None
    """A Secret or pod the slice needs that it does not control, or an unusable Secret."""
    refusals: int = 0
    """Times in a row the API server refused the gang's pods."""

    @property
    def pods(self) -> tuple[GangPod, ...]:
        return (*self.current.values(), *self.strays)


@dataclasses.dataclass(frozen=True)
class SliceDecision:
    """The status to write once, the Events to post, and when to look again."""

    phase: SlicePhase
    conditions: tuple[Condition, ...]
    restarts: int
    island: str
    hosts: tuple[HostReport, ...]
    ready_hosts: str
    events: tuple[Event, ...]
    delay: float
    summary: str | None
    """Why the slice is (not) usable, for the controller's error messages; None: unchanged."""


def pod_name(slice_name: str, index: int) -> str:
    """Host ``index`` of slice ``x`` is pod ``x-<index>`` (the name is reused by later generations)."""
    return f"{slice_name}-{index}"


def serving(pod: GangPod) -> bool:
    """The host's pod runs, has its address and is not going away: the operator may ask its
    sidecar's Health, which decides whether the host serves (``gang_registration``). The
    pod's own Ready condition is not waited for: its probe (a TCP connect to the sidecar,
    once a second) says less than that question and would hold a formed gang back until
    its next tick."""
    return pod.phase == "Running" and bool(pod.ip) and not pod.deleting

