"""Exported computations turned into callables on this host's devices.

A Computation carries a `jax.export` artifact (serialized StableHLO). The host
deserializes it, lays the slice's devices out as the computation's mesh (every
device of the slice, in process order, so all hosts agree), and wraps
`exp.call` in `jax.jit`: the first call compiles, later calls dispatch in a few
microseconds (JAX's C++ fast path, taken for jax.Arrays already on the input
shardings and, where every input is addressable from this process, for numpy
arrays, which jit places per the input shardings itself), and return the
outputs as one flat tuple, flattened once when traced. Executables are cached
per host by the artifact's fingerprint and mesh, so programs sharing a
computation compile it once.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from pathways_wire import pathways_pb2 as pb


NOT_YET = object()
"""An input's `accepted` sharding before any argument was found equivalent: no value's."""


class LoadError(Exception):
    """The computation cannot run on this host; the message says why."""


@dataclass(frozen=True)
class Executable:
    fingerprint: str
    fn: Callable[..., tuple[Any, ...]]
    """Dispatches the computation; its outputs, as a flat tuple."""
    in_shardings: tuple[Sharding, ...]
    out_shardings: tuple[Sharding, ...]
    out_bytes: tuple[int, ...]   # bytes of each output held on this host
    out_partial: frozenset[int] = frozenset()
    """Outputs split across the slice's hosts: this host holds only part of each."""
    takes_host_arrays: bool = False
    """`fn` places numpy arguments itself, per `in_shardings` (every input sharding is
    addressable from this process): a host array goes in as it is."""
    accepted: list[object] = field(default_factory=list)
    """Per input, the last sharding of an argument found equivalent to the input's
    own: an output of the computation before it comes with the same sharding object
    every time, so a chain asks once, then compares identities."""

    @property
    def total_out_bytes(self) -> int:
        return sum(self.out_bytes)


def _host_bytes(sharding: Sharding, shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    total = 0
    for index in sharding.addressable_devices_indices_map(shape).values():
        if index is None:
            total += math.prod(shape)
            continue
        total += math.prod(len(range(*s.indices(d))) for s, d in zip(index, shape, strict=False))
    return total * dtype.itemsize


def _flat_call(exp: jax.export.Exported) -> Callable[..., tuple[Any, ...]]:
    def call(*args: Any) -> tuple[Any, ...]:
        return tuple(jax.tree.leaves(exp.call(*args)))

    return call


class ExecutableCache:
    def __init__(self, devices: Sequence[jax.Device]) -> None:
        self.devices = list(devices)
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, tuple[int, ...], tuple[str, ...]], Executable] = {}

    def get(self, comp: pb.Computation) -> Executable:
        fingerprint = comp.fingerprint or hashlib.sha256(comp.artifact).hexdigest()
        mesh_shape = tuple(int(d) for d in comp.mesh_shape)
        mesh_axes = tuple(comp.mesh_axes)
        key = (fingerprint, mesh_shape, mesh_axes)
        with self._lock:
            found = self._cache.get(key)
        if found is not None:
            return found
        exe = self._load(comp, fingerprint, mesh_shape, mesh_axes)
        with self._lock:
            return self._cache.setdefault(key, exe)

    def _load(
        self,
        comp: pb.Computation,
        fingerprint: str,
        mesh_shape: tuple[int, ...],
        mesh_axes: tuple[str, ...],
    ) -> Executable:
        what = f"computation '{comp.name}' (index {comp.index})"
        if not comp.artifact:
            raise LoadError(f"{what} has no artifact")
        try:
            exp = jax.export.deserialize(bytearray(comp.artifact))
        except Exception as err:
            raise LoadError(f"{what}: cannot deserialize its jax.export artifact: {err}") from err
        n = len(self.devices)
        if exp.nr_devices != n:
            raise LoadError(
                f"{what} was exported for {exp.nr_devices} devices, but this host's slice "
                f"has {n} devices"
            )
        if not mesh_shape:
            mesh_shape, mesh_axes = (n,), ("devices",)
        if math.prod(mesh_shape) != n or len(mesh_axes) != len(mesh_shape):
            raise LoadError(
                f"{what}: mesh {list(mesh_shape)} with axes {list(mesh_axes)} does not lay out "
                f"the slice's {n} devices"
            )
        mesh = Mesh(np.array(self.devices).reshape(mesh_shape), mesh_axes)
        # An export without a recorded sharding means replicated over the mesh.
        replicated = NamedSharding(mesh, PartitionSpec())
        in_shardings = tuple(s or replicated for s in exp.in_shardings_jax(mesh))
        out_shardings = tuple(s or replicated for s in exp.out_shardings_jax(mesh))
        if len(comp.inputs) != len(exp.in_avals):
            raise LoadError(
                f"{what} takes {len(exp.in_avals)} inputs but the program wires {len(comp.inputs)}"
            )
        if comp.outputs and len(comp.outputs) != len(exp.out_avals):
            raise LoadError(
                f"{what} returns {len(exp.out_avals)} outputs but the program declares "
                f"{len(comp.outputs)}"
            )
        out_bytes = tuple(
            _host_bytes(s, tuple(a.shape), np.dtype(a.dtype))
            for s, a in zip(out_shardings, exp.out_avals, strict=True)
        )
        # With every input addressable here, jit itself places a numpy argument (in C++,
        # a few µs) where building a jax.Array from it first took 25 µs at best.
        addressable = all(s.is_fully_addressable for s in in_shardings)
        return Executable(
            fingerprint=fingerprint,
            fn=jax.jit(_flat_call(exp), in_shardings=in_shardings) if addressable else jax.jit(_flat_call(exp)),
            takes_host_arrays=addressable,
            in_shardings=in_shardings,
            out_shardings=out_shardings,
            out_bytes=out_bytes,
            accepted=[NOT_YET] * len(in_shardings),
            out_partial=frozenset(
                i for i, s in enumerate(out_shardings) if not (s.is_fully_addressable or s.is_fully_replicated)
            ),
        )
