"""The finisher thread: waits for dispatched computations and writes values out.

It carries out the state machine's `FinishBatch` and `Export` instructions in
the order they were given: for each batch it waits for the grants' outputs,
reports their completions (with small outputs inline) in as few outbox
messages as it can, and writes the values that leave the host — routed to
another slice, or fetched by the client — to shared memory for the sidecar.
A host's shards that follow each other in the value's C order (a value split
by rows) leave as one piece, written once into one warm file; on the same
machine that file becomes the consumer's value as it is. A small routed piece
(`transfer.moves_inline`) leaves as bytes in the message, with no file. Routed
values up to `WITH_COMPLETION_BYTES` leave in the same message as their
computation's completion, ahead of it.
What it learns on the way (a computation failed after dispatch, a fetch that
releases its value was written) goes back to the machine as a stimulus.

A batch the executor thread hands over may be finished on that thread instead
(`claim`, then `finish_claimed`): one that waits for nothing (every output is
ready), writes nothing out and reports nothing back, with no job queued before
it. Jobs put meanwhile wait for it, so jobs are still carried out in the order
given. Waking this thread for such a batch cost more than finishing it: the
two threads took turns at the GIL on every computation of a chain of small
ones (a 128-computation chain of tiny adds on 2 cores, timed outside the bench:
64 µs per computation handed over, 54 µs finished on the executor thread).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from pathways_wire import pathways_pb2 as pb
from pathways_wire.transfer import Piece, moves_inline, piece_runs, run_block, value_pieces
from pathways_worker.shared_memory import ShmDir, remove
from pathways_worker.worker.instructions import Export, FinishBatch, Finished
from pathways_worker.worker.object_store import ObjectId, object_name
from pathways_worker.worker.outbox import WorkerOutbox
from pathways_worker.worker.stimuli import BatchFinished, ComputationFailedLate, ExportWritten, Stimulus

log = logging.getLogger(__name__)


class Finisher:
    def __init__(
        self,
        host_name: str,
        host_index: int,
        shm: ShmDir,
        outbox: WorkerOutbox,
        report: Callable[[Stimulus], None],
    ) -> None:
        self.host_name, self.host_index = host_name, host_index
        self._shm, self._outbox, self._report = shm, outbox, report
        self._jobs: queue.SimpleQueue[FinishBatch | Export | None] = queue.SimpleQueue()
        self._pending_lock = threading.Lock()
        self._claims_done = threading.Condition(self._pending_lock)
        self._pending = 0
        self._queued = 0   # jobs put or claimed and not yet carried out
        self._claimed = 0  # batches claimed by another thread and not yet finished there
        self._thread = threading.Thread(target=self._loop, name="finisher", daemon=True)
        self._thread.start()

    def put(self, job: FinishBatch | Export) -> None:
        with self._pending_lock:
            self._queued += 1
            if isinstance(job, FinishBatch):
                self._pending += len(job.grants)
        self._jobs.put(job)

    def claim(self, batch: FinishBatch) -> bool:
        """Whether the calling thread may finish `batch` itself (`finish_claimed`),
        rather than `put` it: nothing is queued before it, every output is ready, no
        value leaves with it and no `BatchFinished` goes back. Once claimed, it must
        be finished; jobs put meanwhile wait for it."""
        if batch.report or any(f.routed for f in batch.grants):
            return False
        if not all(is_ready(x) for f in batch.grants for x in f.outputs):
            return False
        with self._pending_lock:
            if self._queued:
                return False
            self._queued += 1
            self._claimed += 1
            self._pending += len(batch.grants)
        return True

    def finish_claimed(self, batch: FinishBatch) -> None:
        """Finishes a claimed batch on the calling thread, which must hold no lock
        a stimulus (`report`) takes."""
        try:
            self._finish(batch.grants, ready=True)
        finally:
            with self._pending_lock:
                self._queued -= 1
                self._claimed -= 1
                self._claims_done.notify_all()

    @property
    def pending(self) -> int:
        """Grants handed over whose completions are not yet in the outbox."""
        return self._pending

    def _count(self, change: int) -> None:
        with self._pending_lock:
            self._pending += change

    def stop(self) -> None:
        self._jobs.put(None)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._claims_done:
                self._claims_done.wait_for(lambda: not self._claimed)  # put after a claimed batch
            try:
                if isinstance(job, FinishBatch):
                    self._finish(job.grants)
                    if job.report:
                        self._report(BatchFinished(tuple(f.grant for f in job.grants)))
                else:
                    self._write(job)
            except Exception:
                log.exception("finisher failed on %s", job)
            finally:
                with self._pending_lock:
                    self._queued -= 1

    def _finish(self, grants: tuple[Finished, ...], ready: bool = False) -> None:
        """One batch of grants: wait for each, report them together.

        What finished is reported before waiting on a computation still
        running, so a long computation never holds back the completions (and
        the window room) of those before it. Each completion is counted off
        `pending` as it reaches the outbox; those that never do (an error midway)
        once the batch is given up. `ready`: every output is known to exist (a
        claimed batch), so none is waited for before the others are reported."""
        done: list[pb.Completion] = []
        in_done = 0  # grants `done` stands for: a run of them is one completion (`grant_runs`)
        ends_call = False
        given = 0
        # the run of grants the last completion in `done` stands for (`grant_runs`), while
        # the next one may join it: its count is written into the message when the run ends,
        # not read and written back per grant (a protobuf field costs more than a local)
        run_call, run_next, run_count = "", -1, 0

        def give(exported: list[pb.Exported] | None = None) -> None:
            """`done` to the outbox (with `exported`, in one event that goes at once), off
            `pending` first: the outbox asks it whether more are coming."""
            nonlocal given, in_done, run_next, run_count
            if run_count > 1:
                done[-1].count = run_count
            run_next, run_count = -1, 0
            self._count(-in_done)
            given += in_done
            in_done = 0
            if exported is None:
                self._outbox.completions(done, ends_call)
            else:
                self._outbox.finished(done, exported)

        try:
            for job in grants:
                grant = job.grant
                error = job.error
                if not error and job.outputs:
                    if done and not ready and not all(is_ready(x) for x in job.outputs):
                        give()
                        done, ends_call = [], False
                    try:
                        wait_until_ready(job.outputs)
                    except Exception as err:
                        error = (
                            f"{job.label or f'computation {grant.node}'} of call {grant.call_id} failed "
                            f"on host {self.host_name}: {type(err).__name__}: {err}"
                        )
                        self._report(ComputationFailedLate(grant, job.outputs, error))
                in_done += 1
                ends_call = ends_call or job.ends_call
                if not error and not job.inline and grant.seq == run_next and grant.call_id == run_call:
                    run_count += 1
                    run_next += 1
                else:
                    if run_count > 1:
                        done[-1].count = run_count
                    completion = pb.Completion(
                        seq=grant.seq, call_id=grant.call_id, node=grant.node, ok=not error, error=error,
                    )
                    if not error:
                        for i in job.inline:
                            completion.outputs.add(
                                value=pb.ValueRef(node=grant.node, index=i),
                                spec=spec_of(job.outputs[i]),
                                data=np.ascontiguousarray(whole(job.outputs[i])).tobytes(),
                            )
                    done.append(completion)
                    if error or job.inline:  # a run only of grants that succeeded with nothing inline
                        run_next, run_count = -1, 0
                    else:
                        run_call, run_next, run_count = grant.call_id, grant.seq + 1, 1
                if not job.routed:
                    continue
                exports = [
                    Export(ObjectId(grant.call_id, r.ref), 0, None if error else r.value, error, r.declared,
                           release=False)
                    for r in job.routed
                ]
                if exports_with_completion([_nbytes(e.value) for e in exports]):
                    give([self._exported(e) for e in exports])
                else:
                    give()
                    for export in exports:
                        self._write(export)
                done, ends_call = [], False
            if done:
                give()
        finally:
            if given < len(grants):
                self._count(given - len(grants))

    def _write(self, job: Export) -> None:
        """A value's pieces to shared memory, announced to the sidecar (or why there are none)."""
        self._outbox.exported(self._exported(job))
        if job.release:
            self._report(ExportWritten(job.oid))

    def _exported(self, job: Export) -> pb.Exported:
        """A value's pieces written out (to shared memory, or inline when small)."""
        spec = spec_of(job.value) if job.value is not None else job.declared or pb.TensorSpec()
        exported = pb.Exported(call_id=job.oid.call_id, token=job.token, spec=spec)
        exported.value.node, exported.value.index = job.oid.ref
        error = job.error
        if not error and job.value is not None:
            try:
                pieces = self._pieces(job.value)
                bounds = [(p.start, p.stop) for p in pieces]
                for run in piece_runs(tuple(spec.shape), bounds):
                    start, stop = run_block(bounds, run)
                    nbytes = sum(pieces[i].data.nbytes for i in run)
                    piece = pb.Piece(start=start, stop=stop, nbytes=nbytes)
                    if job.token == 0 and moves_inline(nbytes):
                        piece.data = b"".join(pieces[i].data.tobytes() for i in run)
                    else:
                        piece.path = self._shm.write_run([pieces[i] for i in run])
                    exported.pieces.append(piece)
            except Exception as err:
                for p in exported.pieces:
                    remove(p.path)
                del exported.pieces[:]
                error = (
                    f"{object_name(job.oid)} could not be exported from "
                    f"host {self.host_name}: {type(err).__name__}: {err}"
                )
        exported.error = error
        return exported

    def _pieces(self, value: Any) -> list[Piece]:
        if isinstance(value, np.ndarray) and self.host_index != 0:
            return []  # every host of the slice holds it whole; host 0 answers for all
        return value_pieces(value)


