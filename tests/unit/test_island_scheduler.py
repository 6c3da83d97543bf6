"""The island scheduler: one global order, stride shares, windows, resets, and no deadlock."""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from collections.abc import Mapping, Sequence

import pytest

from pathways_operator.core.island_scheduler import (
    Grant,
    IslandScheduler,
    ScheduledComputation,
    UnknownGrant,
)


def chain(slice_id: str, n: int, start: int = 0) -> list[ScheduledComputation]:
    """``n`` computations on one slice, each consuming the one before."""
    return [
        ScheduledComputation(i, slice_id, (i - 1,) if i > start else ())
        for i in range(start, start + n)
    ]


def drain_in_order(sched: IslandScheduler, rounds: int = 10_000) -> list[Grant]:
    """Grant and complete everything, completing the lowest outstanding seq one at a time."""
    issued: list[Grant] = []
    open_: list[Grant] = []
    for _ in range(rounds):
        new = sched.grants()
        issued += new
        open_ += new
        if not open_:
            return issued
        g = open_.pop(0)
        sched.complete(g.slice_id, g.seq)
    raise AssertionError("did not drain")


def test_order_within_a_call_is_the_given_order() -> None:
    sched = IslandScheduler()
    comps = [
        ScheduledComputation(0, "x"),
        ScheduledComputation(1, "y"),
        ScheduledComputation(2, "x", (0,)),
        ScheduledComputation(3, "y", (1, 2)),
    ]
    sched.submit("c", 1.0, comps)
    grants = sched.grants()
    assert [(g.node, g.slice_id) for g in grants] == [(0, "x"), (1, "y"), (2, "x"), (3, "y")]
    assert [g.seq for g in grants] == [0, 1, 2, 3]
    assert sched.pending("c") == 0
    assert sched.outstanding("x") == 2


def test_seq_is_global_and_strictly_increasing_across_slices_and_calls() -> None:
    sched = IslandScheduler(window=2)
    sched.submit("a", 1.0, chain("x", 5))
    sched.submit("b", 2.0, chain("y", 5))
    seqs = [g.seq for g in drain_in_order(sched)]
    assert seqs == sorted(seqs) == list(range(10))


def test_weights_one_to_three_share_one_slice_in_proportion() -> None:
    sched = IslandScheduler(window=2)
    sched.submit("light", 1.0, chain("shared", 100))
    sched.submit("heavy", 3.0, chain("shared", 300))
    order = [g.call_id for g in drain_in_order(sched)]
    # While both have work (the first 400 grants), every run of 4 grants is 1:3.
    for k in range(0, 400, 4):
        assert Counter(order[k:k + 4]) == {"light": 1, "heavy": 3}, (k, order[k:k + 4])
    assert Counter(order) == {"light": 100, "heavy": 300}


def test_contended_grants_count_by_weight_only_while_calls_compete() -> None:
    sched = IslandScheduler(window=2)
    sched.submit("light", 1.0, chain("shared", 100))
    sched.submit("heavy", 2.0, chain("shared", 100))
    sched.submit("alone", 5.0, chain("own", 30))
    drain_in_order(sched)
    # heavy's 100 grants came while light waited too; light got 50 meanwhile, and its
    # other 50 alone, as did the call alone on its own slice: those take no one's share.
    assert sched.contended_grants == {2.0: 100, 1.0: 50}


def test_weights_apply_over_many_calls_sharing_a_slice() -> None:
    sched = IslandScheduler(window=3)
    weights = {"w1": 1.0, "w2": 2.0, "w5": 5.0}
    for call_id, w in weights.items():
        sched.submit(call_id, w, chain("s", 400))
    first = Counter(g.call_id for g in drain_in_order(sched)[:400])
    assert first == {"w1": 50, "w2": 100, "w5": 250}


def test_window_bounds_outstanding_grants_per_slice() -> None:
    sched = IslandScheduler(window=3)
    sched.submit("a", 1.0, chain("x", 10))
    sched.submit("b", 1.0, chain("y", 2))
    first = sched.grants()
    assert sched.outstanding("x") == 3
    assert sched.outstanding("y") == 2
    assert sched.grants() == []  # nothing more until room frees
    x0 = next(g for g in first if g.slice_id == "x")
    sched.complete("x", x0.seq)
    more = sched.grants()
    assert [(g.call_id, g.node) for g in more] == [("a", 3)]
    assert sched.pending("a") == 6


