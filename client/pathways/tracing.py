"""`@pw.program`: trace a Python function once into a dataflow program.

Tracing runs the user's function with symbolic `Value`s in place of arrays.
Every slice function it calls appends one `Computation` to the graph, compiled
for the exact shapes flowing into it; plain Python in between (loops, pytrees,
indexing of results) runs once at trace time and disappears. The traced
program is cached per input signature, so a second call with the same shapes
neither re-traces nor re-compiles: it goes straight to the controller as one
`Run` and to each host as one plan.

Shape or sharding mismatches between a producer and a consumer are found here,
before anything runs, and named in terms of both functions.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import jax
import numpy as np

from pathways_wire import ir
from pathways_wire.compiled_program import CompiledProgram, Feed
from pathways_wire.errors import InvalidProgramError
from pathways_wire.transfer import numeric_dtype
from pathways_wire.wording import plural
from pathways.array import Array
from pathways.functions import SliceFunction
from pathways_wire.ir import PROGRAM_INPUT, TensorSpec, ValueRef


class Value:
    """A symbolic array inside a program being traced."""

    __slots__ = ("ref", "spec", "producer", "trace")

    def __init__(self, ref: ValueRef, spec: TensorSpec, producer: str, trace: Trace) -> None:
        self.ref = ref
        self.spec = spec
        self.producer = producer
        self.trace = trace

    @property
    def shape(self) -> tuple[int, ...]:
        return self.spec.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(self.spec.dtype)

    def __repr__(self) -> str:
        return f"Value({self.spec}, from {self.producer})"

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise InvalidProgramError(
            f"{self!r} is symbolic inside a @pw.program: compute on it with pw.pmap/pw.jit "
            "functions, or return it from the program to get its value"
        )

    def __bool__(self) -> bool:
        raise InvalidProgramError(
            f"{self!r}: Python control flow on program values is not traceable; "
            "use jax.lax.cond inside a slice function"
        )


@dataclass
class Trace:
    """The graph being recorded for one program signature."""

    name: str
    inputs: list[TensorSpec] = field(default_factory=list)
    constants: list[np.ndarray] = field(default_factory=list)
    constant_positions: list[int] = field(default_factory=list)
    computations: list[ir.Computation] = field(default_factory=list)
    out_trees: list[Any] = field(default_factory=list)
    slices: dict[str, ir.SliceDecl] = field(default_factory=dict)

    def add_input(self, spec: TensorSpec, label: str) -> Value:
        ref = ValueRef(PROGRAM_INPUT, len(self.inputs))
        self.inputs.append(spec)
        return Value(ref, spec, label, self)

    def add_constant(self, array: np.ndarray) -> Value:
        value = self.add_input(TensorSpec.of(array.shape, array.dtype), "a constant")
        self.constants.append(array)
        self.constant_positions.append(value.ref.index)
        return value

    def apply(self, fn: SliceFunction, args: tuple[Any, ...]) -> Any:
        leaves, in_tree = jax.tree_util.tree_flatten(args)
        refs: list[ValueRef] = []
        specs: list[TensorSpec] = []
        producers: list[str] = []
        for leaf in leaves:
            if isinstance(leaf, Value):
                if leaf.trace is not self:
                    raise InvalidProgramError(
                        f"{fn.describe()}: {leaf!r} belongs to another program's trace"
                    )
                value = leaf
            else:
                value = self.add_constant(_as_array(leaf, f"{fn.describe()}: a constant argument"))
            refs.append(value.ref)
            specs.append(value.spec)
            producers.append(value.producer)
        try:
            compiled = fn.compile(in_tree, tuple(specs))
        except InvalidProgramError as err:
            sources = ", ".join(
                f"input {i} {spec} from {src}" for i, (spec, src) in enumerate(zip(specs, producers))
            )
            raise InvalidProgramError(f"{err} [in program '{self.name}': {sources or 'no array inputs'}]") from err
        index = len(self.computations)
        self.slices.setdefault(fn.slice.id, fn.slice.decl())
        self.computations.append(
            ir.Computation(
                index=index,
                name=fn.name,
                slice=fn.slice.id,
                artifact=compiled.artifact,
                inputs=tuple(refs),
                input_specs=compiled.in_specs,
                outputs=compiled.out_specs,
                mesh_shape=compiled.mesh_shape,
                mesh_axes=compiled.mesh_axes,
                input_axes=compiled.in_axes,
            )
        )
        outs = [
            Value(ValueRef(index, i), spec, f"'{fn.name}' (output {i})", self)
            for i, spec in enumerate(compiled.out_specs)
        ]
        return jax.tree_util.tree_unflatten(compiled.out_tree, outs)


_local = threading.local()


def current_trace() -> Trace | None:
    return getattr(_local, "trace", None)


@dataclass(frozen=True)
class TracedProgram:
    """A program traced for one input signature: the IR plus how to (un)flatten."""

    ir: ir.Program
    in_tree: Any
    out_tree: Any
    constants: tuple[tuple[int, np.ndarray], ...]
    weight: float

    def flat_inputs(self, user_leaves: Sequence[np.ndarray | Array]) -> list[np.ndarray | Array]:
        """User leaves plus captured constants, in program-input order."""
        total = len(self.ir.inputs)
        out: list[np.ndarray | Array | None] = [None] * total
        for pos, array in self.constants:
            out[pos] = array
        it = iter(user_leaves)
        for i in range(total):
            if out[i] is None:
                out[i] = next(it)
        return [a for a in out if a is not None]

    def flat_feeds(self, feeds: Mapping[int, int]) -> tuple[Feed, ...]:
        """``{returned position: argument position}`` as pairs of flat program output and
        input indices, leaf by leaf."""
        returned = _positions(self.out_tree)
        taken = _positions(self.in_tree)
        constant = {pos for pos, _ in self.constants}
        user_inputs = [i for i in range(len(self.ir.inputs)) if i not in constant]
        flat: list[Feed] = []
        for out_pos, arg_pos in sorted(feeds.items()):
            where = f"program '{self.ir.name}' feeds {{{out_pos}: {arg_pos}}}"
            if out_pos not in returned:
                raise InvalidProgramError(f"{where}: it returns {plural(len(returned), 'value')}; feed one of 0..{len(returned) - 1}")
            if arg_pos not in taken:
                raise InvalidProgramError(f"{where}: it takes {plural(len(taken), 'argument')}; feed one of 0..{len(taken) - 1}")
            (out_tree, out_first), (in_tree, in_first) = returned[out_pos], taken[arg_pos]
            if out_tree != in_tree:
                raise InvalidProgramError(
                    f"{where}: returned value {out_pos} is {out_tree} but argument {arg_pos} is {in_tree}; "
                    "feed an argument of the same structure"
                )
            flat += [Feed(out_first + k, user_inputs[in_first + k]) for k in range(out_tree.num_leaves)]
        return tuple(flat)


def _positions(tree: Any) -> dict[int, tuple[Any, int]]:
    """Each top-level position of a tuple (or the whole of anything else, as position 0):
    its structure and its first flat leaf index."""
    node = tree.node_data()
    children = tree.children() if node is not None and node[0] in (tuple, list) else [tree]
    positions: dict[int, tuple[Any, int]] = {}
    first = 0
    for pos, child in enumerate(children):
        positions[pos] = (child, first)
        first += child.num_leaves
    return positions


def _as_input(leaf: Any) -> np.ndarray | Array:
    """A program argument: a handle stays one (its value stays where it is)."""
    return leaf if isinstance(leaf, Array) else _as_array(leaf)


def _as_array(leaf: Any, what: str = "a value") -> np.ndarray:
    """A program argument as the array hosts receive: JAX's canonical dtype
    (float64 becomes float32 unless jax_enable_x64 is set) in this machine's byte order
    (the wire names a dtype, not its byte order, as `jax.jit` takes one), C-contiguous, of
    the argument's own shape (a scalar stays one). `what` names it in an error."""
    if isinstance(leaf, Value):
        raise InvalidProgramError(f"{leaf!r} passed to a program call from outside its trace")
    array = np.asarray(leaf)
    if not numeric_dtype(array.dtype):
        raise InvalidProgramError(
            f"{what} is {type(leaf).__name__} of dtype {array.dtype.str!r} (numpy kind "
            f"{array.dtype.kind!r}); a program takes numbers, booleans and arrays of them: "
            "convert it, or keep it out of the call's arguments"
        )
    # not np.ascontiguousarray, which makes a scalar an array of one element
    dtype = jax.dtypes.canonicalize_dtype(array.dtype)
    return np.asarray(array, dtype=dtype.newbyteorder("="), order="C")