WITH_COMPLETION_BYTES = 4 << 20
"""Routed values up to this size in all are written before their computation's
completion is reported, and leave in the same message: a millisecond of
writing to shared memory at most."""


def exports_with_completion(nbytes: list[int]) -> bool:
    """Whether a computation's routed values leave in the same event as its
    completion, ahead of it, rather than after it. A consumer on another slice
    waits for them, while the controller only counts the completion: for small
    values one message carrying both spares the consumer a message's wait (a
    1 MiB move's export reached its sidecar about 0.3 ms sooner). A larger
    value's write takes long enough that the completion goes first, so the
    controller's count (and the slice's window) does not wait for it."""
    return sum(nbytes) <= WITH_COMPLETION_BYTES


def _nbytes(value: Any) -> int:
    return int(value.nbytes) if value is not None else 0


def spec_of(value: Any) -> pb.TensorSpec:
    return pb.TensorSpec(shape=list(value.shape), dtype=np.dtype(value.dtype).name)


def whole(value: Any) -> np.ndarray:
    """A value this host holds whole as one array: on a multi-process slice, one
    of its replicas (the others live on other hosts, which numpy cannot reach)."""
    if getattr(value, "is_fully_addressable", True):
        return np.asarray(value)
    return np.asarray(value.addressable_data(0))


def wait_until_ready(values: tuple[Any, ...]) -> None:
    """`jax.block_until_ready` for a flat tuple, without its pytree walk; raises what
    the computation that made them raised."""
    for value in values:
        block = getattr(value, "block_until_ready", None)
        if block is not None:
            block()


def is_ready(value: Any) -> bool:
    """Whether a jax.Array has been computed (anything else always has)."""
    ask = getattr(value, "is_ready", None)
    return bool(ask()) if ask is not None else True