def test_a_lone_call_across_slices_stops_at_the_first_computation_whose_slice_is_full() -> None:
    sched = IslandScheduler(window=2)
    comps = [ScheduledComputation(i, "xy"[i % 2] if i < 4 else "x", (i - 1,) if i else ()) for i in range(7)]
    sched.submit("alone", 1.0, comps, tenant="t")
    first = sched.grants()
    assert [(g.slice_id, g.node) for g in first] == [("x", 0), ("y", 1), ("x", 2), ("y", 3)]
    assert [g.seq for g in first] == sorted(g.seq for g in first)
    assert sched.grants() == []  # node 4 waits for room on x, and nothing is granted past it
    sched.complete("y", first[1].seq)
    assert sched.grants() == []  # room on y does not let node 4 (on x) go
    sched.complete("x", first[0].seq)
    assert [(g.slice_id, g.node) for g in sched.grants()] == [("x", 4)]
    assert sched.pending("alone") == 2


def test_full_window_skips_only_the_call_blocked_on_it() -> None:
    sched = IslandScheduler(window=1)
    sched.submit("a", 1.0, chain("x", 3))
    sched.submit("b", 1.0, chain("y", 3))
    sched.submit("c", 1.0, chain("x", 3))
    assert {(g.call_id, g.node) for g in sched.grants()} == {("a", 0), ("b", 0)}


def test_dependencies_across_slices_are_granted_first() -> None:
    sched = IslandScheduler(window=1)
    comps = [
        ScheduledComputation(0, "x"),
        ScheduledComputation(1, "y", (0,)),
        ScheduledComputation(2, "z", (1,)),
        ScheduledComputation(3, "x", (2, 0)),
    ]
    sched.submit("pipe", 1.0, comps)
    grants = drain_in_order(sched)
    seq = {g.node: g.seq for g in grants}
    for c in comps:
        assert all(seq[d] < seq[c.node] for d in c.deps)


def test_new_call_starts_at_the_global_pass() -> None:
    sched = IslandScheduler(window=1)
    sched.submit("old", 1.0, chain("s", 2000))
    for _ in range(1000):
        (g,) = sched.grants()
        sched.complete(g.slice_id, g.seq)
    sched.submit("new", 1.0, chain("s", 50))
    nxt: list[str] = []
    for _ in range(20):
        (g,) = sched.grants()
        nxt.append(g.call_id)
        sched.complete(g.slice_id, g.seq)
    assert Counter(nxt) == {"old": 10, "new": 10}


def test_blocked_call_banks_no_credit() -> None:
    sched = IslandScheduler(window=1)
    sched.submit("blocker", 1.0, [ScheduledComputation(0, "x")])
    (block,) = sched.grants()
    sched.submit("a", 1.0, [ScheduledComputation(0, "x")] + chain("s", 50, start=1))
    sched.submit("b", 1.0, chain("s", 200))
    for _ in range(100):  # b runs alone on s while a waits for x
        for g in sched.grants():
            assert g.call_id == "b"
            sched.complete(g.slice_id, g.seq)
    sched.complete("x", block.seq)
    on_s: list[str] = []
    for _ in range(20):
        for g in sched.grants():
            if g.slice_id == "s":
                on_s.append(g.call_id)
            sched.complete(g.slice_id, g.seq)
    assert "aaa" not in "".join(c[0] for c in on_s)  # shares 1:1, no burst of a
    assert Counter(on_s) == {"a": 10, "b": 10}


def test_reset_slice_forgets_grants_and_drops_affected_calls() -> None:
    sched = IslandScheduler(window=2)
    ab = [ScheduledComputation(0, "x"), ScheduledComputation(1, "y", (0,))] + chain("x", 5, start=2)
    sched.submit("ab", 1.0, ab)
    sched.submit("only_y", 1.0, chain("y", 5))
    sched.submit("only_z", 1.0, chain("z", 5))
    first = sched.grants()
    x_grants = [g for g in first if g.slice_id == "x"]
    y_grant_of_ab = next(g for g in first if g.call_id == "ab" and g.slice_id == "y")
    assert x_grants

    affected = sched.reset_slice("x")

    assert affected == {"ab"}
    assert sched.outstanding("x") == 0
    assert sched.pending("ab") == 0
    assert sched.pending("only_y") > 0 and sched.pending("only_z") > 0
    with pytest.raises(UnknownGrant):
        sched.complete("x", x_grants[0].seq)
    sched.complete("y", y_grant_of_ab.seq)  # its grant elsewhere still completes
    for g in first:
        if g.slice_id != "x" and g is not y_grant_of_ab:
            sched.complete(g.slice_id, g.seq)
    rest = drain_in_order(sched)
    assert {g.call_id for g in rest} <= {"only_y", "only_z"}
    assert sched.outstanding("y") == sched.outstanding("z") == 0


