"""Values stay on the hosts: `pw.Array` handles, asynchronous calls, client-owned objects.

A call returns handles at once; a handle passed to the next call moves no bytes
through the client (`Runtime.traffic`): on the same slice it is used in place, on
another slice or island it goes host to host; an error surfaces where a
handle is first used; dropping the last handle, or the client dying, frees the value
in the hosts' stores.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways as pw
from bench import mlp
from pathways.runtime import INLINE_BYTES
from pathways_wire import pathways_pb2 as pb
from pathways_wire.driver_protocol import CLIENT_TOKEN_FILE, ENV_PROGRAM_TOKEN_FILE
from pathways_wire.slice_token import call_metadata
from tests.integration.broken_programs import first_computation_corrupt
from tests.integration.host_pids import host_pid, host_token

pytestmark = pytest.mark.timeout(300)

BIG = INLINE_BYTES // 4 + 1024
"""Elements of a float32 vector too large to come back inline."""


def store_bytes(runtime: pw.Runtime, hosts: tuple[str, ...], tokens: dict[str, str] | None = None) -> int:
    """Bytes in the hosts' worker stores, asked with the client's token for each host or,
    for a slice another client made, the slice's own (`tokens`)."""
    replies = [
        runtime.host(h).Health(pb.HealthRequest(), timeout=10, metadata=call_metadata((tokens or {}).get(h, "")))
        for h in hosts
    ]
    assert all(r.detailed for r in replies), "a host did not take the token: its store is not told"
    return sum(r.worker_store_bytes for r in replies)


def wait_until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.2)


def test_a_call_returns_handles_that_say_what_and_where_their_value_is(runtime: pw.Runtime) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=1, name="handles")
    scale = pw.jit(lambda x: x * 2.0, slice=vslice)

    @pw.program(name="handles")
    def doubled(x: Any) -> Any:
        return {"y": scale(x)}

    x = np.arange(BIG, dtype=np.float32)
    out = doubled(x)
    y = out["y"]

    assert isinstance(y, pw.Array)
    assert (y.shape, y.dtype) == ((BIG,), np.dtype(np.float32))
    assert jax.tree_util.tree_leaves(out) == [y], "a handle is a pytree leaf"
    assert y.block_until_ready() is y and y.is_ready()
    assert f"pw.Array(float32[{BIG}]" in repr(y) and "on slice 'handles' hosts" in repr(y)
    assert repr(y).endswith("ready)")
    np.testing.assert_allclose(np.asarray(y), x * 2.0)
    np.testing.assert_allclose(pw.fetch(out)["y"], x * 2.0)
    assert float(doubled(np.ones(BIG, np.float32))["y"][3]) == 2.0


@pytest.mark.parametrize("columns", [BIG, 8], ids=["on the hosts", "carried back with the reply"])
def test_a_handle_says_its_partition_spec_over_its_slice_mesh(runtime: pw.Runtime, columns: int) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=4, name=f"specs-{columns}")
    both = pw.jit(
        lambda a: (a * 2.0, a + 1.0), slice=vslice, in_shardings=P("x"), out_shardings=(P("x"), P())
    )
    x = np.ones((4, columns), np.float32)
    by_rows, replicated = both(x)

    assert (by_rows.sharding, replicated.sharding) == (P("x"), P())
    assert by_rows.slice == f"specs-{columns}"
    np.testing.assert_allclose(np.asarray(by_rows), x * 2.0)
    np.testing.assert_allclose(np.asarray(replicated), x + 1.0)


@pytest.mark.parametrize("devices", [1, 8])
def test_scalar_inputs_and_outputs_stay_scalars_as_under_jax_jit(runtime: pw.Runtime, devices: int) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=devices)
    step = pw.jit(lambda w, lr: (w - lr * w, lr * 0.5), slice=vslice)

    @pw.program(name=f"scalars-{devices}")
    def decay(w: Any, lr: Any) -> Any:
        return step(w, lr)

    w, lr = np.float32(4.0), np.float32(0.5)
    expected = jax.jit(lambda w, lr: (w - lr * w, lr * 0.5))(w, lr)
    for _ in range(2):  # the second step reads the first step's scalar handles on the hosts
        w, lr = decay(w, lr)
        assert (w.shape, lr.shape) == ((), ())
    assert np.asarray(w).shape == ()
    assert (float(w), float(lr)) == (4.0 * 0.5 * 0.75, 0.125)
    assert [np.asarray(v).shape for v in expected] == [(), ()]


