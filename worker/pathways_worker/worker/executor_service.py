"""The gRPC face of the executor: one `Executor.Session` stream from the sidecar.

Commands are applied by a reader thread in arrival order; the response stream
sends the first event (`ready`, the host's name) and then whatever the
executor's outbox accumulated, one batch per message. A new session (the
sidecar reconnected) replaces the old one; the executor's state survives it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_worker.worker.executor import Executor

log = logging.getLogger(__name__)


class ExecutorService(pb_grpc.ExecutorServicer):
    def __init__(self, executor: Executor, host_name: str) -> None:
        self._executor = executor
        self._host_name = host_name
        self._lock = threading.Lock()
        self._session = 0

    def Session(
        self, request_iterator: Iterator[pb.WorkerCommand], context: grpc.ServicerContext
    ) -> Iterator[pb.WorkerEvent]:
        with self._lock:
            self._session += 1
            me = self._session
        threading.Thread(
            target=self._read, args=(me, request_iterator), name=f"session-{me}", daemon=True
        ).start()
        log.info("sidecar session %d opened", me)
        first = self._executor.outbox.stats_event()
        first.ready, first.host = True, self._host_name
        yield first
        while context.is_active() and self._session == me:
            event = self._executor.outbox.take_event(0.25)
            if event is not None:
                yield event

    def _read(self, me: int, commands: Iterator[pb.WorkerCommand]) -> None:
        try:
            for command in commands:
                if self._session != me:
                    return
                try:
                    self._executor.handle(command)
                except Exception:
                    log.exception("command %s failed", command.WhichOneof("command"))
        except Exception as err:  # the stream ended under us
            log.info("sidecar session %d ended: %s", me, err)
