"""Kube-Pathways: a single-controller dataflow runtime for JAX.

    import pathways as pw

    devices = pw.make_virtual_device_set().add_slice(devices=2).devices
    double = pw.pmap(lambda x: x * 2.0, devices=devices)

    @pw.program
    def f(v):
        return double(v)

`@pw.program` traces a function over virtual slices into a dataflow graph of
compiled computations; calling it runs the graph on the hosts those slices are
mapped to — the embedded local cluster by default, or the controller that
`pw.connect(address)` names. A call returns `pw.Array` handles at once: the values stay
on the hosts, the next call uses them there, and `np.asarray(x)` or `pw.fetch(tree)`
brings them to the client.
"""

from __future__ import annotations

from pathways.array import Array, fetch
from pathways.context import ProgramContext
from pathways.devices import VirtualDevice, VirtualDeviceSet, VirtualSlice, make_virtual_device_set
from pathways.functions import SliceFunction, jit, pmap
from pathways.runs import Run, launch
from pathways.runtime import ClientTraffic, Runtime, connect, default_runtime, shutdown
from pathways.tracing import ProgramFunction, TracedProgram, program
from pathways_wire.errors import (
    ExecutionError,
    InvalidProgramError,
    PathwaysError,
    PlacementError,
    RuntimeUnavailableError,
)

__all__ = [
    "Array",
    "ClientTraffic",
    "ExecutionError",
    "ProgramContext",
    "InvalidProgramError",
    "PathwaysError",
    "PlacementError",
    "ProgramFunction",
    "Run",
    "Runtime",
    "RuntimeUnavailableError",
    "SliceFunction",
    "TracedProgram",
    "VirtualDevice",
    "VirtualDeviceSet",
    "VirtualSlice",
    "connect",
    "default_runtime",
    "fetch",
    "jit",
    "launch",
    "make_virtual_device_set",
    "pmap",
    "program",
    "shutdown",
]
