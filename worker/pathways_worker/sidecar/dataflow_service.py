"""The gRPC face of the sidecar (`Dataflow`): each RPC is a few lines over `Dataflow`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_worker.sidecar.dataflow import Dataflow, HostError

log = logging.getLogger(__name__)


class DataflowService(pb_grpc.DataflowServicer):
    def __init__(self, core: Dataflow) -> None:
        self._core = core

    def Control(
        self, request_iterator: Iterator[pb.HostCommand], context: grpc.ServicerContext
    ) -> Iterator[pb.HostEvent]:
        core = self._core
        me = core.open_control()

        def read() -> None:
            try:
                for command in request_iterator:
                    if not core.is_current(me):
                        return
                    try:
                        core.command(command)
                    except Exception:
                        log.exception("control command %s failed", command.WhichOneof("command"))
            except Exception as err:  # the controller went away
                log.info("control stream %d ended: %s", me, err)

        threading.Thread(target=read, name=f"control-{me}", daemon=True).start()
        log.info("control stream %d opened", me)
        yield pb.HostEvent(hello_host=core.advertise)
        while context.is_active() and core.is_current(me):
            completions = core.take_completions(0.25)
            if not completions:
                continue
            if not core.is_current(me):
                core.upstream.put_many(completions)  # the new stream sends them
                return
            yield pb.HostEvent(completions=completions)

    def Put(self, request_iterator: Iterator[pb.BufferChunk], context: grpc.ServicerContext) -> pb.PutReply:
        try:
            return pb.PutReply(pieces=self._core.put(request_iterator))
        except HostError as err:
            context.abort(err.code, str(err))

    def Fetch(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> Iterator[pb.BufferChunk]:
        try:
            chunks = self._core.fetch(request)
        except HostError as err:
            context.abort(err.code, str(err))
        yield from chunks

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        return self._core.health()
