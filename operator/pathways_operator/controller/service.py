"""The Controller gRPC service: a thin skin over `Controller`, whatever its gangs' runtime."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any

import grpc

from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_operator.controller.controller import Controller
from pathways_operator.controller.errors import ControllerError
from pathways_operator.controller.gangs import Gangs
from pathways_operator.controller.host_link import GRPC_OPTIONS

SERVER_THREADS = 512
"""Threads that may serve the controller's RPCs at once. Each call a client has
outstanding holds one for its `WaitCall` until the call ends (up to
`PATHWAYS_MAX_OUTSTANDING_CALLS`, 32, per client), so this many let 15 clients at
their bound leave room for everyone's `Run`, `KeepAlive` and `DropObjects`. With
32, one client at its bound held every thread: another client's one-computation
call, 5 ms alone, took 77 ms to 4.9 s while the first client's 32 calls ran (timed
outside the bench; `tests/integration/test_client_waits.py` checks the order). The
pool starts threads as they are needed, and a waiting one sleeps on its own
call's condition (`CallRecord.ended`)."""


def controller_server(interceptors: Sequence[grpc.ServerInterceptor[Any, Any]] = ()) -> grpc.Server:
    """The gRPC server the controller's service is added to."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=SERVER_THREADS, thread_name_prefix="controller-rpc"),
        options=GRPC_OPTIONS, interceptors=list(interceptors),
    )


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(self, controller: Controller[Gangs]) -> None:
        self.controller = controller
        self.controller_id = uuid.uuid4().hex
        """Told in `Describe`: a client that finds another after an outage places and loads again."""
        self.calls_port = 0
        """Told in `Describe`: the port of `calls_port.CallsPort`, where one serves this service."""

    @staticmethod
    def _abort(context: grpc.ServicerContext, err: ControllerError) -> None:
        context.abort(getattr(grpc.StatusCode, err.code), str(err))

    def CreateSlice(self, request: pb.CreateSliceRequest, context: grpc.ServicerContext) -> pb.SliceInfo:
        try:
            return self.controller.create_slice(
                ir.SliceDecl.from_proto(request.spec),
                request.client,
                request.timeout_s or 180.0,
                request.namespace,
            )
        except ControllerError as err:
            self._abort(context, err)
            raise

    def ReleaseSlice(
        self, request: pb.ReleaseSliceRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseSliceReply:
        self.controller.release_slice(request.slice_id, request.client)
        return pb.ReleaseSliceReply()

    def LoadProgram(
        self, request: pb.LoadProgramRequest, context: grpc.ServicerContext
    ) -> pb.LoadProgramReply:
        try:
            program = ir.Program.from_proto(request.program)
            return pb.LoadProgramReply(
                program_id=self.controller.load_program(program, dict(request.bindings))
            )
        except ControllerError as err:
            self._abort(context, err)
            raise

    def Run(self, request: pb.RunRequest, context: grpc.ServicerContext) -> pb.RunReply:
        if request.drop:  # objects the client let go of: never this call's inputs, which it holds
            self.controller.calls.drop_objects(request.client, request.drop)
        try:
            if request.wait:
                return self.controller.calls.run_to_end(
                    request.program_id, request.call_id, request.weight, request.inputs,
                    request.wait_s, request.client, request.keep,
                )
            return self.controller.calls.run(
                request.program_id, request.call_id, request.weight, request.inputs,
                request.objects, request.client,
            )
        except ControllerError as err:
            self._abort(context, err)
            raise

    def run_then(self, request: pb.RunRequest, answer: Callable[[pb.RunReply], None]) -> None:
        """`Run` with `wait`, whose reply goes to `answer` once the call ended, from the
        thread that ended it (`Calls.run_to_end_then`); a call that cannot start raises
        ControllerError here."""
        if request.drop:
            self.controller.calls.drop_objects(request.client, request.drop)
        self.controller.calls.run_to_end_then(
            request.program_id, request.call_id, request.weight, request.inputs, request.wait_s,
            request.client, answer, request.keep,
        )

    def wait_call_then(self, request: pb.CallStatusRequest, answer: Callable[[pb.CallStatus], None]) -> None:
        """`WaitCall`, whose status goes to `answer` once the call ended or the wait is up."""
        self.controller.calls.wait_call_then(request.call_id, request.timeout_s, request.finish, request.keep, answer)

    def WaitCall(self, request: pb.CallStatusRequest, context: grpc.ServicerContext) -> pb.CallStatus:
        return self.controller.calls.wait_call(
            request.call_id, request.timeout_s, request.finish, request.keep
        )

    def FinishCall(self, request: pb.ReleaseCall, context: grpc.ServicerContext) -> pb.CallStatus:
        return self.controller.calls.finish_call(request.call_id, request.keep)

    def DropObjects(
        self, request: pb.DropObjectsRequest, context: grpc.ServicerContext
    ) -> pb.DropObjectsReply:
        self.controller.calls.drop_objects(request.client, request.objects)
        return pb.DropObjectsReply()

    def KeepAlive(self, request: pb.KeepAliveRequest, context: grpc.ServicerContext) -> pb.KeepAliveReply:
        return pb.KeepAliveReply(lease_s=self.controller.calls.keep_alive(request.client, time.monotonic()))

    def Describe(self, request: pb.ClusterInfoRequest, context: grpc.ServicerContext) -> pb.ClusterInfo:
        info = self.controller.describe()
        info.controller_id = self.controller_id
        info.calls_port = self.calls_port
        return info

    def ReportProgress(self, request: pb.ProgressReport, context: grpc.ServicerContext) -> pb.ProgressReply:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      "ReportProgress: this controller runs no driver pods; only the operator's takes reports")
        raise AssertionError("unreachable")

    def ReportResult(self, request: pb.ResultReport, context: grpc.ServicerContext) -> pb.ResultReply:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      "ReportResult: this controller runs no driver pods; only the operator's takes reports")
        raise AssertionError("unreachable")

    def ReportStart(self, request: pb.RunStartReport, context: grpc.ServicerContext) -> pb.ResultReply:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      "ReportStart: this controller runs no driver pods; only the operator's takes reports")
        raise AssertionError("unreachable")
