"""Functions bound to a virtual slice: `pw.pmap` and `pw.jit`.

Each is compiled on the client, once per input signature, into a `jax.export`
artifact over an *abstract* mesh of the slice's shape — the client needs no
devices of the slice. The artifact takes the flat leaves of the arguments and
returns a flat tuple of outputs, so hosts run it without knowing any pytree.

Called inside a `@pw.program`, a slice function records one computation of the
dataflow graph. Called outside one, it runs at once as a program of one
computation (the paper's "OpByOp" mode).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from pathways.devices import VirtualSlice, slice_of_devices
from pathways_wire.errors import InvalidProgramError
from pathways_wire.host_blocks import AxisSpec
from pathways_wire.ir import TensorSpec

ShardingLike = PartitionSpec | NamedSharding | None


@dataclass(frozen=True)
class Compiled:
    """One export of a slice function for one flat input signature."""

    artifact: bytes
    in_specs: tuple[TensorSpec, ...]
    out_specs: tuple[TensorSpec, ...]
    out_tree: Any
    mesh_shape: tuple[int, ...]
    mesh_axes: tuple[str, ...]
    in_axes: tuple[AxisSpec, ...] = ()
    """Per flat input, its sharding as `host_blocks` reads it (`mesh_axes_of`)."""


def mesh_axes_of(spec: PartitionSpec) -> AxisSpec:
    """A PartitionSpec as `host_blocks` reads it: per dimension, the mesh axes it is split
    over (an entry it cannot read names no axis, so the value goes whole)."""
    return tuple(
        () if entry is None else (entry,) if isinstance(entry, str)
        else tuple(entry) if isinstance(entry, tuple) else ("",)
        for entry in spec
    )


def _spec_of(leaf: Any) -> TensorSpec:
    return TensorSpec.of(tuple(np.shape(leaf)), np.result_type(leaf))


def _is_sharding_leaf(x: object) -> bool:
    return x is None or isinstance(x, (PartitionSpec, NamedSharding))


def _broadcast(shardings: Any, tree: Any, what: str, fn_name: str) -> list[ShardingLike]:
    """Expand a sharding prefix (one spec, or one per argument) to one per leaf."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if _is_sharding_leaf(shardings):
        return [shardings] * len(leaves)
    flat, spec_tree = jax.tree_util.tree_flatten(shardings, is_leaf=_is_sharding_leaf)
    if cast(Any, spec_tree) == treedef:
        return list(flat)
    if isinstance(shardings, (tuple, list)) and isinstance(tree, (tuple, list)):
        if len(shardings) != len(tree):
            raise InvalidProgramError(
                f"{fn_name}: {what} has {len(shardings)} entries for {len(tree)} values"
            )
        out: list[ShardingLike] = []
        for sub_sh, sub_tree in zip(shardings, tree):
            out.extend(_broadcast(sub_sh, sub_tree, what, fn_name))
        return out
    raise InvalidProgramError(
        f"{fn_name}: {what} {shardings!r} does not match the structure {treedef}"
    )


