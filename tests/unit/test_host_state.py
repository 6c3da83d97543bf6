"""The host's state machine, stimulus by stimulus: no processes, sockets, threads or clocks.

Values are opaque to the machine, so plain strings stand in for jax.Arrays;
the tests play the driver's part, answering each `Dispatch` with
`ComputationDispatched` and firing timers by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_worker.value_ref import Ref
from pathways_worker.worker.call_plan import layout_program
from pathways_worker.worker import host_state
from pathways_worker.worker.host_state import FINISH_BATCH, FINISH_BATCH_BYTES, RUN_LIMIT, HostState
from pathways_worker.worker.instructions import (
    CancelTimer,
    Dispatch,
    DispatchRun,
    Export,
    FinishBatch,
    Instruction,
    Log,
    RoomWanted,
    RunValue,
    StartTimer,
    StoreChanged,
)
from pathways_worker.worker.object_store import ObjectId
from pathways_worker.worker.states import InvalidTransition
from pathways_worker.worker.stimuli import (
    BatchFinished,
    CallFailed,
    CallLaunched,
    CallReleased,
    ComputationDispatched,
    ComputationFailedLate,
    ExportRequested,
    ExportWritten,
    GrantId,
    GrantsReceived,
    ObjectForwarded,
    ObjectsDropped,
    ProgramLoaded,
    RunDispatched,
    TimerFired,
    ValueArrived,
)

INPUT: Ref = (-1, 0)
OUT_BYTES = 16
T = TypeVar("T")


# ---------------------------------------------------------------- builders


def program(
    *computations: Sequence[Ref], program_id: str = "prog", other_slice: Sequence[int] = ()
) -> pb.HostProgram:
    """Computation i reads the given values and makes one output; those listed in
    `other_slice` run on slice 'b', the rest on this host's slice 'a'."""
    comps = [
        pb.Computation(
            index=i, name=f"f{i}", slice="b" if i in other_slice else "a",
            inputs=[pb.ValueRef(node=n, index=k) for n, k in inputs],
            outputs=[pb.TensorSpec(shape=[4], dtype="float32")],
        )
        for i, inputs in enumerate(computations)
    ]
    return pb.HostProgram(
        program_id=program_id, program=pb.Program(name=program_id, computations=comps), slice="a"
    )


def loaded(
    host_program: pb.HostProgram,
    errors: dict[int, str] | None = None,
    partial: dict[int, frozenset[int]] | None = None,
) -> ProgramLoaded:
    layout = layout_program(host_program)
    errors = errors or {}
    return ProgramLoaded(
        layout,
        errors,
        {i: (OUT_BYTES,) for i in layout.computations if i not in errors},
        {c.index: tuple(c.outputs) for c in host_program.program.computations},
        partial or {},
    )


def launch(
    call_id: str,
    program_id: str = "prog",
    outputs: Sequence[Ref] = (),
    routes: Sequence[Ref] = (),
    inputs: Sequence[Ref] = (),
    inline_output_bytes: int = 0,
) -> CallLaunched:
    return CallLaunched(
        pb.Launch(
            call_id=call_id,
            program_id=program_id,
            inline_output_bytes=inline_output_bytes,
            outputs=[pb.ValueRef(node=n, index=i) for n, i in outputs],
            routes=[pb.Route(value=pb.ValueRef(node=n, index=i), destinations=["peer:1"]) for n, i in routes],
        ),
        tuple(ValueArrived(ObjectId(call_id, ref), f"{call_id}-in{ref[1]}", 8) for ref in inputs),
    )


def grants(call_id: str, *nodes: int, first_seq: int = 1) -> GrantsReceived:
    return GrantsReceived(tuple(GrantId(first_seq + k, call_id, n) for k, n in enumerate(nodes)))


def fetch(call_id: str, ref: Ref, token: int = 7, release: bool = False) -> ExportRequested:
    return ExportRequested(pb.ExportRequest(
        call_id=call_id, value=pb.ValueRef(node=ref[0], index=ref[1]), token=token, release=release
    ))


def only(kind: type[T], instructions: list[Instruction]) -> list[T]:
    return [i for i in instructions if isinstance(i, kind)]


def host(
    limit: int = 1 << 20, multi_process: bool = False, *programs: pb.HostProgram, run_limit: int = 1
) -> HostState:
    """By default every grant is dispatched alone, so a test can answer them one by one;
    `run_limit` > 1 lets the machine dispatch runs (see `host_state`, Runs)."""
    state = HostState("host-0", limit, input_timeout_s=5.0, multi_process=multi_process, run_limit=run_limit)
    for p in programs or (program([INPUT], [(0, 0)], [(1, 0)]),):
        state.handle(loaded(p))
    return state


def result(dispatch: Dispatch, error: str = "") -> ComputationDispatched:
    """The executor's result for one grant; outputs are named after the grant."""
    name = f"{dispatch.grant.call_id}-out{dispatch.grant.node}"
    outputs = () if error else tuple(name for _ in range(dispatch.comp.num_outputs))
    return ComputationDispatched(dispatch.grant, outputs, error)


def ran(
    state: HostState, dispatch: Dispatch | DispatchRun, error: str = "", refused: int = 0
) -> list[Instruction]:
    """The driver's report that it dispatched `dispatch`. With an `error`, JAX refused the
    grant (of a run, its grant number `refused`, which ends the run)."""
    if isinstance(dispatch, Dispatch):
        return state.handle(result(dispatch, error))
    results: list[ComputationDispatched] = []
    for k, item in enumerate((dispatch.first, *dispatch.rest)):
        results.append(result(item, error if error and k == refused else ""))
        if results[-1].error:
            break
    return state.handle(RunDispatched(tuple(results)))


