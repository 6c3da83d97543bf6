"""`pw.Array`: a handle to a value that stays on the hosts.

A program call returns one handle per output as soon as the controller has
accepted the call: a future whose shape and dtype are known at once and whose
bytes stay in the stores of the hosts that made them. Handing it to the next
call moves nothing through the client (the hosts use it in place); the client
waits only where it asks for the bytes — `np.asarray(x)`, `float(x)`,
`x.item()`, `pw.fetch(tree)` — or for the end (`block_until_ready`). An error
of the call that makes it surfaces there, at first use.

A small output comes back with the call's answer, and stays an object on the
hosts too: its handle is a future of that answer, and behaves the same. Numpy methods and operators on a
handle (`x.sum()`, `x + 1`) fetch it first and work on the copy.

Handles are pytree leaves. The last reference dropped frees the value on
every host (`Runtime` batches those drops); `delete()` frees it at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from pathways import interruptible
from pathways_wire import ir
from pathways_wire.errors import ExecutionError


class CallFuture:
    """One program call as its handles see it: whether it ended, and how."""

    def __init__(self, program: str, call_id: str) -> None:
        self.program = program
        self.call_id = call_id
        self.error = ""
        self.failure: Exception | None = None
        """What the call raises where it failed before a host ran it (the controller
        refused it, or could not be reached): an error of its own kind, not an
        `ExecutionError`."""
        self.live: dict[ir.ValueRef, int] = {}
        """Outputs with handles, and how many."""
        self.kept: frozenset[ir.ValueRef] | None = None
        """Outputs that stayed objects when the call ended (None while it runs)."""
        self.sent_on: object = None
        """For a call whose `Run` is answered only as it ends (a small call): the connection
        of the controller's calls port the `Run` went on (None: over gRPC). A later call
        may name its outputs before that answer only where its own `Run` follows on it."""
        self._ended = threading.Event()

    def end(self, error: str, failure: Exception | None = None) -> None:
        self.error = error or (str(failure) if failure is not None else "")
        self.failure = failure
        self._ended.set()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def wait_ended(self) -> None:
        interruptible.wait_event(self._ended)

    def ended_within(self, timeout_s: float) -> bool:
        """Whether the call ended, waiting for its end at most `timeout_s`."""
        return self._ended.wait(timeout_s)

    def wait(self) -> None:
        """Until the call ended; raises its error, if it failed."""
        interruptible.wait_event(self._ended)
        if self.failure is not None:
            raise self.failure.with_traceback(None)
        if self.error:
            raise ExecutionError(self.error)


class Array(np.lib.mixins.NDArrayOperatorsMixin):
    """A value of a program call, on the hosts (or, if small, carried along)."""

    def __init__(
        self,
        spec: ir.TensorSpec,
        *,
        value: np.ndarray | None = None,
        call: CallFuture | None = None,
        ref: ir.ValueRef | None = None,
        hosts: tuple[str, ...] = (),
        slice_id: str = "",
        slice_name: str = "",
        generation: int = 0,
        fetch: Callable[[Array], np.ndarray] | None = None,
        sharding: Callable[[], PartitionSpec] | None = None,
        with_answer: bool = False,
    ) -> None:
        self.shape = tuple(int(d) for d in spec.shape)
        self.dtype = np.dtype(spec.dtype)
        self.call, self.ref = call, ref
        """The call that makes the value and which of its values it is (None if carried along)."""
        self.with_answer = with_answer
        """A small value that comes back with its call's answer (`answered`): the client
        carries it, and the hosts keep it as an object too, for a call that names it
        before the answer comes."""
        self.hosts, self.slice_id = hosts, slice_id
        self.slice = slice_name
        """The name of the virtual slice whose hosts hold the value ("" if carried along)."""
        self.generation = generation
        """The launch of the slice's gang that holds it: a relaunched gang lost it."""
        self._value, self._fetch = (_frozen(value) if value is not None else None), fetch
        self._sharding = sharding
        self.on_delete: Callable[[], Any] | None = None
        """Frees the object (once): run by `delete`, or when the last reference goes."""
        self._deleted = False
        self._lock = threading.Lock()

    @staticmethod
    def carried(value: np.ndarray) -> Array:
        """A handle for a value the client has (a small output, or an input passed through)."""
        return Array(ir.TensorSpec.of(value.shape, value.dtype), value=value)

    @staticmethod
    def passed_through(given: np.ndarray) -> Array:
        """A handle for an input a program returns as it is: a copy of it, so that what the
        caller writes into its array later does not change the output, as under `jax.jit`."""
        return Array.carried(np.array(given, copy=True))

    def answered(self, value: np.ndarray) -> None:
        """The bytes of a handle `with_answer`, as its call's answer brought them: set
        before the call ends, so whoever its end wakes finds them."""
        self._value = _frozen(value)

    # ------------------------------------------------------------ where it is

    @property
    def on_hosts(self) -> bool:
        """Whether the value is an object in the hosts' stores (not only carried along)."""
        return self.call is not None and not self._deleted

    @property
    def sharding(self) -> PartitionSpec:
        """How the value is laid out over its slice's mesh, as the computation that made it
        declared: a ``PartitionSpec`` over the mesh's axes (``PartitionSpec()``: replicated)."""
        return self._sharding() if self._sharding is not None else PartitionSpec()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def is_ready(self) -> bool:
        return self._value is not None or (self.call is not None and self.call.ended)

    def block_until_ready(self) -> Array:
        """Waits until the value exists; raises the error of the call that makes it."""
        self._check_live()
        if self.call is not None:
            self.call.wait()
        return self

    def delete(self) -> None:
        """Frees the value on every host now; the handle cannot be used afterwards."""
        with self._lock:
            if self._deleted:
                return
            self._deleted = True
            self._value = None
        if self.on_delete is not None:
            self.on_delete()

    # ------------------------------------------------------------ bytes

    def value(self) -> np.ndarray:
        """The value as numpy, copied to the client once (read-only: every use shares it)."""
        self._check_live()
        with self._lock:
            if self._value is None and self.call is not None:
                self.call.wait()  # the call's error surfaces here
            if self._value is None:
                assert self._fetch is not None
                self._value = _frozen(self._fetch(self))
            return self._value

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """The fetched copy, read-only as JAX's is (`np.asarray(x)`); a writable array of
        its own where numpy asks for a copy (`np.array(x)`) or another dtype."""
        value = self.value()
        if dtype is not None and np.dtype(dtype) != value.dtype:
            return value.astype(dtype)
        return value.copy() if copy else value

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """On the fetched copy; a handle is never written (`x += 1` makes `x` a new numpy array)."""
        args = [x.value() if isinstance(x, Array) else x for x in inputs]
        if any(isinstance(o, Array) for o in kwargs.get("out", ())):
            del kwargs["out"]
        return getattr(ufunc, method)(*args, **kwargs)

    def __float__(self) -> float:
        return float(self.value())

    def __int__(self) -> int:
        return int(self.value())

    def __bool__(self) -> bool:
        return bool(self.value())

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d pw.Array")
        return self.shape[0]

    def __getitem__(self, index: Any) -> Any:
        return self.value()[index]

    def __iter__(self) -> Any:
        return iter(self.value())

    def item(self) -> Any:
        return self.value().item()

    def __getattr__(self, name: str) -> Any:
        """Numpy's methods and attributes (`sum`, `tolist`, `T`...), on the fetched copy. A
        name numpy arrays do not have is an AttributeError at once, fetching nothing (a
        library's `hasattr(x, "devices")` must not copy the value to the client)."""
        if name.startswith("_") or not hasattr(np.ndarray, name):
            raise AttributeError(f"'pw.Array' object has no attribute {name!r}")
        return getattr(self.value(), name)

    def _check_live(self) -> None:
        if self._deleted:
            raise ExecutionError(f"{self.label()} was deleted; it cannot be used any more")

    # ------------------------------------------------------------ words

    def label(self) -> str:
        shape = ",".join(str(d) for d in self.shape)
        return f"pw.Array({self.dtype.name}[{shape}])"

    def __copy__(self) -> Array:
        """The handle itself: a value is never written, and a second handle of one object
        would free it on the hosts when the first one went (`on_delete`)."""
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Array:
        return self

    def __reduce__(self) -> Any:
        raise TypeError(
            f"{self.label()} cannot be pickled: it names a value in the stores of this client's "
            "hosts; pickle its bytes instead (numpy.asarray(x), or pw.fetch(tree) for a pytree)"
        )

    def __repr__(self) -> str:
        label = self.label()[:-1]
        if self._deleted:
            return f"{label}, deleted)"
        if self.call is None:
            return f"{label}, carried by the client)"
        if self.with_answer:
            if not self.call.ended:
                return f"{label}, coming back with the answer of call {self.call.call_id} on slice '{self.slice}'; pending)"
            if self.call.error:
                return f"{label}, of call {self.call.call_id} on slice '{self.slice}'; failed)"
            return f"{label}, carried by the client, and on slice '{self.slice}' (call {self.call.call_id}); ready)"
        where = f"on slice '{self.slice}' hosts {','.join(self.hosts)}"
        if not self.call.ended:
            state = "pending"
        elif self.call.error:
            state = "failed"
        else:
            state = "ready"
        return f"{label}, {where} (call {self.call.call_id}); {state})"