class SliceFunction:
    """A JAX function that runs SPMD on every device of one virtual slice."""

    def __init__(
        self,
        fn: Callable[..., Any],
        vslice: VirtualSlice,
        *,
        kind: str,
        axis_name: str | None = None,
        in_shardings: Any = None,
        out_shardings: Any = None,
        mesh: AbstractMesh | None = None,
        name: str | None = None,
    ) -> None:
        self.fn = fn
        self.slice = vslice
        self.kind = kind
        self.axis_name = axis_name or "_pw_pmap"
        self.in_shardings = in_shardings
        self.out_shardings = out_shardings
        self.name: str = name or str(getattr(fn, "__name__", "fn"))
        if self.name == "<lambda>":
            self.name = f"lambda@{vslice.name}"
        self.mesh = mesh if mesh is not None else self._default_mesh()
        self._cache: dict[tuple[Any, tuple[TensorSpec, ...]], Compiled] = {}
        self.compile_count = 0
        functools.update_wrapper(self, fn, updated=())

    def _default_mesh(self) -> AbstractMesh:
        if self.kind == "pmap":
            return self.slice.mesh((self.axis_name,))
        for sh in jax.tree_util.tree_leaves(
            (self.in_shardings, self.out_shardings), is_leaf=_is_sharding_leaf
        ):
            if isinstance(sh, NamedSharding):
                mesh = sh.mesh
                if mesh.size != self.slice.devices_count:
                    raise InvalidProgramError(
                        f"{self.name}: sharding mesh has {mesh.size} devices but slice "
                        f"'{self.slice.name}' has {self.slice.devices_count}"
                    )
                return AbstractMesh(tuple(mesh.axis_sizes), tuple(mesh.axis_names))
        return self.slice.mesh()

    def describe(self) -> str:
        return f"'{self.name}' ({self.kind} over {self.slice.devices_count} devices of slice '{self.slice.name}')"

    def _named(self, sh: ShardingLike) -> NamedSharding:
        if sh is None:
            return NamedSharding(self.mesh, PartitionSpec())
        if isinstance(sh, PartitionSpec):
            return NamedSharding(self.mesh, sh)
        return NamedSharding(self.mesh, sh.spec)

    def compile(self, in_tree: Any, in_specs: tuple[TensorSpec, ...]) -> Compiled:
        """Export for these flat input specs (cached: a second call compiles nothing)."""
        key = (in_tree, in_specs)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        compiled = self._export(in_tree, in_specs)
        self._cache[key] = compiled
        self.compile_count += 1
        return compiled

    def _export(self, in_tree: Any, in_specs: tuple[TensorSpec, ...]) -> Compiled:
        """`_exported`, where anything JAX raises for the function and these inputs (its
        shapes, its shardings, its lowering) is an InvalidProgramError naming the function
        and the inputs, the cause chained."""
        try:
            return self._exported(in_tree, in_specs)
        except InvalidProgramError:
            raise
        except Exception as err:  # jax raises many types; all mean "cannot compile"
            text = str(err)
            hint = ""
            if "callback" in text.lower() or "custom_call" in text.lower():
                hint = (
                    " Host callbacks (jax.debug.print, pure_callback, io_callback) cannot run "
                    "on Pathways hosts: remove them from the function."
                )
            shown = ", ".join(str(s) for s in in_specs)
            raise InvalidProgramError(
                f"{self.describe()} cannot be compiled for inputs ({shown}): "
                f"{type(err).__name__}: {text.splitlines()[0] if text else ''}{hint}"
            ) from err

    def _exported(self, in_tree: Any, in_specs: tuple[TensorSpec, ...]) -> Compiled:
        n = self.slice.devices_count
        structs = [jax.ShapeDtypeStruct(s.shape, np.dtype(s.dtype)) for s in in_specs]
        args = jax.tree_util.tree_unflatten(in_tree, structs)
        fn = self.fn
        out_holder: dict[str, Any] = {}

        if self.kind == "pmap":
            for i, spec in enumerate(in_specs):
                if not spec.shape or spec.shape[0] != n:
                    raise InvalidProgramError(
                        f"{self.describe()}: input {i} has shape {spec}; pmap over {n} devices "
                        f"needs a leading dimension of {n}"
                    )
            axis = self.axis_name

            def block(*leaves: Any) -> Any:
                inner = jax.tree_util.tree_unflatten(in_tree, [x[0] for x in leaves])
                out = fn(*inner)
                return jax.tree_util.tree_map(lambda y: jax.numpy.asarray(y)[None], out)

            def flat_fn(*leaves: Any) -> Any:
                mapped = jax.shard_map(
                    block,
                    mesh=self.mesh,
                    in_specs=tuple(PartitionSpec(axis) for _ in leaves),
                    out_specs=PartitionSpec(axis),
                )
                out = mapped(*leaves)
                flat, tree = jax.tree_util.tree_flatten(out)
                out_holder["tree"] = tree
                return tuple(flat)

            in_sh = [NamedSharding(self.mesh, PartitionSpec(axis)) for _ in in_specs]
            out_sh_all: Any = NamedSharding(self.mesh, PartitionSpec(axis))
        else:
            in_sh = [self._named(s) for s in _broadcast(self.in_shardings, args, "in_shardings", self.name)]

            def flat_fn(*leaves: Any) -> Any:
                inner = jax.tree_util.tree_unflatten(in_tree, list(leaves))
                out = fn(*inner)
                flat, tree = jax.tree_util.tree_flatten(out)
                out_holder["tree"] = tree
                return tuple(flat)

            shapes = jax.eval_shape(fn, *args)
            out_sh_all = [
                self._named(s)
                for s in _broadcast(self.out_shardings, shapes, "out_shardings", self.name)
            ]
            out_sh_all = tuple(out_sh_all)

        sharded = [
            jax.ShapeDtypeStruct(s.shape, np.dtype(s.dtype), sharding=sh)
            for s, sh in zip(in_specs, in_sh)
        ]
        jitted = jax.jit(flat_fn, in_shardings=tuple(in_sh), out_shardings=out_sh_all)
        exported = jax.export.export(jitted, platforms=["cpu"])(*sharded)
        artifact = bytes(exported.serialize())
        out_specs = tuple(TensorSpec.of(a.shape, a.dtype) for a in exported.out_avals)
        return Compiled(
            artifact=artifact,
            in_specs=in_specs,
            out_specs=out_specs,
            out_tree=out_holder["tree"],
            mesh_shape=tuple(int(d) for d in self.mesh.axis_sizes),
            mesh_axes=tuple(str(a) for a in self.mesh.axis_names),
            in_axes=tuple(mesh_axes_of(sh.spec) for sh in in_sh),
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from pathways.tracing import apply_slice_function

        if kwargs:
            raise InvalidProgramError(
                f"{self.describe()}: pass arguments positionally (got keywords {sorted(kwargs)})"
            )
        return apply_slice_function(self, args)

    def __repr__(self) -> str:
        return f"<pathways {self.kind} {self.describe()}>"


def pmap(
    fn: Callable[..., Any],
    *,
    devices: Sequence[Any] | VirtualSlice,
    axis_name: str | None = None,
) -> SliceFunction:
    """`jax.pmap` over the virtual devices of one slice (each device gets one row)."""
    return SliceFunction(fn, slice_of_devices(devices), kind="pmap", axis_name=axis_name)


def jit(
    fn: Callable[..., Any],
    *,
    slice: VirtualSlice,
    in_shardings: Any = None,
    out_shardings: Any = None,
) -> SliceFunction:
    """An SPMD function over the slice's mesh, with `jax.sharding` specs.

    Shardings are `PartitionSpec`s over `slice.mesh(...)` (or `NamedSharding`s on
    such a mesh); one spec applies to every leaf, or give one per argument.
    `None` means replicated.
    """
    if not isinstance(slice, VirtualSlice):
        raise InvalidProgramError(
            f"pw.jit(slice={slice!r}): pass a VirtualSlice from add_slice()"
        )
    return SliceFunction(
        fn, slice, kind="jit", in_shardings=in_shardings, out_shardings=out_shardings
    )