def dispatching(instructions: list[Instruction]) -> list[Dispatch | DispatchRun]:
    return [i for i in instructions if isinstance(i, (Dispatch, DispatchRun))]


def run_chain(state: HostState, first: list[Instruction], limit: int = 200) -> list[Instruction]:
    """Answers each Dispatch or DispatchRun until none comes back; everything else the
    machine said, in order."""
    said: list[Instruction] = [i for i in first if not isinstance(i, (Dispatch, DispatchRun))]
    pending = dispatching(first)
    for _ in range(limit):
        if not pending:
            return said
        answer = ran(state, pending.pop())
        pending = dispatching(answer)
        said += [i for i in answer if not isinstance(i, (Dispatch, DispatchRun))]
    raise AssertionError(f"the chain did not end within {limit} dispatches")


# ---------------------------------------------------------------- order


def test_grants_run_one_at_a_time_in_the_order_received_across_calls() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT]))
    state.handle(launch("c2", inputs=[INPUT]))

    first = state.handle(GrantsReceived((GrantId(1, "c2", 0), GrantId(2, "c1", 0), GrantId(3, "c2", 1))))

    assert [d.grant for d in only(Dispatch, first)] == [GrantId(1, "c2", 0)]
    second = ran(state, only(Dispatch, first)[0])
    assert [d.grant for d in only(Dispatch, second)] == [GrantId(2, "c1", 0)]
    third = ran(state, only(Dispatch, second)[0])
    assert [d.grant for d in only(Dispatch, third)] == [GrantId(3, "c2", 1)]
    assert only(Dispatch, third)[0].inputs == ("c2-out0",)


def test_a_runnable_grant_does_not_overtake_the_head_grant_waiting_for_its_input() -> None:
    state = host()
    state.handle(launch("c1"))                      # its program input has not arrived
    state.handle(launch("c2", inputs=[INPUT]))      # this one has

    said = state.handle(GrantsReceived((GrantId(1, "c1", 0), GrantId(2, "c2", 0))))

    assert only(Dispatch, said) == []
    assert state.grant_state(GrantId(1, "c1", 0)) == "waiting"
    assert state.grant_state(GrantId(2, "c2", 0)) == "queued"
    settled = state.handle(ValueArrived(ObjectId("c1", INPUT), "arrived", 8))
    assert [d.grant for d in only(Dispatch, settled)] == [GrantId(1, "c1", 0)]
    assert only(Dispatch, settled)[0].inputs == ("arrived",)


# ---------------------------------------------------------------- readiness


def test_an_arrival_settles_the_waiting_head_grant_and_cancels_its_timer() -> None:
    state = host()
    state.handle(launch("c1"))

    waiting = state.handle(grants("c1", 0))
    settled = state.handle(ValueArrived(ObjectId("c1", INPUT), "x", 8))

    timers = only(StartTimer, waiting)
    assert [t.delay_s for t in timers] == [5.0]
    assert only(CancelTimer, settled) == [CancelTimer(timers[0].timer)]
    assert [d.grant for d in only(Dispatch, settled)] == [GrantId(1, "c1", 0)]


def test_head_grant_waits_for_store_room_until_a_release_frees_it() -> None:
    state = host(OUT_BYTES + 8, False, program([INPUT]))
    state.handle(launch("c1", outputs=[(0, 0)], inputs=[INPUT]))
    run_chain(state, state.handle(grants("c1", 0)))   # c1's output stays: the client fetches it
    state.handle(launch("c2", inputs=[INPUT]))

    waiting = state.handle(grants("c2", 0, first_seq=2))
    was = state.grant_state(GrantId(2, "c2", 0))
    released = state.handle(CallReleased("c1"))

    assert only(Dispatch, waiting) == [] and was == "waiting"
    assert [d.grant for d in only(Dispatch, released)] == [GrantId(2, "c2", 0)]


def test_outputs_larger_than_the_whole_store_fail_at_once() -> None:
    state = host(OUT_BYTES - 1, False, program([INPUT]))
    state.handle(launch("c1", inputs=[INPUT]))

    said = state.handle(grants("c1", 0))

    (batch,) = only(FinishBatch, said)
    assert "outputs need 16 B, more than the whole object store limit of 15 B" in batch.grants[0].error


# ---------------------------------------------------------------- batching


@pytest.mark.parametrize("run_limit", [1, RUN_LIMIT])
def test_single_process_slice_hands_a_chain_to_the_finisher_as_one_batch(run_limit: int) -> None:
    state = host(run_limit=run_limit)
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))

    said = run_chain(state, state.handle(grants("c1", 0, 1, 2)))

    (batch,) = only(FinishBatch, said)
    assert [f.grant.node for f in batch.grants] == [0, 1, 2]
    assert not any(f.error for f in batch.grants) and not batch.report
    assert [f.label for f in batch.grants] == [
        f"program 'prog' computation 'f{i}' (index {i})" for i in range(3)
    ], "each names its computation for an error the finisher finds later"