def _frozen(value: np.ndarray) -> np.ndarray:
    """A read-only view of `value`: a handle's bytes are never written, by the client
    either."""
    view = np.asarray(value).view()
    view.flags.writeable = False
    return view


FETCH_THREADS = 16
"""Handles `fetch` copies at once, at most: a model's hundreds of parameters take as many
turns of this many threads, not a thread (and a data connection per host) each."""


def fetch(tree: Any) -> Any:
    """The pytree with every `pw.Array` replaced by its value as numpy, fetched in parallel."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    handles = list({id(x): x for x in leaves if isinstance(x, Array) and x._value is None}.values())
    if len(handles) > 1:
        left = iter(handles)
        lock = threading.Lock()
        threads = [
            threading.Thread(target=_quietly_fetch, args=(left, lock), name=f"pw-fetch-{i}", daemon=True)
            for i in range(min(FETCH_THREADS, len(handles)))
        ]
        for t in threads:
            t.start()
        try:
            for t in threads:
                interruptible.join(t)
        except BaseException:  # interrupted: the threads start no other fetch
            with lock:
                for _ in left:
                    pass
            raise
    return jax.tree_util.tree_unflatten(
        treedef, [x.value() if isinstance(x, Array) else x for x in leaves]
    )


def _quietly_fetch(handles: Iterator[Array], lock: threading.Lock) -> None:
    """Fetches handles ahead, the next one each time, until none is left; an error
    surfaces again when `fetch` asks for the value itself."""
    while True:
        with lock:
            handle = next(handles, None)
        if handle is None:
            return
        try:
            handle.value()
        except Exception:
            pass