def test_reset_slice_affects_calls_that_have_not_reached_it_yet() -> None:
    sched = IslandScheduler(window=1)
    sched.submit("c", 1.0, chain("y", 3) + [ScheduledComputation(3, "x", (2,))])
    sched.grants()
    assert sched.reset_slice("x") == {"c"}
    assert sched.pending("c") == 0
    assert sched.outstanding("y") == 1


def test_cancel_drops_ungranted_work_only() -> None:
    sched = IslandScheduler(window=2)
    sched.submit("c", 1.0, chain("x", 5))
    granted = sched.grants()
    sched.cancel("c")
    sched.cancel("c")  # idempotent
    sched.cancel("never-submitted")
    assert sched.pending("c") == 0
    assert sched.outstanding("x") == 2
    for g in granted:
        sched.complete(g.slice_id, g.seq)
    assert sched.grants() == []
    sched.submit("c", 1.0, chain("x", 1))  # the id is free again once finished


@pytest.mark.parametrize("weight", [0.0, -1.0, math.nan, math.inf])
def test_bad_weight_names_call_and_value(weight: float) -> None:
    with pytest.raises(ValueError, match=rf"call 'job-7' has weight {weight!r}"):
        IslandScheduler().submit("job-7", weight, chain("x", 1))


def test_complete_of_unknown_grant_names_slice_and_seq() -> None:
    sched = IslandScheduler()
    sched.submit("c", 1.0, chain("x", 2))
    sched.grants()
    with pytest.raises(UnknownGrant) as caught:
        sched.complete("x", 99)
    assert str(caught.value).startswith("slice 'x' has no outstanding grant with seq 99 (outstanding there: 0, 1)")
    assert isinstance(caught.value, KeyError)


def test_submit_rejects_non_topological_and_duplicate_input() -> None:
    sched = IslandScheduler()
    with pytest.raises(ValueError, match=r"call 'c': node 0 on slice 'x' depends on node\(s\) \[1\]"):
        sched.submit("c", 1.0, [ScheduledComputation(0, "x", (1,)), ScheduledComputation(1, "x")])
    with pytest.raises(ValueError, match="lists node 0 twice"):
        sched.submit("c", 1.0, [ScheduledComputation(0, "x"), ScheduledComputation(0, "y")])
    sched.submit("live", 1.0, chain("x", 1))
    with pytest.raises(ValueError, match="'live' is still active"):
        sched.submit("live", 1.0, chain("x", 1))


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="got 0"):
        IslandScheduler(window=0)


def test_shared_window_must_fit_in_the_window() -> None:
    with pytest.raises(ValueError, match="between 1 and the window"):
        IslandScheduler(window=4, shared_window=8)
    with pytest.raises(ValueError, match="got 0"):
        IslandScheduler(window=4, shared_window=0)


def test_a_call_alone_on_a_slice_gets_the_whole_window() -> None:
    sched = IslandScheduler(window=16, shared_window=2)
    sched.submit("alone", 1.0, chain("x", 20))
    assert len(sched.grants()) == 16
    assert sched.outstanding("x") == 16


def test_competing_calls_get_only_the_shared_window() -> None:
    sched = IslandScheduler(window=16, shared_window=2)
    sched.submit("a", 1.0, chain("x", 20))
    sched.submit("b", 1.0, chain("x", 20))
    sched.submit("c", 1.0, chain("y", 20))  # alone on its slice
    sched.grants()
    assert sched.outstanding("x") == 2
    assert sched.outstanding("y") == 16


def run_until_done(sched: IslandScheduler, call_id: str, granted: deque[Grant]) -> list[str]:
    """Grants and completes (oldest first, like a host) until ``call_id`` is finished."""
    order: list[str] = []
    while True:
        got = sched.grants()
        order += [g.call_id for g in got]
        granted.extend(got)
        if not sched.pending(call_id) and all(g.call_id != call_id for g in granted):
            return order
        oldest = granted.popleft()
        sched.complete(oldest.slice_id, oldest.seq)