@pytest.mark.parametrize("run_limit", [1, RUN_LIMIT])
def test_single_process_slice_hands_over_every_finish_batch_computations(run_limit: int) -> None:
    chain = program([INPUT], *([(i, 0)] for i in range(FINISH_BATCH)))
    state = host(1 << 20, False, chain, run_limit=run_limit)
    state.handle(launch("c1", inputs=[INPUT]))

    said = run_chain(state, state.handle(grants("c1", *range(FINISH_BATCH + 1))))

    assert [len(b.grants) for b in only(FinishBatch, said)] == [FINISH_BATCH, 1]


@pytest.mark.parametrize("run_limit", [1, RUN_LIMIT])
def test_only_the_last_computation_of_a_call_on_the_host_ends_it(run_limit: int) -> None:
    state = host(run_limit=run_limit)
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))

    said = run_chain(state, state.handle(grants("c1", 0, 1, 2)))

    (batch,) = only(FinishBatch, said)
    assert [f.ends_call for f in batch.grants] == [False, False, True]


def test_work_in_hand_counts_queued_running_and_gathered_grants() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))

    first = state.handle(grants("c1", 0, 1, 2))
    assert state.in_hand == 3  # one running, two queued behind it
    after_one = ran(state, only(Dispatch, first)[0])
    assert state.in_hand == 3  # one dispatched in the batch being gathered, one running, one queued
    run_chain(state, after_one)
    assert state.in_hand == 0  # all three handed to the finisher


# ---------------------------------------------------------------- runs


def test_a_single_process_slice_dispatches_a_calls_queued_grants_as_one_run() -> None:
    state = host(run_limit=RUN_LIMIT)
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))

    (run,) = dispatching(state.handle(grants("c1", 0, 1, 2)))

    assert isinstance(run, DispatchRun)
    assert [(d.grant.node, d.inputs) for d in (run.first, *run.rest)] == [
        (0, ("c1-in0",)), (1, (RunValue((0, 0)),)), (2, (RunValue((1, 0)),)),
    ], "each grant reads what the one before it made, passed along by the executor"
    assert state.in_hand == 3 and state.grants_queued == 3
    assert [state.grant_state(GrantId(seq, "c1", seq - 1)) for seq in (1, 2, 3)] == ["running"] * 3


def test_a_run_settles_only_what_leaves_it_and_frees_the_values_it_passed_along() -> None:
    state = host(run_limit=RUN_LIMIT)
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))
    (run,) = dispatching(state.handle(grants("c1", 0, 1, 2)))

    said = ran(state, run)

    (batch,) = only(FinishBatch, said)
    assert [(f.grant.node, f.outputs, f.error) for f in batch.grants] == [
        (0, ("c1-out0",), ""), (1, ("c1-out1",), ""), (2, ("c1-out2",), ""),
    ]
    assert state.store.used == OUT_BYTES, "only the call's output holds bytes"
    (exported,) = only(Export, state.handle(fetch("c1", (1, 0))))
    assert exported.value is None and "was freed" in exported.error
    (kept,) = only(Export, state.handle(fetch("c1", (2, 0))))
    assert kept.value == "c1-out2"


def test_a_fetch_of_a_call_this_host_never_saw_fails_at_once_and_keeps_no_state() -> None:
    state = host(run_limit=RUN_LIMIT)
    for i in range(50):
        (exported,) = only(Export, state.handle(fetch(f"made-up-{i}", (0, 0))))
        assert exported.value is None and "is not known on host" in exported.error
    assert state.calls.calls == {} and state.store.used == 0


def test_a_value_of_a_run_asked_for_while_the_run_is_out_is_exported_not_passed_along() -> None:
    state = host(run_limit=RUN_LIMIT)
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))
    (run,) = dispatching(state.handle(grants("c1", 0, 1, 2)))
    assert only(Export, state.handle(fetch("c1", (1, 0)))) == [], "node 1's output does not exist yet"

    said = ran(state, run)

    (exported,) = only(Export, said)
    assert (exported.oid.ref, exported.value, exported.error) == ((1, 0), "c1-out1", "")
    (batch,) = only(FinishBatch, said)
    assert [f.ends_call for f in batch.grants] == [False, False, True]
    assert state.store.used == OUT_BYTES, "the exported value went with its request; the output stays"


def test_a_run_ends_at_another_calls_grant_and_at_the_run_limit() -> None:
    chain = program([INPUT], *([(i, 0)] for i in range(4)))
    state = host(1 << 20, False, chain, run_limit=3)
    state.handle(launch("c1", inputs=[INPUT]))
    state.handle(launch("c2", inputs=[INPUT]))

    first = state.handle(GrantsReceived((
        GrantId(1, "c1", 0), GrantId(2, "c1", 1), GrantId(3, "c2", 0),
        GrantId(4, "c2", 1), GrantId(5, "c2", 2), GrantId(6, "c2", 3), GrantId(7, "c2", 4),
    )))
    (run,) = dispatching(first)
    second = dispatching(ran(state, run))
    (third,) = dispatching(ran(state, second[0]))

    def nodes(d: Dispatch | DispatchRun) -> list[tuple[str, int]]:
        items = (d,) if isinstance(d, Dispatch) else (d.first, *d.rest)
        return [(i.grant.call_id, i.grant.node) for i in items]

    assert nodes(run) == [("c1", 0), ("c1", 1)]
    assert nodes(second[0]) == [("c2", 0), ("c2", 1), ("c2", 2)]
    assert nodes(third) == [("c2", 3), ("c2", 4)]