class ProgramFunction:
    """The callable that `@pw.program` returns."""

    def __init__(self, fn: Callable[..., Any], name: str | None, weight: float) -> None:
        if not weight > 0:
            raise InvalidProgramError(f"@pw.program(weight={weight!r}): weight must be > 0")
        self.fn = fn
        self.name: str = name or str(getattr(fn, "__name__", "program"))
        self.weight = float(weight)
        self._cache: dict[tuple[Any, tuple[TensorSpec, ...]], TracedProgram] = {}
        self._lock = threading.Lock()
        self.trace_count = 0
        functools.update_wrapper(self, fn, updated=())

    def trace(self, *args: Any) -> TracedProgram:
        """Trace (or fetch the cached trace) for these arguments' shapes."""
        return self._traced(args)[0]

    def _traced(self, args: tuple[Any, ...]) -> tuple[TracedProgram, list[np.ndarray | Array]]:
        """The trace for these arguments' shapes, and the arguments as the call's leaves."""
        if current_trace() is not None:
            raise InvalidProgramError(
                f"program '{self.name}' called inside another program's trace; "
                "call its body function directly instead"
            )
        leaves, in_tree = jax.tree_util.tree_flatten(args)
        try:
            arrays = [_as_input(x) for x in leaves]
        except InvalidProgramError:
            self._name_bad_argument(args)
            raise
        specs = tuple(TensorSpec.of(a.shape, a.dtype) for a in arrays)
        key = (in_tree, specs)
        with self._lock:
            hit = self._cache.get(key)
            if hit is None:
                hit = self._trace(in_tree, specs)
                self._cache[key] = hit
            return hit, arrays

    def _name_bad_argument(self, args: tuple[Any, ...]) -> None:
        """Raises the error of the first argument leaf a program cannot take, naming it
        by its place in the arguments (``args[1]['w']``)."""
        for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
            if not isinstance(leaf, Array):
                _as_array(leaf, f"program '{self.name}' argument args{jax.tree_util.keystr(path)}")

    def _trace(self, in_tree: Any, specs: tuple[TensorSpec, ...]) -> TracedProgram:
        trace = Trace(self.name)
        symbolic = [trace.add_input(s, f"program input {i}") for i, s in enumerate(specs)]
        _local.trace = trace
        try:
            out = self.fn(*jax.tree_util.tree_unflatten(in_tree, symbolic))
        finally:
            _local.trace = None
        out_leaves, out_tree = jax.tree_util.tree_flatten(out)
        refs: list[ValueRef] = []
        for leaf in out_leaves:
            if not isinstance(leaf, Value):
                leaf = trace.add_constant(_as_array(leaf, f"program '{self.name}': a constant it returns"))
            refs.append(leaf.ref)
        if not trace.computations:
            raise InvalidProgramError(
                f"program '{self.name}' calls no pw.pmap/pw.jit function: nothing to run"
            )
        self.trace_count += 1
        program = ir.Program(
            name=self.name,
            inputs=tuple(trace.inputs),
            computations=tuple(trace.computations),
            outputs=tuple(refs),
            slices=tuple(trace.slices.values()),
        )
        constants = tuple(zip(trace.constant_positions, trace.constants))
        return TracedProgram(program, in_tree, out_tree, constants, self.weight)

    def compiled(self, args: tuple[Any, ...], feeds: Mapping[int, int] | None = None) -> CompiledProgram:
        """Traces for ``args`` (no runtime, no devices needed) and keeps the inputs to run it on.

        ``feeds`` maps a returned value's position to the argument position it becomes at
        the next step (``{0: 0}``: the first returned value is the next first argument);
        each pair must have the same pytree structure, shapes and dtypes."""
        traced = self.trace(*args)  # refuses an argument it cannot take, naming its place
        canonical = [_as_array(x) for x in jax.tree_util.tree_leaves(args)]
        inputs = tuple(np.asarray(x) for x in traced.flat_inputs(canonical))
        return CompiledProgram(traced.ir, inputs, traced.weight, traced.flat_feeds(feeds or {}))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from pathways.runtime import default_runtime

        if kwargs:
            raise InvalidProgramError(
                f"program '{self.name}': pass arguments positionally (got keywords {sorted(kwargs)})"
            )
        traced, leaves = self._traced(args)
        outputs = default_runtime().run(traced.ir, traced.flat_inputs(leaves), traced.weight)
        return jax.tree_util.tree_unflatten(traced.out_tree, outputs)

    def __repr__(self) -> str:
        return f"<pathways program '{self.name}'>"


