"""The call table: what a call's hosts are told when an input names an object, and what
waiting for a call with `finish` frees.

Hosts are fake links that record the commands sent to them; no process or socket.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb
from pathways_wire.grant_runs import grants_in
from pathways_wire.slice_token import route_token
from pathways_operator.controller.calls import Calls
from pathways_operator.controller.programs import Programs
from pathways_operator.controller.slices import SliceRecord, SliceTable
from tests.unit.builders import island
from tests.unit.controller_builders import F32, INPUT_0, comp, slice_record


@dataclass
class FakeLink:
    name: str
    sent: list[pb.HostCommand] = field(default_factory=list)
    messages: list[list[str]] = field(default_factory=list)
    """The kinds of each message the link would write: what `together` held goes as one."""
    _depth: int = 0
    _open: bool = False

    def send(self, command: pb.HostCommand, later: bool = False) -> None:
        self.sent.append(command)
        kind = str(command.WhichOneof("command"))
        if self._open:
            self.messages[-1].append(kind)
        else:
            self.messages.append([kind])
            self._open = self._depth > 0

    def cork(self) -> None:
        self._depth += 1

    def uncork(self) -> None:
        self._depth -= 1
        self._open = self._open and self._depth > 0

    def kinds(self) -> list[str]:
        return [str(c.WhichOneof("command")) for c in self.sent]


def ready_slice(table: SliceTable, vid: str, hosts: int) -> SliceRecord:
    rec = slice_record(vid, hosts, token=f"tok-{vid}")
    rec.links = [FakeLink(h.name) for h in rec.hosts]  # type: ignore[misc]
    rec.gang = "ready"
    table._slices[vid] = rec
    return rec


def one_step(name: str, vslice: str, devices: int) -> ir.Program:
    return ir.Program(
        name=name, inputs=(F32,), computations=(comp(0, vslice, INPUT_0),),
        outputs=(ir.ValueRef(0, 0),), slices=(ir.SliceDecl(vslice, vslice, devices),),
    )


def calls_with_object() -> tuple[Calls, SliceTable, SliceRecord, SliceRecord]:
    """Call "made" on slice h (2 hosts) made an object; call "read" on slice r (1 host) reads it."""
    table = SliceTable(lambda: island("island-a", 3, 4))
    holder, reader = ready_slice(table, "h", 2), ready_slice(table, "r", 1)
    programs = Programs()
    live = {rec.slice_id: rec.decl for rec in (holder, reader)}.get
    make = programs.load(one_step("make", "h", 8), {"h": holder.slice_id}, live)
    read = programs.load(one_step("read", "r", 4), {"r": reader.slice_id}, live)
    calls = Calls(table, programs, window=4, shared_window=4)
    calls.run(make, "made", 1.0, client="me")
    obj = pb.ObjectRef(call_id="made", value=pb.ValueRef(node=0, index=0))
    reply = calls.run(read, "read", 1.0, objects=[pb.ObjectInput(index=0, object=obj)], client="me")
    assert list(reply.inputs[0].hosts) == [], "nothing for the client to put"
    return calls, table, holder, reader


def test_an_object_read_on_another_slice_is_forwarded_by_its_holding_hosts() -> None:
    _, _, holder, reader = calls_with_object()

    for link in holder.links:
        forward = link.sent[-1].forward  # type: ignore[attr-defined]
        assert (forward.call_id, forward.object.call_id, forward.input.index) == ("read", "made", 0)
        assert list(forward.destinations) == ["10.0.r.0:1"] and list(forward.destination_tokens) == [route_token("tok-r")]
    (launch,) = [c.launch for c in reader.links[0].sent if c.HasField("launch")]  # type: ignore[attr-defined]
    assert [(e.value.node, e.value.index, e.senders) for e in launch.expects] == [(-1, 0, 2)]
    assert not launch.aliases


def test_losing_the_holding_gang_fails_a_running_reader_naming_program_input_and_slice() -> None:
    calls, table, holder, _ = calls_with_object()

    with table.lock:
        calls.gang_lost(holder, "h/host-1", "worker exited")

    status = calls.wait_call("read", 0)
    assert status.state == pb.CallStatus.FAILED
    assert status.message == (
        "program 'read' call read: input 0 comes from slice 'h', whose host h/host-1 failed "
        "(worker exited); the object it names is lost"
    )


# ---------------------------------------------------------------- waiting with finish


def one_call_on(hosts: int) -> tuple[Calls, SliceRecord]:
    """Call "c" of a one-computation program on a slice of `hosts` hosts, granted and running."""
    table = SliceTable(lambda: island("island-a", 3, 4))
    rec = ready_slice(table, "s", hosts)
    for link, host in zip(rec.links, rec.hosts):
        link.slice_id, link.address = rec.slice_id, host.sidecar_address
    programs = Programs()
    program_id = programs.load(one_step("step", "s", 4 * hosts), {"s": rec.slice_id}, {rec.slice_id: rec.decl}.get)
    calls = Calls(table, programs, window=4, shared_window=4)
    calls.run(program_id, "c", 1.0, client="me")
    return calls, rec


def complete(calls: Calls, rec: SliceRecord, ok: bool = True, call_id: str = "c") -> None:
    for link in rec.links:
        ((seq, _, node),) = [g for c in link.sent if c.HasField("grants")  # type: ignore[attr-defined]
                             for g in grants_in(c.grants) if g[1] == call_id]
        done = pb.Completion(seq=seq, call_id=call_id, node=node, ok=ok, error="" if ok else "boom")
        calls.on_host_event(link, pb.HostEvent(completions=[done]))


def releases(rec: SliceRecord) -> list[list[tuple[int, int]]]:
    return [[(v.node, v.index) for v in c.release.keep]
            for link in rec.links for c in link.sent if c.HasField("release")]  # type: ignore[attr-defined]


def test_waiting_with_finish_frees_an_ended_call_on_every_host_keeping_the_named_outputs() -> None:
    calls, rec = one_call_on(hosts=2)
    complete(calls, rec)

    status = calls.wait_call("c", 5.0, finish=True, keep=[pb.ValueRef(node=0, index=0)])

    assert (status.state, status.released) == (pb.CallStatus.SUCCEEDED, True)
    assert releases(rec) == [[(0, 0)], [(0, 0)]]
    assert calls.wait_call("c", 0).state == pb.CallStatus.UNKNOWN, "the call is gone"
    key, _ = calls.objects.resolve(pb.ObjectRef(call_id="c", value=pb.ValueRef(node=0, index=0)), "me", "input 0")
    assert key == ("c", 0, 0)


def test_waiting_with_finish_frees_a_failed_call_keeping_nothing() -> None:
    calls, rec = one_call_on(hosts=1)
    complete(calls, rec, ok=False)

    status = calls.wait_call("c", 5.0, finish=True, keep=[pb.ValueRef(node=0, index=0)])

    assert (status.state, status.released) == (pb.CallStatus.FAILED, True)
    assert releases(rec) == [[]]


def test_waiting_with_finish_leaves_a_call_that_is_still_running() -> None:
    calls, rec = one_call_on(hosts=1)

    status = calls.wait_call("c", 0, finish=True, keep=[pb.ValueRef(node=0, index=0)])

    assert (status.state, status.released) == (pb.CallStatus.RUNNING, False)
    assert releases(rec) == []
    complete(calls, rec)
    assert calls.wait_call("c", 5.0).state == pb.CallStatus.SUCCEEDED, "the client may still wait and finish it"


class CountingCondition(threading.Condition):
    """A condition that counts the waits a notify ended (not those that timed out)."""

    def __init__(self, lock: threading.RLock) -> None:
        super().__init__(lock)
        self.woken = 0

    def wait(self, timeout: float | None = None) -> bool:
        notified = super().wait(timeout)
        self.woken += int(notified)
        return notified


def test_a_call_that_ends_wakes_only_the_clients_waiting_for_it() -> None:
    calls, rec = one_call_on(hosts=1)
    calls.run(calls._calls["c"].program.program_id, "other", 1.0, client="me")
    lock = calls._slices.lock
    other = calls._calls["other"].ended = CountingCondition(lock)
    statuses: dict[str, pb.CallStatus] = {}
    waiters = {cid: threading.Thread(target=lambda cid=cid: statuses.__setitem__(cid, calls.wait_call(cid, 30.0)))
               for cid in ("c", "other")}
    for waiter in waiters.values():
        waiter.start()
    for _ in range(500):  # both waiting: each has released the table's lock in its wait
        with lock:
            if len(other._waiters) == 1 and len(calls._calls["c"].ended._waiters) == 1:  # type: ignore[attr-defined]
                break
        threading.Event().wait(0.01)

    complete(calls, rec, call_id="c")
    waiters["c"].join(10.0)

    assert statuses["c"].state == pb.CallStatus.SUCCEEDED
    assert other.woken == 0 and waiters["other"].is_alive(), "the other call's waiter slept on"
    complete(calls, rec, call_id="other")
    waiters["other"].join(10.0)
    assert statuses["other"].state == pb.CallStatus.SUCCEEDED and other.woken == 1


def test_finishing_a_call_wakes_its_waiter_with_unknown() -> None:
    calls, _ = one_call_on(hosts=1)
    statuses: list[pb.CallStatus] = []
    waiter = threading.Thread(target=lambda: statuses.append(calls.wait_call("c", 30.0)))
    waiter.start()
    for _ in range(500):
        with calls._slices.lock:
            if calls._calls["c"].ended._waiters:  # type: ignore[attr-defined]
                break
        threading.Event().wait(0.01)

    calls.finish_call("c")
    waiter.join(10.0)

    assert not waiter.is_alive(), "woken at once, not at its 30 s timeout"
    assert statuses[0].state == pb.CallStatus.UNKNOWN


# ---------------------------------------------------------------- answered when the call ends


class Answers:
    """An answer callback that keeps what it was given and says when it came."""

    def __init__(self) -> None:
        self.got: list[pb.CallStatus] = []
        self._came = threading.Event()

    def __call__(self, status: pb.CallStatus) -> None:
        self.got.append(status)
        self._came.set()

    def came(self) -> bool:
        return self._came.wait(10.0)


def linked_slice(table: SliceTable, vid: str, hosts: int) -> SliceRecord:
    """`ready_slice` whose fake links know their slice and address, as the table's do."""
    rec = ready_slice(table, vid, hosts)
    for link, host in zip(rec.links, rec.hosts):
        link.slice_id, link.address = rec.slice_id, host.sidecar_address
    return rec