def test_a_run_stops_before_a_grant_whose_input_has_not_arrived() -> None:
    two_inputs = program([INPUT], [(0, 0), (-1, 1)])
    state = host(1 << 20, False, two_inputs, run_limit=RUN_LIMIT)
    state.handle(launch("c1", inputs=[INPUT]))   # program input 1 is still on its way

    (alone,) = dispatching(state.handle(grants("c1", 0, 1)))

    assert isinstance(alone, Dispatch) and alone.grant.node == 0
    assert state.grant_state(GrantId(2, "c1", 1)) == "queued"


def test_a_value_a_grant_after_the_run_reads_stays_in_the_store_for_it() -> None:
    fan_out = program([INPUT], [(0, 0)], [(0, 0)])
    state = host(1 << 20, False, fan_out, run_limit=2)
    state.handle(launch("c1", inputs=[INPUT]))

    (run,) = dispatching(state.handle(grants("c1", 0, 1, 2)))
    (after,) = dispatching(ran(state, run))

    assert isinstance(after, Dispatch) and after.grant.node == 2
    assert after.inputs == ("c1-out0",), "node 2 reads node 0's output from the store"


def test_when_jax_refuses_a_grant_of_a_run_those_after_it_fail_on_its_outputs() -> None:
    state = host(run_limit=RUN_LIMIT)
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))
    (run,) = dispatching(state.handle(grants("c1", 0, 1, 2)))

    said = ran(state, run, error="f1 failed: boom", refused=1)

    grants_done = [f for b in only(FinishBatch, said) for f in b.grants]
    assert [(f.grant.node, bool(f.error)) for f in grants_done] == [(0, False), (1, True), (2, True)]
    assert "input output 0 of computation 1 failed: f1 failed: boom" in grants_done[2].error
    assert dispatching(said) == [] and state.grants_queued == 0
    assert state.store.used == 0, "the room reserved for the grants that never ran is given back"


def test_a_multi_process_slice_dispatches_each_grant_alone() -> None:
    state = host(1 << 20, True, run_limit=RUN_LIMIT)
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))

    (first,) = dispatching(state.handle(grants("c1", 0, 1, 2)))

    assert isinstance(first, Dispatch) and first.grant.node == 0


def test_grants_say_whether_room_is_wanted_and_a_change_to_wanted_is_passed_on() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))
    assert state.room_wanted, "a host that heard nothing yet reports as room frees"

    quiet = state.handle(GrantsReceived((GrantId(1, "c1", 0),), room_wanted=False))
    assert not state.room_wanted and not only(RoomWanted, quiet)

    wanted = state.handle(GrantsReceived((), room_wanted=True))
    assert state.room_wanted and len(only(RoomWanted, wanted)) == 1
    assert not only(RoomWanted, state.handle(GrantsReceived((), room_wanted=True))), "only a change"


def test_work_in_hand_behind_a_head_waiting_for_its_input_is_none() -> None:
    """What a waiting head waits for may come only after the host's completions are heard."""
    state = host()
    state.handle(launch("c1"))                      # its program input has not arrived
    state.handle(launch("c2", inputs=[INPUT]))

    state.handle(GrantsReceived((GrantId(1, "c1", 0), GrantId(2, "c2", 0))))

    assert state.grants_queued == 2
    assert state.in_hand == 0


def one_computation_calls(state: HostState, count: int) -> list[Instruction]:
    """`count` calls of a one-computation program, all launched and granted at once, as a
    training loop keeps them queued ahead; run until nothing more is dispatched."""
    calls = [f"c{k}" for k in range(count)]
    for call in calls:
        state.handle(launch(call, inputs=[INPUT]))
    return run_chain(state, state.handle(GrantsReceived(tuple(
        GrantId(1 + k, call, 0) for k, call in enumerate(calls)))), limit=4 * count)


def test_calls_queued_ahead_are_handed_over_once_their_outputs_reach_the_batch_bytes() -> None:
    """Large outputs: a batch holds back at most FINISH_BATCH_BYTES of them, so a host does
    not keep FINISH_BATCH training steps' parameters waiting for company."""
    step_bytes = FINISH_BATCH_BYTES // 4
    state = HostState("host-0", 64 * step_bytes, input_timeout_s=5.0, multi_process=False)
    one = program([INPUT])
    state.handle(ProgramLoaded(layout_program(one), {}, {0: (step_bytes,)},
                               {c.index: tuple(c.outputs) for c in one.program.computations}, {}))

    said = one_computation_calls(state, 9)

    assert [len(b.grants) for b in only(FinishBatch, said)] == [4, 4, 1]


def test_calls_of_small_outputs_queued_ahead_still_go_finish_batch_at_a_time() -> None:
    state = host(1 << 20, False, program([INPUT]))

    said = one_computation_calls(state, FINISH_BATCH + 2)

    assert [len(b.grants) for b in only(FinishBatch, said)] == [FINISH_BATCH, 2]


def test_single_process_slice_hands_over_at_once_after_an_output_that_leaves_the_host() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], routes=[(0, 0)]))

    first = state.handle(grants("c1", 0, 1, 2))
    after_routed = ran(state, only(Dispatch, first)[0])

    (batch,) = only(FinishBatch, after_routed)
    assert [(r.ref, r.value) for r in batch.grants[0].routed] == [((0, 0), "c1-out0")]
    assert len(only(Dispatch, after_routed)) == 1      # and the next one is already dispatched


