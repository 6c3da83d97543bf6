"""Client-owned objects, decided without processes: the lease, the controller's object
table, and what a `pw.Array` handle says and does before any bytes move."""

from __future__ import annotations

import copy
import pickle
import threading

import jax
import numpy as np
import pytest

import pathways as pw
from pathways.array import FETCH_THREADS, Array, CallFuture
from pathways.runtime import failed_source
from pathways_operator.controller.errors import ControllerError
from pathways_operator.controller.objects import ObjectRecord, ObjectTable, object_ref
from pathways_operator.core.client_leases import lapsed
from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb


# ---------------------------------------------------------------- the lease


def test_a_client_silent_for_longer_than_the_lease_lapses_and_others_do_not() -> None:
    seen = {"quiet": 100.0, "talking": 108.0, "just-now": 110.0}

    assert lapsed(seen, now=110.5, lease_s=10.0) == ["quiet"]
    assert lapsed(seen, now=110.0, lease_s=10.0) == []
    assert lapsed({}, now=1e9, lease_s=10.0) == []


# ---------------------------------------------------------------- the object table


def table_with(*keys: tuple[str, int, int], client: str = "alice") -> ObjectTable:
    table = ObjectTable()
    for key in keys:
        table.add(key, ObjectRecord(client, "slice-1", "train", generation=1))
    return table


def test_finishing_a_call_keeps_only_the_outputs_its_client_holds() -> None:
    table = table_with(("c1", 0, 0), ("c1", 1, 0))

    table.finish("c1", keep=[(1, 0)])

    assert len(table) == 1
    key, record = table.resolve(object_ref(("c1", 1, 0)), "alice", "input 0")
    assert key == ("c1", 1, 0) and record.slice_id == "slice-1"
    with pytest.raises(ControllerError) as gone:
        table.resolve(object_ref(("c1", 0, 0)), "alice", "program 'p' call c2 input 0")
    assert gone.value.code == "NOT_FOUND"
    assert "program 'p' call c2 input 0: object (computation 0, output 0) of call c1 is not known" in str(gone.value)


def test_an_object_of_another_client_is_refused() -> None:
    table = table_with(("c1", 0, 0))

    with pytest.raises(ControllerError) as refused:
        table.resolve(object_ref(("c1", 0, 0)), "mallory", "input 0")

    assert refused.value.code == "PERMISSION_DENIED"


def test_dropping_returns_the_live_objects_by_slice_and_only_the_owners() -> None:
    table = table_with(("c1", 0, 0), ("c1", 1, 0))

    assert table.drop([("c1", 0, 0)], "mallory") == {}
    assert table.drop([("c1", 0, 0), ("nope", 0, 0)], "alice") == {"slice-1": [("c1", 0, 0)]}
    assert table.owned_by("alice") == [("c1", 1, 0)]


def test_an_object_of_a_lost_gang_fails_naming_the_slice_and_why() -> None:
    table = table_with(("c1", 0, 0))

    table.lose_slice("slice-1", "host host-0 of slice 'train' failed (killed)")

    with pytest.raises(ControllerError) as lost:
        table.resolve(object_ref(("c1", 0, 0)), "alice", "input 0")
    assert "on slice 'train' was lost: host host-0 of slice 'train' failed (killed)" in str(lost.value)
    assert table.drop([("c1", 0, 0)], "alice") == {}, "nothing to free on a gang that is gone"


# ---------------------------------------------------------------- handles


def pending_handle() -> tuple[Array, CallFuture]:
    call = CallFuture("train", "train-1")
    handle = Array(
        ir.TensorSpec.of((2, 3), np.float32), call=call, ref=ir.ValueRef(0, 0),
        hosts=("10.0.0.1:1", "10.0.0.2:1"), slice_id="s1", slice_name="train",
        fetch=lambda _: np.ones((2, 3), np.float32),
    )
    return handle, call


def test_a_handle_is_a_pytree_leaf_that_says_where_its_value_lives() -> None:
    handle, call = pending_handle()

    assert jax.tree_util.tree_leaves({"w": handle}) == [handle]
    assert (handle.shape, handle.dtype, handle.nbytes) == ((2, 3), np.dtype(np.float32), 24)
    assert not handle.is_ready()
    assert repr(handle) == (
        "pw.Array(float32[2,3], on slice 'train' hosts 10.0.0.1:1,10.0.0.2:1 (call train-1); pending)"
    )
    call.end("")
    assert handle.is_ready() and repr(handle).endswith("; ready)")
    np.testing.assert_array_equal(pw.fetch({"w": handle})["w"], np.ones((2, 3)))
    assert float((handle + 1).sum()) == 12.0


def test_a_failed_calls_error_surfaces_at_the_first_use_of_its_handle() -> None:
    handle, call = pending_handle()
    call.end("program 'train' computation 'step' (index 0) of call train-1 on host host-0 failed: boom")

    with pytest.raises(pw.ExecutionError, match="on host host-0 failed: boom"):
        np.asarray(handle)
    with pytest.raises(pw.ExecutionError, match="boom"):
        handle.block_until_ready()
    assert repr(handle).endswith("; failed)")


