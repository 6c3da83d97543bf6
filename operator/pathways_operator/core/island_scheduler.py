"""The island scheduler: one global order for every computation on every slice.

Pathways gang-schedules computations centrally because accelerator collectives
are not preemptible: if two programs share a slice and host 0 runs program A's
all-reduce while host 1 runs program B's, both wait forever. Here every
computation a program call submits gets a *grant* carrying a sequence number
from one counter shared by all slices, and every host of a slice runs the
grants of its slice strictly in sequence order. Hosts never ask the scheduler
anything per computation; they receive grants in batches and run them as their
inputs arrive.

Why this cannot deadlock
------------------------
Within a call, computations are granted in the given topological order, so a
computation's dependencies always hold lower sequence numbers than it does.
Take the lowest sequence number ``q`` not yet finished. Its dependencies have
lower numbers, so they are finished and its inputs exist. Every computation
before it on its slice also has a lower number, so each host of that slice has
finished them and is now at ``q``: all participants of its collectives are
present. So ``q`` can always run, and by induction everything granted finishes.
A per-slice counter would not do: slice X could order A before B while slice Y
orders B before A, and a program whose step on Y waits for its step on X then
closes a cycle. One counter makes every slice's order a restriction of a single
global order, which is what the argument needs.

The window (at most ``window`` granted-but-not-completed computations per
slice) only delays granting; it never withholds the lowest unfinished grant,
so it bounds host queues and memory without affecting the argument.

The window adapts to contention. A call alone on a slice gets the whole
``window`` granted ahead, so its hosts never wait for the scheduler. Once
several calls have had ungranted work on a slice at the same time, only
``shared_window`` grants may be outstanding there, until ``window`` grants in a
row went to the slice without contention: whatever is granted runs first, so a
large window turns the stride order into first-come-first-served — a tenant
that re-enters after its previous call ended (and in the gap left the others
alone on the slice) would start behind everything they were granted
meanwhile, and the shares drift towards equal.

A count of grants is not a measure of work, though: the host runs dry when its
completion has to travel to the scheduler and the next grants back before the
window's other computations finish, so short computations need more of them
ahead. With ``shared_ahead_s`` and completions timed (``complete(..., now)``),
the scheduler learns each slice's time per computation (the mean gap between
completions while the slice had grants outstanding) and, while several tenants
want the slice, keeps about ``shared_ahead_s`` of device time granted there:
never fewer than ``shared_window`` grants, never more than ``window``. Only
``shared_window`` is granted ahead, though, to a tenant alone on a lately
contended slice (whoever arrives first is that little ahead of those that
follow), and while a tenant's grants there are running out with nothing more of
it to grant (one that calls again as its call ends would wait behind all that
the others were granted meanwhile). From there the slice grows back towards
the time ahead by one grant per completion, so a tenant that calls again a few
computations later finds only a few more ahead of it. A client that keeps its
next call queued never leaves, so its slice keeps the time ahead. A slice held
beyond ``shared_window`` is refilled only once half of what it holds has run:
its hosts then get their grants, and report their completions, a batch at a
time rather than in one message each way per computation.

Reports
-------
A slice's hosts report completions to free window room. While nothing waits
for room on the slice (no active call touching it has ungranted work), nobody
needs those reports until the call ends, so each batch of grants says whether
room is wanted (``grant_batches``): without, the hosts may hold completions
back for company until their work runs out. A slice that was told no room is
wanted and now has work waiting hears so at once, in a batch without grants.
A lone 128-computation call of tiny computations sent its first half's
completions up mid-call in most calls, and on 2 cores that message cost the
worker's dispatch loop about a millisecond.

Sharing between calls: stride scheduling
----------------------------------------
Programs sharing slices receive grants in proportion to their ``weight``
(``PathwaysProgram.spec.weight``). Shares are kept per *tenant*, which the
caller names (one client's calls of one program; a call that names none is a
tenant of its own). Each tenant has a *pass*; the tenant with the lowest pass
gets the next grant, for the first of its calls (in submission order) whose
next computation's slice has room, and advances its pass by ``STRIDE / weight``.
So a client that keeps a second call queued behind the first, as asynchronous
dispatch does, gets its weight and not twice it. A tenant that arrives starts at
the current global pass, so it neither jumps ahead of tenants already running
(it earned no credit) nor waits behind their accumulated passes; a tenant
that calls again goes on from its own pass, if that is further on: otherwise a
client calling again as soon as its call ended would be one stride ahead at
every call, and one of short calls would win a grant each time it came back,
whatever its weight. A tenant idle for a while finds the global pass beyond its
own and banks nothing. A tenant none of whose calls has room is skipped for
now; it does not bank credit while blocked (its pass is brought up to the
global pass when it next runs), so it cannot monopolise a slice after. Ties go
to the tenant whose oldest call was submitted first.

Shares are observable: `contended_grants` counts, by the weight of the call that got
it, every grant made on a slice that another tenant was also waiting for. Grants a
tenant gets alone on a slice take nothing from anyone, so only these follow the weights
(the operator exports them as ``pathways_contended_grants_total{weight}``).

Everything here is plain in-memory state driven by calls; no clocks, no I/O.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pathways_wire.wording import plural

STRIDE = float(1 << 20)
"""Pass advance of a call of weight 1 per grant; large so that float passes stay precise."""

CHECKED_KEPT = 256
"""Computation sequences `submit` remembers having checked: a controller's programs
each submit the same sequence (`ProgramRecord.scheduled`) at every call."""
PACE_WEIGHT = 1 / 32
"""Weight of each completion gap in a slice's mean time per computation: completions
come back in batches (one gap, then zeros), so the mean must span several batches."""


@dataclasses.dataclass(frozen=True)
class ScheduledComputation:
    """One computation of a program call, as the scheduler sees it."""

    node: int
    """Index in the program, topological order."""
    slice_id: str
    """Physical slice it runs on."""
    deps: tuple[int, ...] = ()
    """Nodes of the same call it consumes."""


class Grant(NamedTuple):
    """Permission for every host of ``slice_id`` to run ``node`` of ``call_id`` at position ``seq``.

    A named tuple: one is made per computation granted, which a frozen dataclass made
    about twice as costly."""

    slice_id: str
    seq: int
    """Global, strictly increasing across the whole scheduler."""
    call_id: str
    node: int


@dataclasses.dataclass(frozen=True)
class SliceGrants:
    """What the hosts of ``slice_id`` hear next: ``grants`` (in seq order) and whether
    computations still wait for room on the slice (``room_wanted``; see Reports)."""

    slice_id: str
    grants: tuple[Grant, ...]
    room_wanted: bool


class UnknownGrant(KeyError):
    """``complete`` named a grant that is not outstanding (already completed, reset, or never made).

    A KeyError, so callers that tolerate completions racing a reset can catch it
    as such; ``str()`` is the plain message rather than KeyError's quoted repr.
    """

    def __init__(self, slice_id: str, seq: int, outstanding: Sequence[int]) -> None:
        self.slice_id = slice_id
        self.seq = seq
        shown = ", ".join(str(s) for s in outstanding[:8])
        if len(outstanding) > 8:
            shown += f", ... ({len(outstanding)} in all)"
        super().__init__(
            f"slice {slice_id!r} has no outstanding grant with seq {seq} "
            f"(outstanding there: {shown or 'none'}); was it completed twice or reset?"
        )

    def __str__(self) -> str:
        return str(self.args[0])


@dataclasses.dataclass
class _Call:
    call_id: str
    weight: float
    stride: float
    order: int
    tenant: str
    todo: deque[ScheduledComputation]
    slices: frozenset[str]
    outstanding: int = 0


class IslandScheduler:
    """Grants computations of concurrent program calls in one global order, shared by weight."""

    def __init__(
        self, window: int = 256, shared_window: int | None = None, shared_ahead_s: float = 0.0
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1 computation per slice, got {window}")
        shared = window if shared_window is None else shared_window
        if not 1 <= shared <= window:
            raise ValueError(
                f"shared_window must be between 1 and the window ({window}), got {shared_window}"
            )
        if not (math.isfinite(shared_ahead_s) and shared_ahead_s >= 0):
            raise ValueError(
                f"shared_ahead_s must be a finite number of seconds >= 0 (0: count grants only), "
                f"got {shared_ahead_s!r}"
            )
        self._window = window
        self._shared_window = shared
        self._shared_ahead_s = shared_ahead_s
        self._pace: dict[str, float] = {}
        """Slice -> mean seconds per computation, learnt from timed completions."""
        self._last_done: dict[str, float] = {}
        """Slice -> when its last completion came, while it still had grants outstanding."""
        self._reach: dict[str, int] = {}
        """Contended slice -> grants it may have outstanding on its way to the time ahead."""
        self._calm: dict[str, int] = {}
        """Contended slices -> grants made there since they were last contended."""
        self._next_seq = 0
        self._global_pass = 0.0
        self._submissions = 0
        self._checked: dict[int, tuple[Sequence[ScheduledComputation], frozenset[str]]] = {}
        """id -> a computations sequence `submit` checked, and its slices (see `_check`)."""
        self._calls: dict[str, _Call] = {}
        self._passes: dict[str, float] = {}
        """Tenant -> its pass, while it has calls or its pass is beyond the global pass."""
        self._granted: dict[str, dict[int, tuple[str, int]]] = {}
        """slice -> seq -> (call, node) of grants not yet completed."""
        self._told_room: dict[str, bool] = {}
        """Slice -> whether its hosts were last told room is wanted (unheard: they assume so)."""
        self._contended: dict[float, int] = {}

    @property
    def window(self) -> int:
        return self._window

    @property
    def shared_window(self) -> int:
        return self._shared_window

    @property
    def contended_grants(self) -> dict[float, int]:
        """Weight -> grants made on a slice another call was waiting for (see the module docstring)."""
        return dict(self._contended)

    def submit(
        self,
        call_id: str,
        weight: float,
        computations: Sequence[ScheduledComputation],
        tenant: str = "",
    ) -> None:
        """Queue one program call's computations, in topological order, for granting.

        ``tenant`` names whose share the call draws on (see the module
        docstring); a call without one is a tenant of its own.

        Raises ValueError, naming the call, for a weight that is not a finite
        number > 0, a call id still active, a repeated node, or a dependency on
        a node that does not come earlier in ``computations``.
        """
        if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
            raise ValueError(
                f"call {call_id!r} has weight {weight!r}; weight must be a finite number > 0"
            )
        active = self._calls.get(call_id)
        if active is not None:
            raise ValueError(
                f"call {call_id!r} is still active ({plural(len(active.todo), 'computation')} not granted, "
                f"{active.outstanding} granted and not completed); submit it under a new id"
            )
        checked = self._checked.get(id(computations))
        if checked is not None and checked[0] is computations:
            slices = checked[1]
        else:
            slices = self._check(call_id, computations)
        if not computations:
            return
        tenant = tenant or call_id
        self._passes[tenant] = max(self._global_pass, self._passes.get(tenant, 0.0))
        self._calls[call_id] = _Call(
            call_id=call_id,
            weight=float(weight),
            stride=STRIDE / weight,
            order=self._submissions,
            tenant=tenant,
            todo=deque(computations),
            slices=slices,
        )
        self._submissions += 1

    def _check(self, call_id: str, computations: Sequence[ScheduledComputation]) -> frozenset[str]:
        """`submit`'s checks of ``computations``; their slices. A sequence that passed is
        remembered (`CHECKED_KEPT` of them), so a program's next call is not checked again."""
        seen: set[int] = set()
        for position, comp in enumerate(computations):
            if comp.node in seen:
                raise ValueError(
                    f"call {call_id!r} lists node {comp.node} twice (again at position {position})"
                )
            missing = [d for d in comp.deps if d not in seen]
            if missing:
                raise ValueError(
                    f"call {call_id!r}: node {comp.node} on slice {comp.slice_id!r} depends on "
                    f"node(s) {missing} that do not come before it; computations must be in "
                    "topological order"
                )
            if not comp.slice_id:
                raise ValueError(f"call {call_id!r}: node {comp.node} has an empty slice_id")
            seen.add(comp.node)
        slices = frozenset(c.slice_id for c in computations)
        if len(self._checked) >= CHECKED_KEPT:
            del self._checked[next(iter(self._checked))]
        self._checked[id(computations)] = (computations, slices)
        return slices

    def grants(self) -> list[Grant]:
        """Grant everything grantable now, in seq order; each computation is granted once."""
        waiting: dict[str, list[_Call]] = {}
        for active in self._calls.values():  # in submission order
            if active.todo:
                waiting.setdefault(active.tenant, []).append(active)
        ready = [(self._passes[t], calls[0].order, t) for t, calls in waiting.items()]
        heapq.heapify(ready)
        limit = self._limits()
        wanting = self._wanting()
        issued: list[Grant] = []
        while ready:
            _, _, tenant = heapq.heappop(ready)
            calls = waiting[tenant]
            if not ready and len(calls) == 1:
                self._grant_alone(tenant, calls[0], limit, issued)
                continue
            # The tenant keeps the next grant while its pass stays the lowest: granting
            # on here is what pushing it back and popping it again would do.
            while True:
                call = next((c for c in calls if self._has_room(c.todo[0].slice_id, limit)), None)
                if call is None:
                    break  # skipped until complete() frees room on a slice it waits for
                comp = call.todo.popleft()
                slice_id = comp.slice_id
                self._count_calm(slice_id)
                if len(wanting.get(slice_id, ())) > 1:
                    self._contended[call.weight] = self._contended.get(call.weight, 0) + 1
                if not call.todo:
                    calls.remove(call)
                    for touched in call.slices:
                        wanting[touched][tenant] -= 1
                        if not wanting[touched][tenant]:
                            del wanting[touched][tenant]
                self._issue(tenant, call, comp, issued)
                if not calls:
                    break
                key = (self._passes[tenant], calls[0].order, tenant)
                if ready and ready[0] < key:
                    heapq.heappush(ready, key)
                    break
        return issued

    def _grant_alone(self, tenant: str, call: _Call, limit: dict[str, int], issued: list[Grant]) -> None:
        """`grants` for the one call of the one tenant left with work: everything its slices
        have room for, in order, as the general loop would grant it (no other tenant waits
        on any slice, so none is contended and no pass is compared; nothing reads who wants
        which slice after it)."""
        todo, granted, window = call.todo, self._granted, self._window
        passes, stride, call_id = self._passes, call.stride, call.call_id
        seq, global_pass, pass_ = self._next_seq, self._global_pass, passes[tenant]
        room, on_slice, slice_id = 0, None, ""
        try:
            while todo:
                comp = todo[0]
                if comp.slice_id != slice_id or on_slice is None:
                    slice_id = comp.slice_id
                    on_slice = granted.setdefault(slice_id, {})
                    room = limit.get(slice_id, window) - len(on_slice)
                if room <= 0:
                    return
                todo.popleft()
                if self._calm:
                    self._count_calm(slice_id)
                # `_issue`, with what it reads and writes kept in locals
                on_slice[seq] = (call_id, comp.node)
                issued.append(Grant(slice_id, seq, call_id, comp.node))
                seq += 1
                room -= 1
                global_pass = max(global_pass, pass_)
                pass_ = global_pass + stride
        finally:
            call.outstanding += seq - self._next_seq
            self._next_seq, self._global_pass, passes[tenant] = seq, global_pass, pass_

    def _issue(self, tenant: str, call: _Call, comp: ScheduledComputation, issued: list[Grant]) -> None:
        """Grants `comp` of `call` the next number, outstanding on its slice (whose table
        `_has_room` made), and moves the tenant's pass on."""
        seq = self._next_seq
        self._next_seq = seq + 1
        self._granted[comp.slice_id][seq] = (call.call_id, comp.node)
        call.outstanding += 1
        issued.append(Grant(comp.slice_id, seq, call.call_id, comp.node))
        self._global_pass = max(self._global_pass, self._passes[tenant])
        self._passes[tenant] = self._global_pass + call.stride

    def grant_batches(self) -> list[SliceGrants]:
        """`grants`, per slice, each batch saying whether room is wanted there (see
        Reports); a slice whose hosts were told it is not, and where work now waits,
        gets a batch even without grants."""
        per_slice: dict[str, list[Grant]] = {}
        for grant in self.grants():
            per_slice.setdefault(grant.slice_id, []).append(grant)
        waiting = set(self._wanting())
        for slice_id in sorted(waiting):
            if not self._told_room.get(slice_id, True):
                per_slice.setdefault(slice_id, [])
        batches = []
        for slice_id, grants in per_slice.items():
            wanted = slice_id in waiting
            self._told_room[slice_id] = wanted
            batches.append(SliceGrants(slice_id, tuple(grants), wanted))
        return batches

    def _has_room(self, slice_id: str, limit: dict[str, int]) -> bool:
        return len(self._granted.setdefault(slice_id, {})) < limit.get(slice_id, self._window)

    def _limits(self) -> dict[str, int]:
        """The window of each slice that is, or lately was, contended."""
        if self._shared_window == self._window:
            return {}
        wanting = self._wanting()
        contended = {s for s, tenants in wanting.items() if len(tenants) > 1}
        for slice_id in contended:
            self._calm[slice_id] = 0
        limits: dict[str, int] = {}
        for slice_id in self._calm:
            if slice_id in contended and not self._leaving(slice_id, wanting[slice_id]):
                reach = self._reach.get(slice_id, self._shared_window)
                limit = self._reach[slice_id] = min(self._ahead(slice_id), reach)
                low = limit <= self._shared_window or self.outstanding(slice_id) <= limit - limit // 2
                limits[slice_id] = limit if low else 0  # refilled by halves, not grant by grant
            else:
                limits[slice_id] = self._reach[slice_id] = self._shared_window
        return limits

    def _leaving(self, slice_id: str, wanting: dict[str, int]) -> bool:
        """Whether a tenant still has grants on the slice but nothing more to be granted:
        if it calls again, it waits behind whatever the others are granted meanwhile."""
        granted = self._granted.get(slice_id, {}).values()
        return any(self._calls[call_id].tenant not in wanting for call_id, _ in granted)

    def _ahead(self, slice_id: str) -> int:
        """Grants that hold about ``shared_ahead_s`` of the slice's device time, within
        [``shared_window``, ``window``]; ``shared_window`` until its pace is known."""
        pace = self._pace.get(slice_id)
        if not self._shared_ahead_s or pace is None:
            return self._shared_window
        wanted = round(self._shared_ahead_s / pace) if pace > 0 else self._window
        return max(self._shared_window, min(self._window, wanted))

    def pace(self, slice_id: str) -> float | None:
        """Mean seconds per computation on the slice, from timed completions (None: not known yet)."""
        return self._pace.get(slice_id)

    def _wanting(self) -> dict[str, dict[str, int]]:
        """Slice -> tenant -> its calls with ungranted work that touch the slice."""
        wanting: dict[str, dict[str, int]] = {}
        for call in self._calls.values():
            if call.todo:
                for slice_id in call.slices:
                    tenants = wanting.setdefault(slice_id, {})
                    tenants[call.tenant] = tenants.get(call.tenant, 0) + 1
        return wanting

    def _count_calm(self, slice_id: str) -> None:
        calm = self._calm.get(slice_id)
        if calm is None:
            return
        if calm + 1 >= self._window:
            del self._calm[slice_id]  # calm for a whole window: back to the full window
            self._reach.pop(slice_id, None)
        else:
            self._calm[slice_id] = calm + 1

    def complete(self, slice_id: str, seq: int, now: float | None = None) -> None:
        """Record that every host of ``slice_id`` finished grant ``seq``; frees window room.

        ``now`` (seconds, any steady clock) times the completion, so that the slice's
        time per computation is learnt (see the module docstring)."""
        on_slice = self._granted.get(slice_id, {})
        if seq not in on_slice:
            raise UnknownGrant(slice_id, seq, sorted(on_slice))
        self.complete_run(slice_id, (seq,), now)

    def complete_run(self, slice_id: str, seqs: Iterable[int], now: float | None = None) -> None:
        """`complete` for each of ``seqs`` in order, passing over those not outstanding on
        ``slice_id`` (a slice reset since, where `complete` raises): a host's completion of
        a run of grants in one pass, with the slice's pace learnt as from that many
        completions at ``now``."""
        on_slice = self._granted.get(slice_id)
        if on_slice is None:
            return
        pop = on_slice.pop
        done: dict[str, int] = {}
        for seq in seqs:
            entry = pop(seq, None)
            if entry is not None:
                done[entry[0]] = done.get(entry[0], 0) + 1
        count = sum(done.values())
        if not count:
            return
        if slice_id in self._reach:
            self._reach[slice_id] += count
        if now is not None:
            # as `count` completions at `now`: one gap, then count - 1 of none; the next
            # gap is timed from now only if grants are still outstanding
            self._time_completion(slice_id, now, busy=bool(on_slice))
            mean = self._pace.get(slice_id)
            if mean is not None and count > 1:
                self._pace[slice_id] = mean * (1 - PACE_WEIGHT) ** (count - 1)
        for call_id, n in done.items():
            call = self._calls[call_id]
            call.outstanding -= n
            self._forget_if_done(call)

    def _time_completion(self, slice_id: str, now: float, busy: bool) -> None:
        """A gap counts only if the slice had grants outstanding all along: time it
        spent with nothing granted is the scheduler's, not the computations'."""
        last = self._last_done.pop(slice_id, None)
        mean = self._pace.get(slice_id)
        if last is not None and mean is not None:
            self._pace[slice_id] = mean + PACE_WEIGHT * (max(0.0, now - last) - mean)
        elif last is not None and now > last:
            self._pace[slice_id] = now - last  # not from within a batch: that would start at 0
        if busy:
            self._last_done[slice_id] = now

    def cancel(self, call_id: str) -> None:
        """Drop the call's ungranted computations; its outstanding grants still need complete().

        Unknown or finished calls are ignored, so cancelling is idempotent.
        """
        call = self._calls.get(call_id)
        if call is None:
            return
        call.todo.clear()
        self._forget_if_done(call)

    def reset_slice(self, slice_id: str) -> set[str]:
        """Forget the slice's outstanding grants after its gang was relaunched.

        Returns the ids of the calls affected: every active call with any
        computation on the slice (its plan, buffers or queued collectives there
        died with the old gang). All their ungranted work, on every slice, is
        dropped; grants they still hold on other slices stay outstanding until
        those hosts report them (as failed) through :meth:`complete`.
        """
        affected = {cid for cid, call in self._calls.items() if slice_id in call.slices}
        self._calm.pop(slice_id, None)
        self._told_room.pop(slice_id, None)
        self._last_done.pop(slice_id, None)
        self._reach.pop(slice_id, None)
        for call_id, _ in self._granted.pop(slice_id, {}).values():
            affected.add(call_id)
            self._calls[call_id].outstanding -= 1
        for call_id in affected:
            call = self._calls[call_id]
            call.todo.clear()
            self._forget_if_done(call)
        return affected

    def outstanding(self, slice_id: str) -> int:
        """Granted and not completed on ``slice_id``."""
        return len(self._granted.get(slice_id, ()))

    def pending(self, call_id: str) -> int:
        """Computations of the call not yet granted (0 for unknown or finished calls)."""
        call = self._calls.get(call_id)
        return len(call.todo) if call is not None else 0

    def _forget_if_done(self, call: _Call) -> None:
        if not call.todo and call.outstanding == 0:
            del self._calls[call.call_id]
            active = {c.tenant for c in self._calls.values()}
            self._passes = {t: p for t, p in self._passes.items() if t in active or p > self._global_pass}