def test_multi_process_slice_keeps_a_chain_of_at_most_two_in_flight_and_hands_it_over_as_one_batch() -> None:
    state = host(1 << 20, True)
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))

    first = state.handle(grants("c1", 0, 1, 2))
    second = ran(state, only(Dispatch, first)[0])
    third = ran(state, only(Dispatch, second)[0])
    said = ran(state, only(Dispatch, third)[0])

    dispatches = [only(Dispatch, first)[0], only(Dispatch, second)[0], only(Dispatch, third)[0]]
    assert [(d.in_flight, d.wait_for) for d in dispatches] == [
        ((), ()), (("c1-out0",), ()), (("c1-out1",), ("c1-out0",)),  # at most 2 in flight
    ]
    (batch,) = only(FinishBatch, said)
    assert [f.grant.node for f in batch.grants] == [0, 1, 2] and batch.report


def test_multi_process_computation_not_reading_the_one_in_flight_waits_for_it_first() -> None:
    state = host(1 << 20, True, program([INPUT], [INPUT]))
    state.handle(launch("c1", inputs=[INPUT]))

    first = state.handle(grants("c1", 0, 1))
    second = ran(state, only(Dispatch, first)[0])

    (dispatch,) = only(Dispatch, second)
    assert dispatch.in_flight == ("c1-out0",) and dispatch.wait_for == ("c1-out0",)


def test_multi_process_computation_follows_an_output_of_an_earlier_call_without_waiting() -> None:
    state = host(1 << 20, True, program([INPUT]))
    state.handle(launch("c1", inputs=[INPUT], outputs=[(0, 0)]))
    first = only(Dispatch, state.handle(grants("c1", 0)))[0]
    ran(state, first)
    state.handle(CallReleased("c1", frozenset({(0, 0)})))
    state.handle(CallLaunched(pb.Launch(call_id="c2", program_id="prog", aliases=[pb.Alias(
        input=pb.ValueRef(node=-1, index=0),
        object=pb.ObjectRef(call_id="c1", value=pb.ValueRef(node=0, index=0)),
    )]), ()))

    (dispatch,) = only(Dispatch, state.handle(grants("c2", 0, first_seq=2)))

    assert dispatch.in_flight == ("c1-out0",) and dispatch.wait_for == ()


def test_multi_process_slice_lets_go_of_outputs_seen_finished() -> None:
    state = host(1 << 20, True, program([INPUT], [INPUT]))
    state.handle(launch("c1", inputs=[INPUT]))
    first = only(Dispatch, state.handle(grants("c1", 0)))[0]
    (batch,) = only(FinishBatch, ran(state, first))

    state.handle(BatchFinished(tuple(f.grant for f in batch.grants)))
    (dispatch,) = only(Dispatch, state.handle(grants("c1", 1, first_seq=2)))

    assert dispatch.in_flight == () and dispatch.wait_for == ()


def test_single_process_slice_dispatches_ahead_at_most_dispatch_ahead_bytes_of_outputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_state, "DISPATCH_AHEAD_BYTES", 3 * OUT_BYTES)
    length = 6
    chain = program([INPUT], *([(i, 0)] for i in range(length - 1)))
    state = host(1 << 20, False, chain)
    state.handle(launch("c1", inputs=[INPUT]))

    dispatches = only(Dispatch, state.handle(grants("c1", *range(length))))
    for _ in range(length):  # the driver reports each dispatch; the machine answers with the next
        dispatches += only(Dispatch, ran(state, dispatches[-1]))

    waits = [(d.grant.node, d.in_flight, d.wait_for) for d in dispatches]
    assert waits == [(n, (), ()) for n in range(3)] + [
        (n, (), (f"c1-out{n - 3}",)) for n in range(3, length)
    ], "once three outputs' bytes are ahead, each computation waits for the oldest of them"


def test_single_process_slice_remembers_at_most_dispatch_ahead_count_computations_of_small_outputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_state, "DISPATCH_AHEAD_COUNT", 4)
    length = 8
    chain = program([INPUT], *([(i, 0)] for i in range(length - 1)))
    state = host(1 << 20, False, chain)
    state.handle(launch("c1", inputs=[INPUT]))

    dispatches = only(Dispatch, state.handle(grants("c1", *range(length))))
    for _ in range(length):
        dispatches += only(Dispatch, ran(state, dispatches[-1]))

    assert host_state.DISPATCH_AHEAD_BYTES > length * OUT_BYTES, "the bytes alone would hold every output"
    waits = [(d.grant.node, d.wait_for) for d in dispatches]
    assert waits == [(n, ()) for n in range(4)] + [
        (4, ("c1-out1",)), (5, ()), (6, ("c1-out3",)), (7, ()),
    ], "once four computations are ahead, the older two go, the next waiting for the newer of them"


def test_released_call_logs_how_many_computations_overlapped_the_one_before() -> None:
    state = host(1 << 20, True)
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))
    pending = only(Dispatch, state.handle(grants("c1", 0, 1, 2)))
    for overlapped in (False, True, True):
        dispatch = pending.pop()
        outputs = (f"c1-out{dispatch.grant.node}",)
        pending = only(Dispatch, state.handle(ComputationDispatched(dispatch.grant, outputs, "", 0.001, overlapped)))

    (line,) = only(Log, state.handle(CallReleased("c1")))

    assert "3 computations" in line.message and "2 dispatched while the one before still ran" in line.message