@pytest.mark.parametrize("columns", [BIG, 8], ids=["through the hosts", "inline with the call"])
def test_an_input_a_program_returns_as_it_is_keeps_its_value_when_the_caller_writes_its_array(
    runtime: pw.Runtime, columns: int
) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=1)
    inc = pw.jit(lambda y: y + 1, slice=vslice)

    @pw.program(name=f"pass-through-{columns}")
    def both(x: Any, y: Any) -> Any:
        return x, inc(y)

    x = np.ones((2, columns), np.float32)
    same, _ = both(x, np.zeros_like(x))
    x[0, 0] = 5.0
    np.testing.assert_array_equal(np.asarray(same), np.ones((2, columns), np.float32))
    assert float(np.asarray(same).sum()) == 2 * columns


@pytest.mark.parametrize("columns", [BIG, 8], ids=["through the hosts", "inline with the call"])
def test_a_big_endian_argument_computes_on_its_values_not_its_bytes_misread(runtime: pw.Runtime, columns: int) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=8)
    double = pw.jit(lambda x: x * 2, slice=vslice, in_shardings=P(None, "x"))

    @pw.program(name=f"double-{columns}")
    def twice(x: Any) -> Any:
        return double(x)

    x = np.arange(2 * columns * 8, dtype=">f4").reshape(2, columns * 8)
    got = twice(x)
    assert got.dtype == np.float32
    # jax.jit refuses a big-endian argument outright; a program takes its values
    np.testing.assert_array_equal(np.asarray(got), x.astype(np.float32) * 2)


@pytest.mark.parametrize("devices", [1, 8])
def test_a_training_loop_sends_only_its_batches_after_the_first_step(
    runtime: pw.Runtime, devices: int
) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=devices)  # 8: two hosts of 4
    step_fn = pw.jit(mlp.sgd_step, slice=vslice, in_shardings=(None, P("x"), P("x")),
                     out_shardings=(None, None))

    @pw.program(name=f"train-resident-{devices}")
    def train(params: Any, x: Any, y: Any) -> Any:
        return step_fn(params, x, y)

    params: Any = mlp.init_params()
    expected: Any = params
    reference = jax.jit(mlp.sgd_step)
    batches = [mlp.batch(i) for i in range(5)]
    params, loss = train(params, *batches[0])
    expected, _ = reference(expected, *batches[0])
    before = runtime.traffic
    for x, y in batches[1:]:
        params, loss = train(params, x, y)
        expected, expected_loss = reference(expected, x, y)
    loss.block_until_ready()
    used = runtime.traffic - before

    assert used.sent == 4 * mlp.batch_bytes(), "no parameter bytes go to the hosts, each row to one host"
    assert used.received == 0, "nothing comes back until the client asks"
    assert all(isinstance(p, pw.Array) for p in jax.tree_util.tree_leaves(params))
    assert params["w1"].sharding == P(), params["w1"].sharding
    np.testing.assert_allclose(float(loss), float(expected_loss), rtol=1e-5)
    got = pw.fetch(params)
    for name in ("w1", "b1", "w2", "b2"):
        np.testing.assert_allclose(got[name], np.asarray(expected[name]), rtol=1e-4, atol=1e-6)


def test_an_error_surfaces_at_the_first_use_of_a_handle_naming_program_computation_and_host(
    runtime: pw.Runtime,
) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=4)
    good = pw.jit(lambda x: x + 1.0, slice=vslice)

    @pw.program(name="broken-later")
    def broken(x):  # type: ignore[no-untyped-def]
        return good(x)

    x = np.ones(BIG, np.float32)
    program, first = first_computation_corrupt(broken.trace(x).ir)

    (y,) = runtime.run(program, [x])   # accepted: no error yet

    with pytest.raises(pw.ExecutionError) as info:
        np.asarray(y)
    text = str(info.value)
    assert "broken-later" in text and first.name in text and "host-0" in text, text
    with pytest.raises(pw.ExecutionError):
        y.block_until_ready()


