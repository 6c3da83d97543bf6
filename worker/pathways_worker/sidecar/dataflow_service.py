"""The faces of the sidecar (`Dataflow`): its gRPC service, each RPC a few lines over
`Dataflow`, and the controller's stream as frames on the control port (`ControlFrames`)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire import session_frames as frames
from pathways_worker.sidecar.dataflow import Dataflow, HostError

log = logging.getLogger(__name__)

TAKE_S = 0.25
"""How long a stream waits for completions before it looks whether it is still the current one."""
GRPC_THREADS = 32
"""The sidecar's gRPC server threads: each RPC holds one while it runs."""
MAX_VALUE_STREAMS = 16
"""`Put` and `Fetch` calls served at once. Each holds a thread for as long as its caller
streams or its value is awaited (a fetch up to `dataflow.MAX_FETCH_TIMEOUT_S`), and clients
and peers may call them at will, so they get half the threads: the controller's `Control`,
`Health` and `Coordinator` always find one. Past the bound a call is refused at once as
RESOURCE_EXHAUSTED; clients put and fetch over the data channel, which holds no such thread."""


class DataflowService(pb_grpc.DataflowServicer):
    def __init__(
        self, core: Dataflow, max_value_streams: int = MAX_VALUE_STREAMS,
        holds_token: Callable[[Any], bool] = lambda metadata: False,
    ) -> None:
        """`holds_token(metadata)`: whether a call presents the slice's token or its client
        form (`slice_auth.SliceTokenInterceptor.holds_token`); only such a caller of the open
        `Health` learns more than that the host lives."""
        self._core = core
        self._holds_token = holds_token
        self._value_streams = threading.BoundedSemaphore(max_value_streams)
        self._max_value_streams = max_value_streams

    def _value_stream(self, context: grpc.ServicerContext, method: str) -> None:
        """Takes one of the `Put`/`Fetch` places, or refuses the call (`MAX_VALUE_STREAMS`)."""
        if not self._value_streams.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, (
                f"host {self._core.host_name}: {method} refused: {self._max_value_streams} Put and Fetch calls "
                "are served here already; retry once one ends, or put and fetch over the data channel"
            ))

    def Control(
        self, request_iterator: Iterator[pb.HostCommand], context: grpc.ServicerContext
    ) -> Iterator[pb.HostEvent]:
        """The controller's stream. Where the sidecar offers its control port, the stream
        sends no completion before the controller's first command (`attach`, or any other):
        one that moves to the port sends none, and this stream ends when the port's
        session replaces it."""
        core = self._core
        me = core.open_control()
        attached = threading.Event()
        if not core.control_port:
            attached.set()

        def read() -> None:
            try:
                for command in request_iterator:
                    if not core.is_current(me):
                        return
                    attached.set()  # a controller that sends commands stays on this stream
                    if command.WhichOneof("command") == "attach":
                        continue
                    try:
                        core.command(command)
                    except Exception:
                        log.exception("control command %s failed", command.WhichOneof("command"))
            except Exception as err:  # the controller went away
                log.info("control stream %d ended: %s", me, err)

        threading.Thread(target=read, name=f"control-{me}", daemon=True).start()
        log.info("control stream %d opened", me)
        yield pb.HostEvent(hello_host=core.advertise, control_port=core.control_port)
        while not attached.wait(TAKE_S):
            if not context.is_active() or not core.is_current(me):
                return
        while context.is_active() and core.is_current(me):
            completions = core.take_completions(TAKE_S, me)
            if not completions:
                continue
            if not core.is_current(me):
                core.upstream.put_many(completions)  # the new stream sends them
                return
            yield pb.HostEvent(completions=completions)

    def Put(self, request_iterator: Iterator[pb.BufferChunk], context: grpc.ServicerContext) -> pb.PutReply:
        self._value_stream(context, "Put")
        try:
            return pb.PutReply(pieces=self._core.put(request_iterator))
        except HostError as err:
            context.abort(err.code, str(err))
        finally:
            self._value_streams.release()

    def Fetch(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> Iterator[pb.BufferChunk]:
        self._value_stream(context, "Fetch")
        try:
            try:
                chunks = self._core.fetch(request)
            except HostError as err:
                context.abort(err.code, str(err))
            yield from chunks
        finally:
            self._value_streams.release()

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        """Open to every caller (probes, the operator's watch of a forming gang), but only a
        holder of the slice's token learns where the host's data channel is, what its stores
        hold and which machine it is on (`HealthReply.detailed`)."""
        reply = self._core.health(request.wait_ready_s)
        if self._holds_token(context.invocation_metadata()):
            reply.detailed = True
            return reply
        return pb.HealthReply(host=reply.host, worker_ready=reply.worker_ready)

    def Coordinator(self, request: pb.CoordinatorRequest, context: grpc.ServicerContext) -> pb.CoordinatorReply:
        try:
            self._core.tell_coordinator(request.address)
        except HostError as err:
            context.abort(err.code, str(err))
        return pb.CoordinatorReply()


class ControlFrames:
    """The controller's stream on the sidecar's control port (`session_frames.SessionPort`):
    commands read and carried out on the connection's thread, completions written by a
    thread of its own, or by the worker link's thread that received them
    (`Dataflow.attach_control`)."""

    def __init__(self, core: Dataflow) -> None:
        self._core = core

    def serve(self, conn: socket.socket, stream: BinaryIO, peer: str) -> None:
        core = self._core
        me = core.open_control()
        log.info("control stream %d opened on the control port from %s", me, peer)
        ended = threading.Event()
        write: Callable[[pb.HostEvent], None] = frames.shared_writer(conn, frames.EVENT)
        writer = threading.Thread(target=self._write, args=(write, conn, me, ended), name=f"control-{me}-out",
                                  daemon=True)
        try:
            write(pb.HostEvent(hello_host=core.advertise, control_port=core.control_port))
            writer.start()
            core.attach_control(me, write)
            command = pb.HostCommand()
            while frames.read_message(stream, frames.COMMAND, command):
                if not core.is_current(me):
                    return
                try:
                    core.command(command)
                except Exception:
                    log.exception("control command %s failed", command.WhichOneof("command"))
                command = pb.HostCommand()
        except (OSError, ValueError) as err:
            log.info("control stream %d on the control port ended: %s", me, err)
        finally:
            core.detach_control(write)
            ended.set()
            if writer.is_alive():
                writer.join(2 * TAKE_S)

    def _write(
        self, write: Callable[[pb.HostEvent], None], conn: socket.socket, me: int, ended: threading.Event
    ) -> None:
        """Completions, a frame per batch, until the stream is replaced or its connection
        ends; a failed write ends the connection and leaves its batch to the next stream.
        The worker link's thread writes completions too (`Dataflow.attach_control`), with
        the same `write`."""
        core = self._core
        while not ended.is_set() and core.is_current(me):
            completions = core.take_completions(TAKE_S, me, sending=True)
            if not completions:
                continue
            try:
                write(pb.HostEvent(completions=completions))
            except OSError as err:
                core.upstream.put_many(completions)
                log.info("control stream %d: sending on the control port failed: %s", me, err)
                frames.shut(conn)
                return
            finally:
                core.upstream.sent()