def test_multi_process_slice_inlines_from_its_first_host_only_the_outputs_it_holds_whole() -> None:
    layout = program([INPUT], [INPUT])  # computation 1's output is split across the hosts
    hosts = [
        HostState(f"host-{i}", 1 << 20, input_timeout_s=5.0, multi_process=True, first_host=i == 0)
        for i in range(2)
    ]
    inlined = []
    for state in hosts:
        state.handle(loaded(layout, partial={1: frozenset({0})}))
        state.handle(launch("c1", inputs=[INPUT], outputs=[(0, 0), (1, 0)], inline_output_bytes=OUT_BYTES))
        said = run_chain(state, state.handle(grants("c1", 0, 1)))
        inlined.append([f.inline for b in only(FinishBatch, said) for f in b.grants])

    assert inlined == [[(0,), ()], [(), ()]]


def test_small_outputs_the_client_fetches_go_inline_with_the_completion() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(0, 0), (1, 0)], inline_output_bytes=OUT_BYTES))

    said = run_chain(state, state.handle(grants("c1", 0, 1)))

    (batch,) = only(FinishBatch, said)
    assert [f.inline for f in batch.grants] == [(0,), (0,)]


# ---------------------------------------------------------------- failure


def test_a_failed_computation_fails_its_dependents_its_routed_outputs_and_waiting_fetches() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)], routes=[(1, 0)]))
    fetched = state.handle(fetch("c1", (2, 0)))

    first = state.handle(grants("c1", 0, 1, 2))
    said = ran(state, only(Dispatch, first)[0], error="f0 failed: boom")

    finished = [f for b in only(FinishBatch, said) for f in b.grants]
    assert [f.grant.node for f in finished] == [0, 1, 2]
    assert finished[0].error == "f0 failed: boom"
    assert "input output 0 of computation 0 failed: f0 failed: boom" in finished[1].error
    assert [(r.ref, r.value, r.declared) for r in finished[1].routed] == [
        ((1, 0), None, pb.TensorSpec(shape=[4], dtype="float32"))
    ]
    (export,) = only(Export, said)
    assert fetched == [] and export.value is None and "input output 0 of computation 1 failed" in export.error
    assert only(Dispatch, said) == []


def test_a_failure_after_dispatch_fails_the_published_outputs() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(0, 0)]))
    (batch,) = only(FinishBatch, run_chain(state, state.handle(grants("c1", 0))))

    outputs = batch.grants[0].outputs
    said = state.handle(ComputationFailedLate(GrantId(1, "c1", 0), outputs, "ran out of memory"))
    late_fetch = state.handle(fetch("c1", (0, 0)))

    assert said == []
    (export,) = only(Export, late_fetch)
    assert export.error == "ran out of memory" and export.value is None


def test_failing_the_call_fails_its_waiting_head_grant_and_what_it_waits_for() -> None:
    state = host()
    state.handle(launch("c1", outputs=[(1, 0)]))
    state.handle(fetch("c1", (1, 0)))
    waiting = state.handle(grants("c1", 0, 1))

    said = state.handle(CallFailed("c1", "host-1 was lost"))

    (start,) = only(StartTimer, waiting)
    assert CancelTimer(start.timer) in said
    errors = [f.error for b in only(FinishBatch, said) for f in b.grants]
    assert len(errors) == 2 and all("call failed: host-1 was lost" in e for e in errors)
    (export,) = only(Export, said)
    assert export.error == "call c1 failed: host-1 was lost"


# ---------------------------------------------------------------- release and freeing


def test_release_frees_the_call_and_drops_late_messages() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(0, 0)]))
    run_chain(state, state.handle(grants("c1", 0)))
    waiting_fetch = state.handle(fetch("c1", (1, 0)))
    assert state.store.used == OUT_BYTES     # its input went after its last use

    released = state.handle(CallReleased("c1"))
    late_arrival = state.handle(ValueArrived(ObjectId("c1", INPUT), "late", 8))
    late_launch = state.handle(launch("c1", inputs=[INPUT]))
    late_fetch = state.handle(fetch("c1", (0, 0)))
    late_grant = state.handle(grants("c1", 1, first_seq=9))

    assert waiting_fetch == [] and state.store.used == 0
    assert [e.error for e in only(Export, released)] == ["call c1 was released on host host-0"]
    assert StoreChanged() in released
    assert late_arrival == [] and late_launch == [] and state.store.get(ObjectId("c1", INPUT)) is None
    assert [e.error for e in only(Export, late_fetch)] == ["call c1 was released on host host-0"]
    (batch,) = only(FinishBatch, late_grant)
    assert batch.grants[0].error.endswith("the call was already released")


def test_a_call_released_while_its_computation_runs_still_reports_it_and_frees_its_room() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT]))
    (running,) = only(Dispatch, state.handle(grants("c1", 0)))

    state.handle(CallReleased("c1"))
    said = ran(state, running)

    (batch,) = only(FinishBatch, said)
    assert [(f.grant, f.error, f.outputs) for f in batch.grants] == [(GrantId(1, "c1", 0), "", ("c1-out0",))]
    assert state.store.used == 0


def test_a_launch_makes_futures_for_the_calls_outputs_only_and_a_fetch_waits_on_any_value() -> None:
    state = host(run_limit=RUN_LIMIT)
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))

    assert {slot.oid.ref for slot in state.store.held_by("c1")} == {INPUT, (2, 0)}, (
        "the program input and a future for the output; none for the values only this host reads"
    )
    future = state.store.get(ObjectId("c1", (2, 0)))
    assert future is not None and future.state == "pending"
    assert state.handle(fetch("c1", (1, 0))) == [], "a fetch of a value not made yet waits for it"
    (run,) = dispatching(state.handle(grants("c1", 0, 1, 2)))
    said = ran(state, run)

    (export,) = only(Export, said)
    assert (export.oid, export.value, export.error) == (ObjectId("c1", (1, 0)), "c1-out1", "")
    assert state.store.get(ObjectId("c1", (0, 0))) is None, "passed along in the run, never stored"