def test_a_tenant_reentering_a_contended_slice_waits_only_behind_the_shared_window() -> None:
    """A tenant whose call ended re-submits; even though the other tenant was
    alone on the slice in between, stride order — not what was granted in the
    gap — decides what runs next."""
    sched = IslandScheduler(window=64, shared_window=2)
    granted: deque[Grant] = deque()
    sched.submit("light", 1.0, chain("s", 500))
    sched.submit("heavy-1", 8.0, chain("s", 16))
    run_until_done(sched, "heavy-1", granted)
    granted.extend(sched.grants())  # the gap: light alone on the slice
    assert sched.outstanding("s") <= 2
    sched.submit("heavy-2", 8.0, chain("s", 16))
    order = run_until_done(sched, "heavy-2", granted)
    assert Counter(order[:18]) == {"heavy-2": 16, "light": 2}, order


def test_a_slice_calm_for_a_whole_window_gets_the_whole_window_again() -> None:
    sched = IslandScheduler(window=8, shared_window=2)
    granted: deque[Grant] = deque()
    sched.submit("a", 1.0, chain("s", 3))
    sched.submit("b", 1.0, chain("s", 3))
    run_until_done(sched, "a", granted)
    run_until_done(sched, "b", granted)
    sched.submit("c", 1.0, chain("s", 100))
    granted.extend(sched.grants())
    assert len(granted) == 2  # lately contended
    rounds = 0
    while sched.outstanding("s") == 2:  # one grant per completion, held to the shared window
        oldest = granted.popleft()
        sched.complete(oldest.slice_id, oldest.seq)
        granted.extend(sched.grants())
        rounds += 1
        assert rounds <= 8, "calm for a whole window, yet still held to the shared window"
    assert sched.outstanding("s") == 8


TICK_S = 0.001
"""One computation's device time in the simulated host."""


def tenants_calling_back_to_back(
    weights: Mapping[str, float],
    length: int,
    gap: int,
    ticks: int,
    tenanted: bool = True,
    shared_window: int = 8,
    shared_ahead_s: float = 0.0,
) -> tuple[Counter[str], IslandScheduler]:
    """Each tenant calls a chain of ``length`` computations on one slice, and calls
    again ``gap`` ticks after its call ended; one host runs one grant per tick
    (a millisecond), in seq order. Returns the computations each tenant completed
    in ``ticks`` ticks."""
    sched = IslandScheduler(window=256, shared_window=shared_window, shared_ahead_s=shared_ahead_s)
    calls = Counter[str]()
    left: dict[str, int] = {}
    returning: dict[int, list[str]] = {}

    def call(tenant: str) -> None:
        call_id = f"{tenant}-{calls[tenant]}"
        calls[tenant] += 1
        sched.submit(call_id, weights[tenant], chain("s", length), tenant=tenant if tenanted else "")
        left[call_id] = length

    for tenant in weights:
        call(tenant)
    done = Counter[str]()
    queue: deque[Grant] = deque()
    for tick in range(ticks):
        for tenant in returning.pop(tick, []):
            call(tenant)
        queue.extend(sched.grants())
        if not queue:
            continue
        g = queue.popleft()
        sched.complete(g.slice_id, g.seq, now=tick * TICK_S)
        tenant = g.call_id.rsplit("-", 1)[0]
        done[tenant] += 1
        left[g.call_id] -= 1
        if not left[g.call_id]:
            returning.setdefault(tick + 1 + gap, []).append(tenant)
    return done, sched


@pytest.mark.parametrize("shared_ahead_s", [0.0, 0.024])
@pytest.mark.parametrize("gap", [0, 2, 5])
def test_weights_1_2_4_8_share_a_slice_within_10_percent_over_back_to_back_calls(
    gap: int, shared_ahead_s: float
) -> None:
    weights = {"w1": 1.0, "w2": 2.0, "w4": 4.0, "w8": 8.0}
    done, sched = tenants_calling_back_to_back(
        weights, length=128, gap=gap, ticks=20_000, shared_ahead_s=shared_ahead_s
    )
    if shared_ahead_s:
        assert sched.pace("s") == pytest.approx(TICK_S, rel=0.05)
    contended = sched.contended_grants
    for tenant, w in weights.items():
        want = w / sum(weights.values())
        assert done[tenant] / sum(done.values()) == pytest.approx(want, rel=0.1), (tenant, done)
        assert contended[w] / sum(contended.values()) == pytest.approx(want, rel=0.1), (w, contended)