def test_a_call_refused_for_an_unknown_object_raises_the_error_of_the_failed_call_that_made_it() -> None:
    handle, call = pending_handle()
    objects = [pb.ObjectInput(index=1, object=pb.ObjectRef(call_id="train-1"))]
    threading.Timer(0.05, call.end, ["computation 'step' of call train-1 on host host-0 failed: boom"]).start()

    failed = failed_source("eval", "eval-7", [np.zeros(1), handle], objects, wait_s=10.0)

    assert isinstance(failed, pw.ExecutionError)
    assert str(failed) == (
        "program 'eval' call eval-7 input 1: it is an output of call train-1 of program 'train', "
        "which failed: computation 'step' of call train-1 on host host-0 failed: boom"
    )


def test_a_refusal_stands_where_the_call_that_made_the_object_succeeded_or_has_not_ended() -> None:
    handle, call = pending_handle()
    objects = [pb.ObjectInput(index=0, object=pb.ObjectRef(call_id="train-1"))]

    assert failed_source("eval", "eval-7", [handle], objects, wait_s=0.01) is None, "still running"
    call.end("")
    assert failed_source("eval", "eval-7", [handle], objects, wait_s=0.01) is None, "it succeeded"


def test_a_deleted_handle_frees_its_object_once_and_cannot_be_used() -> None:
    handle, call = pending_handle()
    freed: list[int] = []
    handle.on_delete = lambda: freed.append(1)

    handle.delete()
    handle.delete()

    assert freed == [1]
    with pytest.raises(pw.ExecutionError, match=r"pw.Array\(float32\[2,3\]\) was deleted"):
        np.asarray(handle)


def test_a_copied_handle_is_the_handle_itself_and_pickling_one_says_to_pickle_its_bytes() -> None:
    handle, _ = pending_handle()
    params = {"w": handle, "lr": 0.1}

    assert copy.copy(handle) is handle
    assert copy.deepcopy(params)["w"] is handle, "a second handle would free the object when the first goes"
    with pytest.raises(TypeError, match=r"pw.Array\(float32\[2,3\]\) cannot be pickled: .*numpy.asarray\(x\)"):
        pickle.dumps(params)


def test_a_name_numpy_arrays_lack_is_an_attribute_error_that_fetches_nothing() -> None:
    call = CallFuture("train", "train-1")
    fetched: list[int] = []

    def fetch(_: Array) -> np.ndarray:
        fetched.append(1)
        return np.ones((2, 3), np.float32)

    handle = Array(ir.TensorSpec.of((2, 3), np.float32), call=call, ref=ir.ValueRef(0, 0), fetch=fetch)
    call.end("")

    assert not hasattr(handle, "devices") and not hasattr(handle, "addressable_shards")
    with pytest.raises(AttributeError, match="'pw.Array' object has no attribute 'devices'"):
        handle.devices()
    assert fetched == [], "no fetch for a name the copy would not have either"
    assert handle.tolist() == [[1.0] * 3] * 2 and fetched == [1], "numpy's own names fetch, once"


def test_fetch_copies_each_handle_once_on_at_most_its_bound_of_threads() -> None:
    running, most, calls, lock = [0], [0], [0], threading.Lock()
    first_turn = threading.Barrier(FETCH_THREADS, timeout=10)

    def slow(handle: Array) -> np.ndarray:
        with lock:
            running[0] += 1
            calls[0] += 1
            most[0] = max(most[0], running[0])
            waits = calls[0] <= FETCH_THREADS
        if waits:
            first_turn.wait()  # the first turn: every thread busy at once, none more
        with lock:
            running[0] -= 1
        return np.full((1,), handle.shape[0], np.float32)

    handles = []
    for i in range(3 * FETCH_THREADS + 5):
        call = CallFuture("p", f"p-{i}")
        call.end("")
        handles.append(Array(ir.TensorSpec.of((i + 1,), np.float32), call=call, ref=ir.ValueRef(0, 0), fetch=slow))

    got = pw.fetch({"all": handles, "again": handles[0]})

    assert [float(v[0]) for v in got["all"]] == [float(i + 1) for i in range(len(handles))]
    assert float(got["again"][0]) == 1.0
    assert calls[0] == len(handles), "each handle fetched once, the one named twice too"
    assert most[0] == FETCH_THREADS, f"{most[0]} fetches ran at once"


def test_a_fetched_value_is_read_only_as_jaxs_and_numpy_copies_are_the_callers() -> None:
    handle, call = pending_handle()
    call.end("")

    shared = np.asarray(handle)
    with pytest.raises(ValueError, match="read-only"):
        shared += 1
    own = np.array(handle)
    own += 1
    wider = np.asarray(handle, dtype=np.float64)
    wider += 1
    assert float(np.asarray(handle).sum()) == 6.0, "the handle's value is what its call made"
    assert float(own.sum()) == float(wider.sum()) == 12.0 and wider.dtype == np.float64
    assert not pw.fetch({"w": handle})["w"].flags.writeable

    mine = np.zeros(2, np.float32)
    carried = Array.carried(mine)
    mine[0] = 5.0  # the caller's own array stays writable
    assert not np.asarray(carried).flags.writeable