def test_a_value_is_freed_after_its_last_local_reader_and_a_fetch_says_so() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(1, 0)]))

    run_chain(state, state.handle(grants("c1", 0, 1)))
    said = state.handle(fetch("c1", (0, 0)))

    assert state.store.get(ObjectId("c1", (0, 0))) is None
    assert state.store.get(ObjectId("c1", (1, 0))) is not None
    (export,) = only(Export, said)
    assert "was freed on host host-0 after its last use" in export.error


def test_a_fetch_that_releases_its_value_frees_it_once_written() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(2, 0)]))
    run_chain(state, state.handle(grants("c1", 0, 1, 2)))

    said = state.handle(fetch("c1", (2, 0), release=True))
    written = state.handle(ExportWritten(ObjectId("c1", (2, 0))))

    (export,) = only(Export, said)
    assert (export.value, export.token, export.release) == ("c1-out2", 7, True)
    assert state.store.get(ObjectId("c1", (2, 0))) is None and state.store.used == 0
    assert StoreChanged() in written


def test_a_fetched_output_that_a_later_computation_reads_stays_until_that_computation_ran() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(0, 0), (1, 0)]))
    first = only(Dispatch, state.handle(grants("c1", 0)))

    state.handle(fetch("c1", (0, 0), release=True))
    ran(state, first[0])
    state.handle(ExportWritten(ObjectId("c1", (0, 0))))

    assert state.store.get(ObjectId("c1", (0, 0))) is not None, "computation 1 still reads it"
    second = only(Dispatch, state.handle(grants("c1", 1, first_seq=2)))
    assert [d.grant.node for d in second] == [1]
    ran(state, second[0])
    assert state.store.get(ObjectId("c1", (0, 0))) is None


# ---------------------------------------------------------------- objects


def bound(call_id: str, source: ObjectId) -> CallLaunched:
    """A launch of `call_id` whose program input 0 is the object `source`, used in place."""
    launched = launch(call_id)
    launched.launch.aliases.add(
        input=pb.ValueRef(node=INPUT[0], index=INPUT[1]),
        object=pb.ObjectRef(call_id=source.call_id, value=pb.ValueRef(node=source.ref[0], index=source.ref[1])),
    )
    return launched


def test_a_released_call_keeps_the_outputs_its_client_holds_until_they_are_dropped() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(1, 0)]))
    run_chain(state, state.handle(grants("c1", 0, 1)))

    state.handle(CallReleased("c1", keep=frozenset({(1, 0)})))
    (export,) = only(Export, state.handle(fetch("c1", (1, 0))))
    assert (export.value, export.error) == ("c1-out1", "")
    assert state.store.used == OUT_BYTES

    dropped = state.handle(ObjectsDropped((ObjectId("c1", (1, 0)),)))
    assert state.store.get(ObjectId("c1", (1, 0))) is None and state.store.used == 0
    assert StoreChanged() in dropped


def test_a_later_call_reads_a_kept_object_in_place_without_counting_its_bytes_again() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(1, 0)]))
    run_chain(state, state.handle(grants("c1", 0, 1)))
    state.handle(CallReleased("c1", keep=frozenset({(1, 0)})))

    state.handle(bound("c2", ObjectId("c1", (1, 0))))
    (dispatch,) = only(Dispatch, state.handle(grants("c2", 0, first_seq=3)))

    assert dispatch.inputs == ("c1-out1",)
    assert state.store.used == 2 * OUT_BYTES  # the object, and c2's output being made


def test_an_input_bound_to_an_object_still_being_computed_waits_for_it() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(1, 0)]))
    state.handle(bound("c2", ObjectId("c1", (1, 0))))
    first = state.handle(GrantsReceived((GrantId(1, "c1", 0), GrantId(2, "c1", 1), GrantId(3, "c2", 0))))

    dispatches: list[Dispatch] = []
    pending = only(Dispatch, first)
    for _ in range(3):
        dispatches += pending
        pending = only(Dispatch, ran(state, pending[0])) if pending else []

    assert [(d.grant.call_id, d.grant.node, d.inputs) for d in dispatches] == [
        ("c1", 0, ("c1-in0",)), ("c1", 1, ("c1-out0",)), ("c2", 0, ("c1-out1",)),
    ]


def test_an_object_dropped_while_still_computed_goes_once_its_bound_inputs_have_it() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(1, 0)]))
    state.handle(bound("c2", ObjectId("c1", (1, 0))))
    state.handle(ObjectsDropped((ObjectId("c1", (1, 0)),)))

    run_chain(state, state.handle(grants("c1", 0, 1)))

    assert state.store.get(ObjectId("c1", (1, 0))) is None
    assert state.store.get(ObjectId("c2", INPUT)) is not None


def test_an_input_bound_to_an_object_the_host_does_not_hold_fails_its_computation_naming_it() -> None:
    state = host()

    state.handle(bound("c2", ObjectId("gone", (1, 0))))
    (batch,) = only(FinishBatch, state.handle(grants("c2", 0)))

    assert "input object output 0 of computation 1 of call gone is not on host host-0" in batch.grants[0].error


def forwarded(source: ObjectId, call_id: str = "c9") -> ObjectForwarded:
    """Call `call_id` on another slice reads `source` as its program input 0."""
    return ObjectForwarded(source, ObjectId(call_id, INPUT), pb.TensorSpec(shape=[4], dtype="float32"))