def test_a_tenant_of_short_calls_gets_its_weight_not_a_grant_per_call() -> None:
    """One-computation calls, each submitted the moment the last one ended, one grant
    outstanding: were every call to start afresh at the global pass, the tenant that
    has just finished would win the next turn, whatever the weights."""
    weights = {"light": 1.0, "heavy": 4.0}
    done, _ = tenants_calling_back_to_back(weights, length=1, gap=0, ticks=5_000, shared_window=1)
    assert done["light"] / sum(done.values()) == pytest.approx(0.2, rel=0.1), done
    fresh, _ = tenants_calling_back_to_back(
        weights, length=1, gap=0, ticks=5_000, tenanted=False, shared_window=1
    )
    assert fresh["light"] / sum(fresh.values()) > 0.4, fresh


def test_a_tenant_with_two_calls_at_once_gets_its_weight_not_twice_it() -> None:
    sched = IslandScheduler(window=1)
    sched.submit("a-0", 1.0, chain("s", 100), tenant="a")
    sched.submit("a-1", 1.0, chain("s", 100), tenant="a")  # queued behind a-0, as async dispatch does
    sched.submit("b-0", 1.0, chain("s", 200), tenant="b")
    order = [g.call_id for g in drain_in_order(sched)]
    assert Counter(order[:200]) == {"a-0": 100, "b-0": 100}
    assert Counter(order[200:]) == {"a-1": 100, "b-0": 100}


def test_contended_grants_count_only_grants_another_tenant_waited_for() -> None:
    sched = IslandScheduler(window=2)
    sched.submit("a-0", 1.0, chain("s", 10), tenant="a")
    sched.submit("a-1", 1.0, chain("s", 10), tenant="a")
    drain_in_order(sched)
    assert sched.contended_grants == {}


def test_a_tenant_idle_for_a_while_banks_no_credit() -> None:
    sched = IslandScheduler(window=1)

    def next_grants(n: int) -> list[str]:
        order = []
        for _ in range(n):
            (g,) = sched.grants()
            order.append(g.call_id)
            sched.complete(g.slice_id, g.seq)
        return order

    sched.submit("a-0", 1.0, chain("s", 10), tenant="a")
    sched.submit("b-0", 1.0, chain("s", 2000), tenant="b")
    assert Counter(next_grants(20)) == {"a-0": 10, "b-0": 10}
    next_grants(1000)  # b alone on the slice while a is idle
    sched.submit("a-1", 1.0, chain("s", 100), tenant="a")
    assert Counter(next_grants(20)) == {"a-1": 10, "b-0": 10}


def test_without_a_shared_window_every_call_gets_the_window() -> None:
    sched = IslandScheduler(window=16)
    assert sched.shared_window == 16
    sched.submit("a", 1.0, chain("x", 20))
    sched.submit("b", 1.0, chain("x", 20))
    sched.grants()
    assert sched.outstanding("x") == 16


# --- property: simulated hosts never deadlock -------------------------------------------


Key = tuple[str, int]  # (call, node)


def run_hosts(
    queues: Mapping[tuple[str, int], deque[Key]],
    deps: Mapping[Key, Sequence[int]],
    done: set[Key],
    rng: random.Random,
) -> list[tuple[str, Key]]:
    """Advance hosts until none can: returns the collectives that finished, as (slice, key).

    Each host runs its queue strictly in order. A host may start the computation
    at its head once every input is done (data produced anywhere); the
    computation is a collective, finished only when every host of its slice has
    started it.
    """
    finished: list[tuple[str, Key]] = []
    by_slice: dict[str, list[deque[Key]]] = {}
    for (slice_id, _), q in queues.items():
        by_slice.setdefault(slice_id, []).append(q)
    progress = True
    while progress:
        progress = False
        for slice_id in rng.sample(sorted(by_slice), len(by_slice)):
            hosts = by_slice[slice_id]
            if not all(hosts):
                continue
            heads = {q[0] for q in hosts}
            key = next(iter(heads))
            if len(heads) == 1 and all((key[0], d) in done for d in deps[key]):
                for q in hosts:
                    q.popleft()
                done.add(key)
                finished.append((slice_id, key))
                progress = True
    return finished


def random_call(rng: random.Random, slices: Sequence[str]) -> list[ScheduledComputation]:
    n = rng.randint(1, 12)
    comps = []
    for i in range(n):
        deps = tuple(sorted(rng.sample(range(i), min(i, rng.randint(0, 3)))))
        comps.append(ScheduledComputation(i, rng.choice(slices), deps))
    return comps


