"""What a host's state machine asks its driver to do, as frozen records.

The driver carries each out without deciding anything: `Dispatch` on the
executor thread (JAX), `FinishBatch` and `Export` on the finisher (waiting for
results, completions, shared memory), timers on its clock, `StoreChanged` and
`Log` at once. A value's spec is taken from the value when there is one;
`declared` is the program's spec, for a value that failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from pathways_wire import pathways_pb2 as pb
from pathways_worker.value_ref import Ref
from pathways_worker.worker.call_plan import LocalComputation
from pathways_worker.worker.object_store import ObjectId
from pathways_worker.worker.stimuli import GrantId


class Dispatch(NamedTuple):
    """Call the computation's executable on these inputs; report `ComputationDispatched`.

    A named tuple, as `Finished` and `ComputationDispatched` are: one of each is made per
    computation, and a frozen dataclass costs about three times as much to build."""

    grant: GrantId
    program_id: str
    comp: LocalComputation
    inputs: tuple[object, ...]
    in_flight: tuple[object, ...] = ()
    """Multi-process slices: the outputs of the computation dispatched before this one,
    possibly still running (its collectives must end before another's begin)."""
    wait_for: tuple[object, ...] = ()
    """Values to wait for before the call: `in_flight` when this computation does not
    read it (JAX could run the two side by side), or an earlier one of the chain, to
    keep at most `IN_FLIGHT_LIMIT` in flight."""


class RunValue(NamedTuple):
    """An input of a `DispatchRun` grant that an earlier grant of the same run makes:
    the executor passes that grant's output, dispatched moments before."""

    ref: Ref


class DispatchRun(NamedTuple):
    """Dispatch grants of one call back to back, in order: `first` as a `Dispatch`
    would be, then each of `rest`, whose inputs may be `RunValue`s; report
    `RunDispatched`. Only a single-process slice runs them (see `host_state`, Runs)."""

    first: Dispatch
    rest: tuple[Dispatch, ...]


@dataclass(frozen=True, slots=True)
class RoutedValue:
    """An output that leaves the host for another slice's hosts (None: it failed)."""

    ref: Ref
    value: object | None
    declared: pb.TensorSpec | None


class Finished(NamedTuple):
    """One grant for the finisher: wait for its outputs, report its completion."""

    grant: GrantId
    outputs: tuple[object, ...]
    error: str
    routed: tuple[RoutedValue, ...] = ()
    inline: tuple[int, ...] = ()
    """Outputs whose bytes go back inline with the completion."""
    ends_call: bool = False
    """The call's last computation on this host: its completion goes without lingering."""
    label: str = ""
    """How errors name the computation ("program 'p' computation 'f' (index 3)")."""


@dataclass(frozen=True, slots=True)
class FinishBatch:
    """Grants handed to the finisher together: one hand-off, their completions in one message."""

    grants: tuple[Finished, ...]
    report: bool = False
    """Report `BatchFinished` once every grant's outputs exist."""


@dataclass(frozen=True, slots=True)
class Export:
    """Write a value's pieces to shared memory for a fetch (or say why there is none)."""

    oid: ObjectId
    token: int
    value: object | None
    error: str
    declared: pb.TensorSpec | None
    release: bool
    """Report `ExportWritten` once written, so the value can go."""


@dataclass(frozen=True, slots=True)
class StartTimer:
    """Ring `TimerFired(timer)` after `delay_s`, unless cancelled first."""

    timer: int
    delay_s: float
    """The worker's input timeout: how long a grant may wait for inputs and store room."""


@dataclass(frozen=True, slots=True)
class CancelTimer:
    """The wait the timer bounded is over."""

    timer: int


@dataclass(frozen=True, slots=True)
class StoreChanged:
    """The store's byte count changed with nothing else to report: tell the sidecar."""


@dataclass(frozen=True, slots=True)
class RoomWanted:
    """Work now waits for room on the slice: completions held for company should
    go as they free it (`outbox.worth_lingering`)."""


@dataclass(frozen=True, slots=True)
class Log:
    """A line for the worker's log, at debug level: one per released call, which in a
    training loop is one per step."""

    message: str


Instruction = Dispatch | DispatchRun | FinishBatch | Export | StartTimer | CancelTimer | StoreChanged | RoomWanted | Log