def test_a_forwarded_object_is_exported_as_the_reading_calls_input_and_stays() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(1, 0)]))
    run_chain(state, state.handle(grants("c1", 0, 1)))
    state.handle(CallReleased("c1", keep=frozenset({(1, 0)})))

    (export,) = only(Export, state.handle(forwarded(ObjectId("c1", (1, 0)))))

    assert (export.oid, export.token, export.value, export.error, export.release) == (
        ObjectId("c9", INPUT), 0, "c1-out1", "", False,
    ), "pushed (token 0) to the reading hosts under the reading call's input"
    assert state.store.get(ObjectId("c1", (1, 0))) is not None and state.store.used == OUT_BYTES


def test_a_forward_of_an_object_still_being_computed_waits_for_it() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(1, 0)]))

    waiting = state.handle(forwarded(ObjectId("c1", (1, 0))))
    said = run_chain(state, state.handle(grants("c1", 0, 1)))

    assert only(Export, waiting) == []
    (export,) = only(Export, said)
    assert (export.oid, export.value) == (ObjectId("c9", INPUT), "c1-out1")


def test_a_forward_of_a_failed_or_missing_object_exports_why_naming_it() -> None:
    state = host()
    state.handle(launch("c1", inputs=[INPUT], outputs=[(1, 0)]))
    state.handle(forwarded(ObjectId("c1", (1, 0))))
    failed = state.handle(CallFailed("c1", "a peer failed"))
    (missing,) = only(Export, state.handle(forwarded(ObjectId("gone", (1, 0)), call_id="c8")))

    (export,) = only(Export, failed)
    assert export.value is None and export.declared == pb.TensorSpec(shape=[4], dtype="float32")
    assert "input object output 0 of computation 1 of call c1 failed on host host-0" in export.error
    assert "a peer failed" in export.error
    assert missing.oid == ObjectId("c8", INPUT) and missing.value is None
    assert "output 0 of computation 1 of call gone is not on host host-0" in missing.error


# ---------------------------------------------------------------- timers


def test_the_timer_fails_a_grant_whose_input_never_arrives() -> None:
    state = host()
    state.handle(launch("c1", outputs=[(1, 0)]))
    (start,) = only(StartTimer, state.handle(grants("c1", 0, 1)))

    stale = state.handle(TimerFired(start.timer + 100))
    fired = state.handle(TimerFired(start.timer))

    assert stale == []
    errors = [f.error for b in only(FinishBatch, fired) for f in b.grants]
    assert errors[0] == (
        "program 'prog' computation 'f0' (index 0) of call c1 on host host-0: timed out after "
        "5 s waiting for program input 0 from the client (program input put to this host)"
    )
    assert "input output 0 of computation 0 failed: program 'prog'" in errors[1]


def test_a_computation_that_did_not_load_fails_with_the_load_error() -> None:
    p = program([INPUT])
    state = host(1 << 20, False)
    state.handle(loaded(p, errors={0: "computation 'f0' was exported for 8 devices"}))
    state.handle(launch("c1", inputs=[INPUT]))

    said = state.handle(grants("c1", 0))

    (batch,) = only(FinishBatch, said)
    assert batch.grants[0].error == "computation 'f0' was exported for 8 devices"


def test_a_computation_without_an_executable_or_load_error_fails_saying_so() -> None:
    p = program([INPUT])
    state = host(1 << 20, False)
    layout = layout_program(p)
    state.handle(ProgramLoaded(layout, {}, {}, {0: tuple(p.program.computations[0].outputs)}))
    state.handle(launch("c1", inputs=[INPUT]))

    said = state.handle(grants("c1", 0))

    (batch,) = only(FinishBatch, said)
    assert batch.grants[0].error == "computation 0 has no executable on host host-0"


def test_a_running_computation_reserves_its_outputs_bytes_as_loaded() -> None:
    p = program([INPUT])
    state = HostState("host-0", 1 << 20, input_timeout_s=5.0, multi_process=False)
    layout = layout_program(p)
    state.handle(ProgramLoaded(layout, {}, {0: (40, 24)}, {0: ()}))
    state.handle(launch("c1", inputs=[INPUT]))
    used = state.store.used

    (dispatch,) = only(Dispatch, state.handle(grants("c1", 0)))

    assert dispatch.grant == GrantId(1, "c1", 0)
    assert state.store.used == used + 64


# ---------------------------------------------------------------- transitions


def test_a_report_for_a_grant_that_is_not_running_raises_invalid_transition_naming_it() -> None:
    state = host()
    state.handle(launch("c1"))
    state.handle(grants("c1", 0))

    with pytest.raises(InvalidTransition) as raised:
        state.handle(ComputationDispatched(GrantId(1, "c1", 0), ("v",), ""))

    assert str(raised.value) == "grant 1 (computation 0) of call c1 cannot move from 'waiting' to 'dispatched'"


def test_settling_a_ready_value_again_raises_invalid_transition_naming_the_value() -> None:
    state = host()
    oid = ObjectId("c1", (0, 0))
    state.store.set_ready(oid, "v", 4, prepaid=False)

    with pytest.raises(InvalidTransition) as raised:
        state.store.set_ready(oid, "w", 4, prepaid=False)

    assert str(raised.value) == "output 0 of computation 0 of call c1 cannot move from 'ready' to 'ready'"
    assert (raised.value.old, raised.value.new) == ("ready", "ready")
