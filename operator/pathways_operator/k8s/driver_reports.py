"""The controller's service as the operator serves it: the Controller calls, plus the drivers' reports.

A driver pod reports each completed step (``ReportProgress``) and how it ended
(``ReportResult``) through the controller it already talks to, presenting its
program's token; :class:`~pathways_operator.k8s.driver_pods.DriverPods` checks the
token and keeps the reports where the program reconciler reads them. A call without
a token, or with one of no running program, is refused with UNAUTHENTICATED, saying
which credential is missing.
"""

from __future__ import annotations

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire.driver_protocol import CLIENT_TOKEN_METADATA, RunStart, outcome_payload
from pathways_operator.controller import Controller, ControllerService, Gangs
from pathways_operator.k8s.driver_pods import DriverPods, UnknownProgramToken


def presented_token(context: grpc.ServicerContext) -> str:
    """The program token in the call's metadata ("" when none)."""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_TOKEN_METADATA:
            return str(value)
    return ""


class OperatorControllerService(ControllerService):
    """:class:`ControllerService` with the two calls only driver pods make."""

    def __init__(self, controller: Controller[Gangs], drivers: DriverPods | None) -> None:
        super().__init__(controller)
        self._drivers = drivers

    def _reports(self, context: grpc.ServicerContext) -> DriverPods:
        if self._drivers is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "this operator runs drivers as child processes (--driver-runtime processes); "
                          "they report through files, not this call")
            raise AssertionError("unreachable")
        return self._drivers

    def ReportProgress(self, request: pb.ProgressReport, context: grpc.ServicerContext) -> pb.ProgressReply:
        drivers = self._reports(context)
        try:
            suspend = drivers.report_progress(presented_token(context), request.step, dict(request.metrics),
                                              (request.program.namespace, request.program.name))
        except UnknownProgramToken as err:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"ReportProgress: {err}")
            raise
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ReportProgress: {err}")
            raise
        return pb.ProgressReply(suspend=suspend)

    def ReportResult(self, request: pb.ResultReport, context: grpc.ServicerContext) -> pb.ResultReply:
        drivers = self._reports(context)
        try:
            payload = outcome_payload(request)
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ReportResult: {err}")
            raise
        try:
            drivers.report_result(presented_token(context), payload,
                                  (request.program.namespace, request.program.name))
        except UnknownProgramToken as err:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"ReportResult: {err}")
            raise
        return pb.ResultReply()

    def ReportStart(self, request: pb.RunStartReport, context: grpc.ServicerContext) -> pb.ResultReply:
        drivers = self._reports(context)
        run = RunStart(int(request.step), int(request.snapshot) if request.restored else None)
        try:
            drivers.report_start(presented_token(context), run, (request.program.namespace, request.program.name))
        except UnknownProgramToken as err:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"ReportStart: {err}")
            raise
        return pb.ResultReply()
