"""How a host names a value of a program: `(node, index)`, node -1 being a program input.

The worker and the sidecar both speak of values this way (the sidecar routes
them, the worker stores and computes them), so the name lives beside both.
"""

from __future__ import annotations

from pathways_wire import pathways_pb2 as pb
from pathways_wire.transfer import value_name

Ref = tuple[int, int]  # (node, index); node -1 is a program input


def ref_of(value: pb.ValueRef) -> Ref:
    return (value.node, value.index)


def ref_name(ref: Ref) -> str:
    return value_name(pb.ValueRef(node=ref[0], index=ref[1]))
