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
`pw.connect(address)` names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathways.context import ProgramContext
    from pathways.devices import (
        VirtualDevice,
        VirtualDeviceSet,
        VirtualSlice,
        make_virtual_device_set,
    )
    from pathways.errors import (
        ExecutionError,
        InvalidProgramError,
        PathwaysError,
        PlacementError,
        RuntimeUnavailableError,
    )
    from pathways.functions import SliceFunction, jit, pmap
    from pathways.runs import Run, launch
    from pathways.tracing import ProgramFunction, TracedProgram, program
    from pathways.runtime import Runtime, connect, default_runtime, shutdown

# Imported on first use: hosts' sidecars import `pathways.wire` and
# `pathways_wire.transfer` and must not pay for loading JAX.
_LAZY = {
    "ProgramContext": "pathways.context",
    "VirtualDevice": "pathways.devices",
    "VirtualDeviceSet": "pathways.devices",
    "VirtualSlice": "pathways.devices",
    "make_virtual_device_set": "pathways.devices",
    "ExecutionError": "pathways.errors",
    "InvalidProgramError": "pathways.errors",
    "PathwaysError": "pathways.errors",
    "PlacementError": "pathways.errors",
    "RuntimeUnavailableError": "pathways.errors",
    "SliceFunction": "pathways.functions",
    "jit": "pathways.functions",
    "pmap": "pathways.functions",
    "Run": "pathways.runs",
    "launch": "pathways.runs",
    "ProgramFunction": "pathways.tracing",
    "TracedProgram": "pathways.tracing",
    "program": "pathways.tracing",
    "Runtime": "pathways.runtime",
    "connect": "pathways.runtime",
    "default_runtime": "pathways.runtime",
    "shutdown": "pathways.runtime",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pathways' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
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
    "jit",
    "launch",
    "make_virtual_device_set",
    "pmap",
    "program",
    "shutdown",
]