def test_a_call_given_the_handle_of_a_failed_call_fails_naming_that_calls_program_and_error(
    runtime: pw.Runtime,
) -> None:
    """Whether the failure reached the client before the next call (the handle's bytes are
    then asked for), after the controller freed the failed call (the next call is refused
    for an unknown object: `runtime.failed_source`), or while the next call waits on its
    hosts for the object, the next call's error is the first call's."""
    vslice = pw.make_virtual_device_set().add_slice(devices=1)
    good = pw.jit(lambda x: x + 1.0, slice=vslice)

    @pw.program(name="breaks")
    def broken(x):  # type: ignore[no-untyped-def]
        return good(x)

    @pw.program(name="uses-it")
    def uses(x):  # type: ignore[no-untyped-def]
        return good(x)

    x = np.ones(4, np.float32)
    program, first = first_computation_corrupt(broken.trace(x).ir)
    for _ in range(3):
        (y,) = runtime.run(program, [x])
        with pytest.raises(pw.ExecutionError) as info:
            np.asarray(uses(y))
        text = str(info.value)
        assert f"program 'breaks' computation '{first.name}'" in text, text


SLOW_LOOPS = 400_000_000
"""Increments of a small int32 vector: about a second of one core here, long enough that a
call that waited for its end could not return before it."""


def slow_count_on(vslice: Any) -> Any:
    """A computation on `vslice` adding `SLOW_LOOPS` to a small int32 vector, one at a time."""
    return pw.jit(lambda v: jax.lax.fori_loop(0, SLOW_LOOPS, lambda i, a: a + 1, v), slice=vslice)


def test_a_call_of_small_values_returns_before_it_ends_and_its_handle_waits_for_the_answer(
    runtime: pw.Runtime,
) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=1)
    count = slow_count_on(vslice)

    @pw.program(name="small-and-slow")
    def small_and_slow(x):  # type: ignore[no-untyped-def]
        return count(x)

    x = np.zeros(4, np.int32)
    small_and_slow(x).block_until_ready()  # compiled and loaded: the next call only runs
    before = runtime.traffic

    y = small_and_slow(x)

    assert not y.is_ready(), "the call waited for its end"
    assert repr(y).startswith("pw.Array(int32[4], coming back with the answer of call small-and-slow-"), repr(y)
    assert repr(y).endswith(f"on slice '{vslice.name}'; pending)"), repr(y)
    np.testing.assert_array_equal(np.asarray(y), np.full(4, SLOW_LOOPS, np.int32))
    assert y.is_ready() and repr(y).startswith("pw.Array(int32[4], carried by the client, and on slice"), repr(y)
    assert runtime.traffic - before == pw.ClientTraffic(sent=x.nbytes, received=x.nbytes), (
        "the input went with the call and the output came back with its answer"
    )


def test_a_small_handle_passed_on_before_its_answer_came_goes_out_at_once_and_is_freed_when_dropped(
    runtime: pw.Runtime,
) -> None:
    """A small call leaves its outputs as objects too: a later call names one and is
    dispatched at once, its hosts waiting for the value, and none of it goes through the client."""
    vslice = pw.make_virtual_device_set().add_slice(devices=1)
    count = slow_count_on(vslice)
    plus = pw.jit(lambda v: v + 1, slice=vslice)

    @pw.program(name="small-count")
    def slow(x):  # type: ignore[no-untyped-def]
        return count(x)

    @pw.program(name="small-plus")
    def then(x):  # type: ignore[no-untyped-def]
        return plus(x)

    x = np.zeros(4, np.int32)
    then(slow(x)).block_until_ready()  # compiled and loaded: the calls below only run
    before = runtime.traffic

    y = slow(x)
    z = then(y)

    assert not y.is_ready() and not z.is_ready(), "the second call waited for the first one's answer"
    np.testing.assert_array_equal(np.asarray(z), np.full(4, SLOW_LOOPS + 1, np.int32))
    np.testing.assert_array_equal(np.asarray(y), np.full(4, SLOW_LOOPS, np.int32))
    assert (runtime.traffic - before).sent == x.nbytes, "y went to the second call from the hosts' store"
    hosts = tuple(y.hosts)
    assert hosts and store_bytes(runtime, hosts) >= 2 * x.nbytes, "y and z are objects on the hosts"

    del y, z
    gc.collect()
    then(x).block_until_ready()  # carries the drops
    wait_until("the dropped small values freed", lambda: store_bytes(runtime, hosts) == 0, 30)