def test_a_waiter_by_callback_is_answered_by_the_thread_that_ends_the_call() -> None:
    calls, rec = one_call_on(hosts=1)
    answers: list[tuple[pb.CallStatus, str]] = []
    calls.wait_call_then("c", 30.0, True, [pb.ValueRef(node=0, index=0)],
                         lambda status: answers.append((status, threading.current_thread().name)))
    assert answers == [], "not answered while the call runs"

    complete(calls, rec)

    ((status, thread),) = answers
    assert thread == threading.current_thread().name, "answered on the thread that handled the last completion"
    assert (status.state, status.released) == (pb.CallStatus.SUCCEEDED, True)
    assert releases(rec) == [[(0, 0)]]


def test_a_waiter_by_callback_gets_the_running_status_at_its_timeout() -> None:
    calls, rec = one_call_on(hosts=1)
    answers = Answers()

    calls.wait_call_then("c", 0.05, False, [], answers)
    assert answers.came()
    assert answers.got[0].state == pb.CallStatus.RUNNING
    assert "waiting on host" in answers.got[0].message, "it names who owes what"
    complete(calls, rec)
    assert len(answers.got) == 1, "answered once"


OUT = pb.ValueRef(node=0, index=0)


def run_answered_at_its_end(keep: list[pb.ValueRef]) -> tuple[Calls, SliceRecord, list[pb.RunReply]]:
    """A one-computation call run to its end by callback (`keep`: the outputs it keeps), and
    its host's completion with the output inline; the replies it got."""
    table = SliceTable(lambda: island("island-a", 3, 4))
    rec = linked_slice(table, "s", 1)
    programs = Programs()
    program_id = programs.load(one_step("step", "s", 4), {"s": rec.slice_id}, {rec.slice_id: rec.decl}.get)
    calls = Calls(table, programs, window=4, shared_window=4)
    replies: list[pb.RunReply] = []
    calls.run_to_end_then(program_id, "c", 1.0, [], 30.0, "me", replies.append, keep=keep)
    assert replies == [], "not answered while the call runs"
    ((seq, _, node),) = [g for c in rec.links[0].sent if c.HasField("grants")  # type: ignore[attr-defined]
                         for g in grants_in(c.grants)]
    value = pb.InlineValue(value=OUT, data=b"\0\0\0\0")
    done = pb.Completion(seq=seq, call_id="c", node=node, ok=True, outputs=[value])
    calls.on_host_event(rec.links[0], pb.HostEvent(completions=[done]))
    return calls, rec, replies