@pytest.mark.parametrize("seed", range(60))
def test_random_programs_on_shared_slices_never_deadlock(seed: int) -> None:
    rng = random.Random(seed)
    slices = ["x", "y", "z"]
    sched = IslandScheduler(window=rng.choice([1, 2, 3, 8, 256]))
    queues = {(s, h): deque[Key]() for s in slices for h in range(rng.randint(1, 3))}
    deps: dict[Key, Sequence[int]] = {}
    granted: dict[Key, int] = {}
    submitted: dict[str, int] = {}
    cancelled: set[str] = set()
    done: set[Key] = set()
    last_seq = -1

    def submit(call_id: str) -> None:
        comps = random_call(rng, slices)
        for c in comps:
            deps[(call_id, c.node)] = c.deps
        submitted[call_id] = len(comps)
        sched.submit(call_id, rng.choice([0.5, 1.0, 2.0, 3.0, 7.5]), comps, tenant=rng.choice(["", "t0", "t1"]))

    for i in range(rng.randint(2, 6)):
        submit(f"call{i}")
    extra = rng.randint(0, 6)

    for step in range(5_000):
        for g in sched.grants():
            key = (g.call_id, g.node)
            assert key not in granted, f"{key} granted twice"
            assert g.seq > last_seq
            last_seq = g.seq
            assert all(granted[(g.call_id, d)] < g.seq for d in deps[key])
            granted[key] = g.seq
            for (s, _), q in queues.items():
                if s == g.slice_id:
                    q.append(key)
        for slice_id, key in run_hosts(queues, deps, done, rng):
            sched.complete(slice_id, granted[key])
        if extra and rng.random() < 0.3:
            extra -= 1
            submit(f"late{extra}")
        if rng.random() < 0.02 and submitted:
            victim = rng.choice(sorted(submitted))
            sched.cancel(victim)
            cancelled.add(victim)
        all_granted_done = set(granted) == done
        nothing_pending = all(sched.pending(c) == 0 for c in submitted)
        if all_granted_done and nothing_pending and not extra:
            break
    else:
        stuck = {s: [q[0] for q in qs] for s, qs in _group(queues).items() if any(qs)}
        raise AssertionError(f"deadlock or livelock after {step} steps; host heads: {stuck}")

    for call_id, n in submitted.items():
        ran = sum(1 for (c, _) in done if c == call_id)
        assert ran == n or call_id in cancelled, (call_id, ran, n)
    assert all(sched.outstanding(s) == 0 for s in slices)


def _group(queues: Mapping[tuple[str, int], deque[Key]]) -> dict[str, list[deque[Key]]]:
    out: dict[str, list[deque[Key]]] = {}
    for (s, _), q in queues.items():
        out.setdefault(s, []).append(q)
    return out


def test_the_simulator_does_detect_an_inconsistent_order() -> None:
    """Per-slice orders that disagree (what a per-slice counter allows) do deadlock here."""
    deps: dict[Key, Sequence[int]] = {("A", 0): (), ("A", 1): (0,), ("B", 0): (), ("B", 1): (0,)}
    queues = {
        ("x", 0): deque([("B", 1), ("A", 0)]),
        ("x", 1): deque([("B", 1), ("A", 0)]),
        ("y", 0): deque([("A", 1), ("B", 0)]),
    }
    done: set[Key] = set()
    assert run_hosts(queues, deps, done, random.Random(0)) == []
    assert done == set()




def complete_oldest(sched: IslandScheduler, granted: deque[Grant], now: float) -> None:
    oldest = granted.popleft()
    sched.complete(oldest.slice_id, oldest.seq, now=now)


def two_tenants_of_millisecond_computations(
    window: int, ahead_s: float, ticks: int
) -> tuple[IslandScheduler, list[int], list[int]]:
    """Two tenants keep one slice busy; its host finishes the oldest grant each
    millisecond. Returns the scheduler, the grants outstanding after each tick,
    and the size of each batch of grants it made after the first."""
    sched = IslandScheduler(window=window, shared_window=2, shared_ahead_s=ahead_s)
    sched.submit("a", 1.0, chain("s", 2 * ticks))
    sched.submit("b", 1.0, chain("s", 2 * ticks))
    granted: deque[Grant] = deque(sched.grants())
    assert len(granted) == 2  # the pace is not known yet
    held, batches = [], []
    for tick in range(1, ticks + 1):
        complete_oldest(sched, granted, tick * 0.001)
        new = sched.grants()
        granted.extend(new)
        held.append(sched.outstanding("s"))
        if new:
            batches.append(len(new))
    return sched, held, batches


def test_a_contended_slice_keeps_the_shared_ahead_time_granted() -> None:
    """Millisecond computations, 10 ms ahead: once the pace is learnt, ten grants
    are outstanding while two tenants want the slice, not the two of ``shared_window``."""
    sched, held, _ = two_tenants_of_millisecond_computations(window=64, ahead_s=0.010, ticks=100)
    assert sched.pace("s") == pytest.approx(0.001)
    assert max(held[50:]) == 10


