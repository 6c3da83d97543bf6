"""What can happen to a host's worker, as its state machine (`HostState.handle`) hears it.

Each stimulus is a frozen record of one thing that happened: a command from the
sidecar, already decoded by the driver (programs compiled, shared memory
mapped, inline bytes parsed); a result from the driver's executor thread or
finisher; or the driver's clock firing a timer the machine asked for. None
carries a clock reading, only, where it helps a log line, a measured duration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from pathways_wire import pathways_pb2 as pb
from pathways_wire.grant_runs import grants_in
from pathways_worker.worker.call_plan import ProgramLayout
from pathways_worker.worker.object_store import ObjectId


class GrantId(NamedTuple):
    """One grant of the island scheduler: run computation `node` of call `call_id`."""

    seq: int
    call_id: str
    node: int


def grants_of(batch: pb.GrantBatch) -> tuple[GrantId, ...]:
    """The batch's grants, in sequence order."""
    return tuple(GrantId(seq, call_id, node) for seq, call_id, node in grants_in(batch))


@dataclass(frozen=True, slots=True)
class ProgramLoaded:
    """The host's part of a program, prepared: what loaded, what did not and why."""

    layout: ProgramLayout
    load_errors: Mapping[int, str]
    """Computation index -> why it cannot run here."""
    out_bytes: Mapping[int, tuple[int, ...]]
    """Each computation that loaded -> the bytes each of its outputs takes on this host."""
    output_specs: Mapping[int, tuple[pb.TensorSpec, ...]]
    """Every computation's declared outputs, for values that fail before they exist."""
    partial: Mapping[int, frozenset[int]] = field(default_factory=dict)
    """Computation index -> its outputs this host holds only part of (split across hosts)."""


@dataclass(frozen=True, slots=True)
class CallLaunched:
    """A call of a loaded program starts here; its program inputs for this host came with it."""

    launch: pb.Launch
    inputs: tuple[ValueArrived, ...]


@dataclass(frozen=True, slots=True)
class GrantsReceived:
    """The island scheduler's next grants for this host, in its order."""

    grants: tuple[GrantId, ...]
    room_wanted: bool = True
    """Computations wait for window room on the slice: completions free it (`outbox`)."""


@dataclass(frozen=True, slots=True)
class CallFailed:
    """The controller gave up on the call (another host failed it, or it was cancelled)."""

    call_id: str
    message: str
    """The controller's reason; the errors of everything the call still waits for quote it."""


@dataclass(frozen=True, slots=True)
class CallReleased:
    """The client is done with the call: its values may go, except those it keeps as objects."""

    call_id: str
    keep: frozenset[tuple[int, int]] = frozenset()


@dataclass(frozen=True, slots=True)
class ObjectsDropped:
    """The client dropped its last handle to these objects (kept values of released calls)."""

    objects: tuple[ObjectId, ...]


@dataclass(frozen=True, slots=True)
class ObjectForwarded:
    """Another slice's call reads an object this host holds: send it there, as that call's input."""

    source: ObjectId
    target: ObjectId
    """The reading call and its program input: what the receivers call the value."""
    declared: pb.TensorSpec


@dataclass(frozen=True, slots=True)
class ValueArrived:
    """A value from outside the worker: a program input, or another slice's output mapped
    from shared memory. Without a `value`, `error` says why it could not be loaded."""

    oid: ObjectId
    value: object | None
    nbytes: int
    error: str = ""


@dataclass(frozen=True, slots=True)
class ExportRequested:
    """The client fetches a value from this host."""

    request: pb.ExportRequest


class ComputationDispatched(NamedTuple):
    """The executor thread carried out a `Dispatch`: JAX has the computation, or refused it.
    A named tuple, built once per computation (see `instructions.Dispatch`)."""

    grant: GrantId
    outputs: tuple[object, ...]
    """jax.Arrays, possibly still computing; () when JAX refused it."""
    error: str
    busy_s: float = 0.0
    """How long the executor thread spent on it, for the call's log line."""
    overlapped: bool = False
    """It was dispatched while the computation before it still ran (multi-process slices)."""


@dataclass(frozen=True, slots=True)
class RunDispatched:
    """The executor thread carried out a `DispatchRun`: one result per grant it dispatched,
    in order. It stops at the first JAX refused, so the grants after that one are missing."""

    results: tuple[ComputationDispatched, ...]


@dataclass(frozen=True, slots=True)
class ComputationFailedLate:
    """A dispatched computation failed while it ran: the outputs it published are not values."""

    grant: GrantId
    outputs: tuple[object, ...]
    """As dispatched: a slot fails only while it still holds one of these."""
    error: str


@dataclass(frozen=True, slots=True)
class BatchFinished:
    """The finisher saw a batch's computations end (multi-process slices ask for it)."""

    grants: tuple[GrantId, ...]


@dataclass(frozen=True, slots=True)
class ExportWritten:
    """A fetch that asked to release its value was written out: the value may go."""

    oid: ObjectId


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A timer the machine started (`StartTimer`) rang."""

    timer: int


Stimulus = (
    ProgramLoaded | CallLaunched | GrantsReceived | CallFailed | CallReleased | ObjectsDropped | ObjectForwarded
    | ValueArrived | ExportRequested | ComputationDispatched | RunDispatched | ComputationFailedLate | BatchFinished
    | ExportWritten | TimerFired
)
