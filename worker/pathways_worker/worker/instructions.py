"""What a host's state machine asks its driver to do, as frozen records.

The driver carries each out without deciding anything: `Dispatch` on the
executor thread (JAX), `FinishBatch` and `Export` on the finisher (waiting for
results, completions, shared memory), timers on its clock, `StoreChanged` and
`Log` at once. A value's spec is taken from the value when there is one;
`declared` is the program's spec, for a value that failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from pathways_wire import pathways_pb2 as pb
from pathways_worker.value_ref import Ref
from pathways_worker.worker.stimuli import GrantId


@dataclass(frozen=True)
class Dispatch:
    """Call the computation's executable on these inputs; report `ComputationDispatched`."""

    grant: GrantId
    program_id: str
    computation: int
    inputs: tuple[object, ...]
    where: str            # names the computation, for its errors
    num_outputs: int
    wait: bool            # wait for the results before reporting (multi-process slices)


@dataclass(frozen=True)
class RoutedValue:
    """An output that leaves the host for another slice's hosts."""

    ref: Ref
    value: object | None
    declared: pb.TensorSpec | None   # None when there is a value


@dataclass(frozen=True)
class Finished:
    """One grant for the finisher: wait for its outputs, report its completion."""

    grant: GrantId
    outputs: tuple[object, ...]
    error: str
    routed: tuple[RoutedValue, ...] = ()
    inline: tuple[int, ...] = ()     # outputs whose bytes go inline with the completion
    await_outputs: bool = True       # False: the executor thread waited for them already


@dataclass(frozen=True)
class FinishBatch:
    """Grants handed to the finisher together: one hand-off, their completions in one message."""

    grants: tuple[Finished, ...]


@dataclass(frozen=True)
class Export:
    """Write a value's pieces to shared memory for a fetch (or say why there is none)."""

    call_id: str
    ref: Ref
    token: int
    value: object | None
    error: str
    declared: pb.TensorSpec | None   # None when there is a value
    release: bool         # report `ExportWritten` once written


@dataclass(frozen=True)
class StartTimer:
    """Fire `TimerFired(timer)` after `delay_s`, unless cancelled first."""

    timer: int
    delay_s: float


@dataclass(frozen=True)
class CancelTimer:
    timer: int


@dataclass(frozen=True)
class StoreChanged:
    """The store's byte count changed with nothing else to report: tell the sidecar."""


@dataclass(frozen=True)
class Log:
    """A line for the worker's log (at info level)."""

    message: str


Instruction = Dispatch | FinishBatch | Export | StartTimer | CancelTimer | StoreChanged | Log