def apply_slice_function(fn: SliceFunction, args: tuple[Any, ...]) -> Any:
    """A slice function call: a graph node when tracing, else a one-node program."""
    trace = current_trace()
    if trace is not None:
        return trace.apply(fn, args)
    single = getattr(fn, "_eager_program", None)
    if single is None:
        single = ProgramFunction(fn, name=fn.name, weight=1.0)
        fn._eager_program = single  # type: ignore[attr-defined]
    return single(*args)


@overload
def program(fn: Callable[..., Any], *, name: str | None = None, weight: float = 1.0) -> ProgramFunction: ...


@overload
def program(
    fn: None = None, *, name: str | None = None, weight: float = 1.0
) -> Callable[[Callable[..., Any]], ProgramFunction]: ...


def program(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, weight: float = 1.0
) -> ProgramFunction | Callable[[Callable[..., Any]], ProgramFunction]:
    """Trace `fn` into a dataflow program over virtual slices: `@pw.program` or
    `@pw.program(name=..., weight=...)` on a function, a `ProgramFunction` either way.

    `weight` is the program's share of any slice it shares with other programs
    (the island scheduler's stride scheduling).
    """
    if fn is None:
        return lambda f: ProgramFunction(f, name, weight)
    return ProgramFunction(fn, name, weight)
