"""What can happen to a host's worker, as its state machine (`HostState.handle`) hears it.

Each stimulus is a frozen record of one thing that happened: a command from the
sidecar, already decoded by the driver (programs compiled, shared memory
mapped, inline bytes parsed); a result from the driver's executor thread or
finisher; or the driver's clock firing a timer the machine asked for. None
carries a clock reading, only, where it helps a log line, a measured duration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from pathways_wire import pathways_pb2 as pb
from pathways_worker.value_ref import Ref
from pathways_worker.worker.call_plan import ProgramLayout


class GrantId(NamedTuple):
    """One grant of the island scheduler: run computation `node` of call `call_id`."""

    seq: int
    call_id: str
    node: int


def grant_of(grant: pb.Grant) -> GrantId:
    return GrantId(grant.seq, grant.call_id, grant.node)


@dataclass(frozen=True)
class ArrivedValue:
    """A value decoded from outside the worker: `value` with its bytes, or why it could not be."""

    ref: Ref
    value: object | None
    nbytes: int
    error: str = ""


@dataclass(frozen=True)
class ProgramLoaded:
    """The host's part of a program, prepared: what loaded, what did not and why."""

    layout: ProgramLayout
    load_errors: Mapping[int, str]                      # computation index -> why it cannot run here
    out_bytes: Mapping[int, tuple[int, ...]]            # loaded computation -> bytes of each output here
    output_specs: Mapping[int, tuple[pb.TensorSpec, ...]]  # every computation's declared outputs


@dataclass(frozen=True)
class CallLaunched:
    launch: pb.Launch
    inputs: tuple[ArrivedValue, ...]   # the program inputs that came with the launch


@dataclass(frozen=True)
class GrantsReceived:
    grants: tuple[GrantId, ...]


@dataclass(frozen=True)
class CallFailed:
    call_id: str
    message: str


@dataclass(frozen=True)
class CallReleased:
    call_id: str


@dataclass(frozen=True)
class ValueArrived:
    """A program input or another slice's output, mapped from shared memory."""

    call_id: str
    value: ArrivedValue


@dataclass(frozen=True)
class ExportRequested:
    """The client fetches a value from this host."""

    request: pb.ExportRequest


@dataclass(frozen=True)
class ComputationDispatched:
    """The executor thread carried out a `Dispatch`: JAX has the computation, or refused it."""

    grant: GrantId
    outputs: tuple[object, ...]   # jax.Arrays, possibly still computing; () on error
    error: str
    busy_s: float = 0.0


@dataclass(frozen=True)
class ComputationFailedLate:
    """A dispatched computation failed while it ran: the outputs it published are not values."""

    grant: GrantId
    outputs: tuple[object, ...]
    error: str


@dataclass(frozen=True)
class ExportWritten:
    """A fetch that asked to release its value was written out: the value may go."""

    call_id: str
    ref: Ref


@dataclass(frozen=True)
class TimerFired:
    timer: int


Stimulus = (
    ProgramLoaded | CallLaunched | GrantsReceived | CallFailed | CallReleased | ValueArrived
    | ExportRequested | ComputationDispatched | ComputationFailedLate | ExportWritten | TimerFired
)