def test_a_run_answered_by_callback_carries_its_inline_outputs_and_is_freed() -> None:
    calls, rec, replies = run_answered_at_its_end(keep=[])

    (reply,) = replies
    assert reply.status.state == pb.CallStatus.SUCCEEDED and reply.released
    assert [v.data for v in reply.values] == [b"\0\0\0\0"]
    assert calls.wait_call("c", 0).state == pb.CallStatus.UNKNOWN, "freed: the client owes no FinishCall"
    assert releases(rec) == [[]], "nothing kept on its host"


def test_a_run_answered_at_its_end_keeps_the_outputs_it_names_as_objects() -> None:
    calls, rec, replies = run_answered_at_its_end(keep=[OUT])

    (reply,) = replies
    assert reply.released and [v.data for v in reply.values] == [b"\0\0\0\0"]
    assert calls.wait_call("c", 0).state == pb.CallStatus.UNKNOWN, "the call is freed"
    assert releases(rec) == [[(0, 0)]], "its host frees the call but keeps the output"
    key, record = calls.objects.resolve(pb.ObjectRef(call_id="c", value=OUT), "me", "a later call's input 0")
    assert key == ("c", 0, 0) and record.slice_id == rec.slice_id


def test_one_completion_standing_for_a_run_of_grants_completes_each_of_them() -> None:
    table = SliceTable(lambda: island("island-a", 3, 4))
    rec = linked_slice(table, "s", 1)
    program = ir.Program(
        name="chain", inputs=(F32,),
        computations=tuple(comp(i, "s", INPUT_0 if i == 0 else ir.ValueRef(i - 1, 0)) for i in range(3)),
        outputs=(ir.ValueRef(2, 0),), slices=(ir.SliceDecl("s", "s", 4),),
    )
    programs = Programs()
    program_id = programs.load(program, {"s": rec.slice_id}, {rec.slice_id: rec.decl}.get)
    calls = Calls(table, programs, window=8, shared_window=8)
    calls.run(program_id, "c", 1.0, client="me")
    grants = [g for c in rec.links[0].sent if c.HasField("grants")  # type: ignore[attr-defined]
              for g in grants_in(c.grants)]
    assert len(grants) == 3
    run = pb.Completion(seq=grants[0][0], call_id="c", node=grants[0][2], ok=True, count=2)
    calls.on_host_event(rec.links[0], pb.HostEvent(completions=[run]))
    status = calls.wait_call("c", 0)
    assert (status.state, status.completed) == (pb.CallStatus.RUNNING, 2)
    last = pb.Completion(seq=grants[2][0], call_id="c", node=grants[2][2], ok=True)
    calls.on_host_event(rec.links[0], pb.HostEvent(completions=[last]))
    assert calls.wait_call("c", 0).state == pb.CallStatus.SUCCEEDED


def test_finishing_a_call_answers_its_waiter_by_callback_with_unknown() -> None:
    calls, _ = one_call_on(hosts=1)
    answers = Answers()

    calls.wait_call_then("c", 30.0, False, [], answers)
    calls.finish_call("c")

    assert answers.came(), "answered at once, not at its 30 s timeout"
    assert answers.got[0].state == pb.CallStatus.UNKNOWN


def test_a_shared_ahead_that_is_not_a_number_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATHWAYS_SHARED_AHEAD_MS", "fast")
    with pytest.raises(ValueError, match="PATHWAYS_SHARED_AHEAD_MS='fast'"):
        Calls(SliceTable(lambda: island("island-a", 1, 4)), Programs(), window=4, shared_window=4)


def test_a_call_is_one_message_per_host_its_program_launch_and_grants_together() -> None:
    calls, _, holder, reader = calls_with_object()

    assert [link.messages for link in holder.links] == [  # type: ignore[attr-defined]
        [["load", "launch", "grants"], ["forward"]],
    ] * 2, "the reading call's forward to the holder is one message of its own"
    assert reader.links[0].messages == [["load", "launch", "grants"]]  # type: ignore[attr-defined]