def plus_one_on(name: str, devices: int) -> pw.ProgramFunction:
    """A program adding one on a new slice called `name`."""
    vslice = pw.make_virtual_device_set().add_slice(devices=devices, name=name)
    plus = pw.jit(lambda x: x + 1.0, slice=vslice)

    @pw.program(name=name)
    def plus_one(x: Any) -> Any:
        return plus(x)

    return plus_one


def test_dropping_the_last_handle_frees_the_value_on_its_hosts(runtime: pw.Runtime) -> None:
    plus_one = plus_one_on("drops", devices=1)
    kept = plus_one(np.zeros(BIG, np.float32))
    hosts = kept.hosts
    held = plus_one(kept)
    held.block_until_ready()
    wait_until("both values held", lambda: store_bytes(runtime, hosts) >= 2 * BIG * 4, 30)

    del held
    gc.collect()
    wait_until("the dropped value freed", lambda: store_bytes(runtime, hosts) == BIG * 4, 30)
    np.testing.assert_allclose(np.asarray(kept), np.ones(BIG))
    kept.delete()
    wait_until("the deleted value freed", lambda: store_bytes(runtime, hosts) == 0, 30)
    with pytest.raises(pw.ExecutionError, match="deleted"):
        np.asarray(kept)



def test_a_loop_that_rebinds_its_value_leaves_only_the_latest_on_the_hosts(runtime: pw.Runtime) -> None:
    """Each call carries the drops of the handles let go since the last one (and a drop
    no call takes goes on its own), so the hosts never hold more than a step's values."""
    plus_one = plus_one_on("rebinds", devices=1)
    value = plus_one(np.zeros(BIG, np.float32))
    hosts = value.hosts
    for _ in range(6):
        value = plus_one(value)
    value.block_until_ready()
    wait_until("only the latest value held", lambda: store_bytes(runtime, hosts) == BIG * 4, 30)
    np.testing.assert_allclose(np.asarray(value), np.full(BIG, 7.0))


def test_a_handle_dropped_while_its_call_runs_leaves_no_object_when_the_call_ends(
    runtime: pw.Runtime,
) -> None:
    """The controller frees a call as it ends, keeping the outputs that had handles when
    it started; one whose handle went meanwhile is dropped then, so only the held one stays."""
    vslice = pw.make_virtual_device_set().add_slice(devices=1, name="dropped-early")

    def slow_pair(x: Any) -> Any:
        spun = jax.lax.fori_loop(0, 200, lambda i, v: jax.numpy.tanh(v + 1.0), x)
        return spun, x + 1.0

    pair = pw.jit(slow_pair, slice=vslice)

    @pw.program(name="dropped-early")
    def both(x: Any) -> Any:
        return pair(x)

    dropped, held = both(np.zeros(BIG, np.float32))
    hosts = held.hosts
    del dropped
    gc.collect()
    held.block_until_ready()
    wait_until("only the held output stays", lambda: store_bytes(runtime, hosts) == BIG * 4, 30)
    np.testing.assert_allclose(np.asarray(held), np.ones(BIG))
    held.delete()
    wait_until("the deleted value freed", lambda: store_bytes(runtime, hosts) == 0, 30)

CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import pathways as pw

    runtime = pw.connect(sys.argv[1])
    vslice = pw.make_virtual_device_set().add_slice(devices=1, name="orphans")
    plus = pw.jit(lambda x: x + 1.0, slice=vslice)

    @pw.program(name="orphans")
    def plus_one(x):
        return plus(x)

    held = [plus_one(np.zeros(int(sys.argv[2]), np.float32)) for _ in range(3)]
    held[-1].block_until_ready()
    print(",".join(held[0].hosts), flush=True)
    time.sleep(600)
    """
)


def test_a_killed_clients_objects_are_freed_within_its_lease(runtime: pw.Runtime) -> None:
    assert runtime.cluster is not None
    token = runtime.cluster.state_dir / CLIENT_TOKEN_FILE  # the second client presents it too
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, runtime.address, str(BIG)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", ENV_PROGRAM_TOKEN_FILE: str(token)},
    )
    try:
        assert child.stdout is not None
        hosts = tuple(child.stdout.readline().strip().split(","))
        assert hosts != ("",), "the child printed its hosts"
        slice_info = next(s for s in runtime.describe().slices if s.name == "orphans")
        assert {h.address for h in slice_info.hosts} == set(hosts)
        tokens = {h.address: host_token(runtime, slice_info, i) for i, h in enumerate(slice_info.hosts)}
        wait_until("the child's objects held", lambda: store_bytes(runtime, hosts, tokens) >= 3 * BIG * 4, 30)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        wait_until("the killed client's objects freed", lambda: store_bytes(runtime, hosts, tokens) == 0, 40)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)


AFTER_SHUTDOWN = textwrap.dedent(
    """
    import sys
    import jax
    import numpy as np
    import pathways as pw

    pw.connect(islands={"island-a": 8}, devices_per_host=4)
    pool = pw.make_virtual_device_set().add_slice(devices=2)
    double = pw.jit(lambda x: x * 2.0, slice=pool)

    @pw.program(name="double")
    def program(v):
        return double(v)

    y = program(np.ones(int(sys.argv[1]), np.float32)).block_until_ready()
    answered = program(np.ones(4, np.float32)).block_until_ready()
    count = pw.jit(lambda v: jax.lax.fori_loop(0, int(sys.argv[2]), lambda i, a: a + 1, v), slice=pool)

    @pw.program(name="counting")
    def counting(v):
        return count(v)

    counting(np.zeros(4, np.int32)).block_until_ready()
    pending = counting(np.zeros(4, np.int32))
    pw.shutdown()
    try:
        np.asarray(y)
    except pw.RuntimeUnavailableError as err:
        print("refused:", err)
    print("kept:", np.asarray(answered).tolist())
    try:
        np.asarray(pending)
    except pw.RuntimeUnavailableError as err:
        print("pending refused:", err)
    """
)


def test_a_handle_used_after_its_runtime_shut_down_is_refused_naming_the_shutdown() -> None:
    """Its hosts went with the runtime: the fetch is refused, and the process lives on (gRPC
    crashed it on the closed channel before); so is a small call's handle whose answer had not
    come, while one whose answer came keeps its value. A process of its own: it shuts its
    runtime down."""
    done = subprocess.run([sys.executable, "-c", AFTER_SHUTDOWN, str(BIG), str(SLOW_LOOPS)], capture_output=True,
                          text=True, timeout=240, env={k: v for k, v in os.environ.items() if k != "PATHWAYS_CONTROLLER"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"refused: fetching pw.Array(float32[{BIG}]" in done.stdout, done.stdout
    assert "this client's runtime was shut down (pw.shutdown() or Runtime.close())" in done.stdout
    assert "kept: [2.0, 2.0, 2.0, 2.0]" in done.stdout, "a small value that came back stays with the client"
    assert "pending refused: program 'counting' call counting-" in done.stdout, done.stdout
    assert "shut down (pw.shutdown() or Runtime.close()) before the call's answer came" in done.stdout, done.stdout


def test_a_handle_whose_gang_was_lost_fails_clearly_when_used(runtime: pw.Runtime) -> None:
    plus_one = plus_one_on("lost", devices=4)
    held = plus_one(np.zeros(BIG, np.float32)).block_until_ready()
    (before,) = [s for s in runtime.describe().slices if s.name == "lost"]
    victim = host_pid(runtime, before, 0, "worker")
    assert victim is not None, "the slice's worker runs"
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(pw.PathwaysError):  # the host's death shows in the next call
        np.asarray(plus_one(np.zeros(BIG, np.float32)))

    def relaunched() -> bool:
        now = [s for s in runtime.describe().slices if s.name == "lost"]
        return bool(now) and now[0].generation > before.generation
    wait_until("the gang relaunched", relaunched, 120)

    with pytest.raises(pw.ExecutionError) as used:
        plus_one(held)
    assert "slice 'lost'" in str(used.value) and "lost" in str(used.value), str(used.value)
    with pytest.raises(pw.ExecutionError) as elsewhere:
        plus_one_on("lost-reader", devices=1)(held)
    text = str(elsewhere.value)
    assert "program 'lost-reader'" in text and "input 0" in text and "slice 'lost'" in text, text
    with pytest.raises(pw.PathwaysError) as fetched:
        np.asarray(held)
    assert "slice 'lost'" in str(fetched.value), str(fetched.value)


def stage_programs(
    name: str, island: str, reader_island: str, step: Callable[[Any], Any] = lambda v: v * 3.0
) -> tuple[pw.ProgramFunction, pw.ProgramFunction]:
    """`step` sharded over two hosts (8 devices) of `island`, and `v + 1` on one host of
    `reader_island`, replicated: a value read there is resharded on the way."""
    ds = pw.make_virtual_device_set()
    holder = ds.add_slice(devices=8, island=island)
    reader = ds.add_slice(devices=4, island=reader_island)
    made = pw.jit(step, slice=holder, in_shardings=P("x"), out_shardings=P("x"))
    plus = pw.jit(lambda v: v + 1.0, slice=reader, in_shardings=P(), out_shardings=P())

    @pw.program(name=f"{name}-make")
    def make(v: Any) -> Any:
        return made(v)

    @pw.program(name=f"{name}-read")
    def read(v: Any) -> Any:
        return plus(v)

    return make, read


@pytest.mark.parametrize("islands", [("island-a", "island-b"), ("island-a", "island-a")])
def test_a_handle_read_on_another_slice_goes_host_to_host_and_stays_on_its_own(
    runtime: pw.Runtime, islands: tuple[str, str]
) -> None:
    make, read = stage_programs(f"hop-{islands[1]}", *islands)
    x = np.arange(BIG, dtype=np.float32)
    made = make(x)
    made.block_until_ready()

    before = runtime.traffic
    moved = read(made)
    moved.block_until_ready()
    passed = runtime.traffic - before

    assert (passed.sent, passed.received) == (0, 0), "the handle's value went host to host"
    np.testing.assert_allclose(np.asarray(moved), x * 3.0 + 1.0)
    assert (runtime.traffic - before).received == moved.nbytes, "only the fetch passes the client"
    assert set(made.hosts).isdisjoint(moved.hosts) and len(made.hosts) == 2
    np.testing.assert_allclose(np.asarray(made), x * 3.0)  # the holder keeps its value
    np.testing.assert_allclose(np.asarray(read(made)), x * 3.0 + 1.0)  # and sends it again

    holder_hosts, reader_hosts = made.hosts, moved.hosts
    del moved
    gc.collect()
    wait_until("the reader's copies freed with its calls", lambda: store_bytes(runtime, reader_hosts) == 0, 30)
    assert store_bytes(runtime, holder_hosts) == made.nbytes, "the holder's object stays"
    made.delete()
    wait_until("the deleted object freed", lambda: store_bytes(runtime, holder_hosts) == 0, 30)


def test_a_handle_passed_on_before_its_call_finished_arrives_once_computed(runtime: pw.Runtime) -> None:
    """The reader is dispatched while the maker still loops: its hosts wait for the value."""
    loops = 1_000_000  # about half a second here: the reader goes out long before
    make, read = stage_programs(
        "hop-early", "island-a", "island-b",
        step=lambda v: jax.lax.fori_loop(0, loops, lambda i, a: a + 1.0, v),
    )
    x = np.zeros(BIG, dtype=np.float32)
    before = runtime.traffic
    moved = read(make(x))

    np.testing.assert_allclose(np.asarray(moved), np.full(BIG, loops + 1.0))
    assert (runtime.traffic - before).sent == x.nbytes, "only the maker's input, half to each of its hosts"