@pytest.mark.parametrize(("ahead_s", "expected"), [(0.001, 2), (1.0, 16)])
def test_the_shared_ahead_time_is_held_between_the_shared_window_and_the_window(
    ahead_s: float, expected: int
) -> None:
    _, held, _ = two_tenants_of_millisecond_computations(window=16, ahead_s=ahead_s, ticks=100)
    assert max(held[50:]) == expected


def test_a_tenant_alone_on_a_lately_contended_slice_gets_only_the_shared_window_ahead() -> None:
    """Whoever comes first to a shared slice is only ``shared_window`` ahead of those
    that follow, however fast its computations are."""
    sched = IslandScheduler(window=64, shared_window=2, shared_ahead_s=0.010)
    sched.submit("a", 1.0, chain("s", 50))
    sched.submit("b", 1.0, chain("s", 500))
    granted: deque[Grant] = deque()
    tick = 0
    while sched.pending("a") or any(g.call_id == "a" for g in granted):
        granted.extend(sched.grants())
        tick += 1
        complete_oldest(sched, granted, tick * 0.001)
        assert tick <= 200
    assert sched.pace("s") == pytest.approx(0.001)
    while granted:  # what was granted while a was still there
        tick += 1
        complete_oldest(sched, granted, tick * 0.001)
    for _ in range(20):
        granted.extend(sched.grants())
        assert sched.outstanding("s") == 2
        tick += 1
        complete_oldest(sched, granted, tick * 0.001)


def test_time_a_slice_spent_with_nothing_granted_does_not_count_as_its_pace() -> None:
    sched = IslandScheduler(window=4, shared_window=2, shared_ahead_s=0.010)
    for i, start in enumerate((0.0, 10.0)):  # two calls, ten seconds apart
        sched.submit(f"c{i}", 1.0, chain("s", 4))
        granted: deque[Grant] = deque(sched.grants())
        for k in range(1, 5):
            complete_oldest(sched, granted, start + k * 0.001)
    assert sched.pace("s") == pytest.approx(0.001)


def test_untimed_completions_leave_the_pace_unknown() -> None:
    sched = IslandScheduler(window=4, shared_window=2, shared_ahead_s=0.010)
    sched.submit("c", 1.0, chain("s", 4))
    drain_in_order(sched)
    assert sched.pace("s") is None


@pytest.mark.parametrize("ahead_s", [-0.001, math.inf, math.nan])
def test_shared_ahead_must_be_a_finite_time(ahead_s: float) -> None:
    with pytest.raises(ValueError, match="shared_ahead_s"):
        IslandScheduler(window=4, shared_window=2, shared_ahead_s=ahead_s)


def test_a_tenant_whose_call_runs_out_finds_only_the_shared_window_ahead_when_it_ends() -> None:
    """Once a tenant has nothing more to grant, the others get no more than
    ``shared_window`` ahead: were it to call again as its call ends, it would
    wait behind the whole time ahead otherwise."""
    sched = IslandScheduler(window=64, shared_window=2, shared_ahead_s=0.010)
    sched.submit("a", 8.0, chain("s", 60), tenant="a")
    sched.submit("b", 1.0, chain("s", 500), tenant="b")
    sched.submit("c", 1.0, chain("s", 500), tenant="c")  # b and c still compete once a has run out
    granted: deque[Grant] = deque(sched.grants())
    widest = 0
    for tick in range(1, 201):
        last_of_a = granted[0].call_id == "a" and not sched.pending("a") and sum(
            g.call_id == "a" for g in granted
        ) == 1
        complete_oldest(sched, granted, tick * 0.001)
        if last_of_a:
            assert sched.outstanding("s") <= 2, granted
            break
        granted.extend(sched.grants())
        widest = max(widest, sched.outstanding("s"))
    else:
        raise AssertionError("call a did not end")
    assert widest == 10


def test_a_slice_held_beyond_the_shared_window_is_refilled_by_halves() -> None:
    _, held, batches = two_tenants_of_millisecond_computations(window=64, ahead_s=0.010, ticks=300)
    assert min(held[100:]) >= 5, "refilled too late: the host ran short"
    assert set(batches[-20:]) <= {5, 6}, batches


def test_completions_reported_together_do_not_make_the_pace_zero() -> None:
    sched = IslandScheduler(window=64, shared_window=4, shared_ahead_s=0.010)
    sched.submit("a", 1.0, chain("s", 50))
    sched.submit("b", 1.0, chain("s", 50))
    granted: deque[Grant] = deque(sched.grants())
    complete_oldest(sched, granted, 0.001)
    complete_oldest(sched, granted, 0.001)  # in the same batch as the one before
    assert sched.pace("s") is None
    complete_oldest(sched, granted, 0.003)
    assert sched.pace("s") == pytest.approx(0.002)


# ---------------------------------------------------------------- reports


def test_a_call_granted_whole_tells_its_hosts_no_room_is_wanted() -> None:
    sched = IslandScheduler(window=8)
    sched.submit("lone", 1.0, chain("x", 8))
    (batch,) = sched.grant_batches()
    assert (batch.slice_id, len(batch.grants), batch.room_wanted) == ("x", 8, False)


def test_a_call_beyond_the_window_tells_its_hosts_room_is_wanted_until_its_last_grants() -> None:
    sched = IslandScheduler(window=4)
    sched.submit("long", 1.0, chain("x", 6))
    (first,) = sched.grant_batches()
    assert (len(first.grants), first.room_wanted) == (4, True)
    for g in first.grants[:2]:
        sched.complete("x", g.seq)
    (last,) = sched.grant_batches()
    assert (len(last.grants), last.room_wanted) == (2, False)


def test_work_waiting_on_a_slice_told_no_room_is_wanted_is_announced_without_grants() -> None:
    sched = IslandScheduler(window=4)
    sched.submit("a", 1.0, chain("x", 4))
    (first,) = sched.grant_batches()
    assert not first.room_wanted
    sched.submit("b", 1.0, chain("x", 2))
    (news,) = sched.grant_batches()
    assert (news.slice_id, news.grants, news.room_wanted) == ("x", (), True)
    assert sched.grant_batches() == [], "the hosts heard it once; nothing changed since"


def test_a_relaunched_gang_is_told_afresh() -> None:
    sched = IslandScheduler(window=4)
    sched.submit("a", 1.0, chain("x", 4))
    sched.grant_batches()
    sched.reset_slice("x")
    sched.submit("b", 1.0, chain("x", 2))
    (batch,) = sched.grant_batches()
    assert (len(batch.grants), batch.room_wanted) == (2, False)


def _run_of_completions(by_run: bool) -> tuple[IslandScheduler, list[Grant]]:
    """Two calls on one slice, granted together; completions come back in runs of
    various sizes at ticking times, each run completed as a whole or seq by seq."""
    sched = IslandScheduler(window=64)
    sched.submit("a", 1.0, chain("s", 40))
    sched.submit("b", 2.0, chain("s", 20))
    issued = sched.grants()
    now, at = 100.0, 0
    for size in (1, 7, 1, 16, 30, 5):
        seqs = [g.seq for g in issued[at:at + size]]
        at += size
        now += 0.003 * size
        if by_run:
            sched.complete_run("s", seqs + [10_000], now)  # an unknown seq is passed over
        else:
            for seq in seqs:
                sched.complete("s", seq, now)
    return sched, issued


def test_completing_a_run_leaves_the_scheduler_as_completing_its_grants_one_by_one() -> None:
    by_run, issued = _run_of_completions(by_run=True)
    one_by_one, again = _run_of_completions(by_run=False)
    assert issued == again
    assert by_run.outstanding("s") == one_by_one.outstanding("s") == 0
    assert by_run.pace("s") == pytest.approx(one_by_one.pace("s"), rel=1e-12)
    assert by_run.pending("a") == by_run.pending("b") == 0
    by_run.submit("a", 1.0, chain("s", 1))  # forgotten: no longer active
    one_by_one.submit("a", 1.0, chain("s", 1))
    assert by_run.grants()[0].seq == one_by_one.grants()[0].seq


def test_a_sequence_that_failed_its_checks_is_checked_again_at_every_submit() -> None:
    sched = IslandScheduler(window=4)
    bad = [ScheduledComputation(0, "s", (1,)), ScheduledComputation(1, "s", ())]
    for call_id in ("c1", "c2"):
        with pytest.raises(ValueError, match="do not come before it"):
            sched.submit(call_id, 1.0, bad)
    good = chain("s", 2)
    sched.submit("c3", 1.0, good)
    sched.submit("c4", 1.0, good)  # the same program's next call
    assert sorted((g.call_id, g.node) for g in sched.grants()) == [("c3", 0), ("c3", 1), ("c4", 0), ("c4", 1)]
