"""Where a driver reports its steps and its outcome: files, or the controller.

A driver the operator runs in its own pod has no API credentials and shares no
filesystem with the operator, so it reports to the controller it already talks to:
``ReportProgress`` after each step (the reply says whether a suspend was asked for,
which is how a pod, that no signal of the operator reaches, learns it) and
``ReportResult`` just before it exits, each presenting the program's token
(:data:`pathways_wire.driver_protocol.CLIENT_TOKEN_METADATA`). A driver started as
a child process (``pw.launch``-like use, the embedded runtime's tests) writes the same
facts into a progress file and a results file instead.

Both reporters take an outcome as the payload the operator stores in its results file:
``{"results": {...}}``, ``{"error": text, "retryable": bool, "logTail": text}`` or
``{"suspended": true, "stepsCompleted": n}``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.driver_protocol import CLIENT_TOKEN_METADATA, PROGRAM_METADATA, RunStart, result_report

REPORT_TIMEOUT_S = 30.0
"""Deadline of one report; the controller answers at once, so only a lost controller hits it."""


class Reporter(Protocol):
    """Where ``ctx.step_done`` and the driver's exit report to."""

    def step(self, step: int, metrics: Mapping[str, float | int | str]) -> None: ...

    def outcome(self, payload: Mapping[str, Any]) -> None: ...

    def started(self, run: RunStart) -> None: ...


class FileReporter:
    """A progress file (one JSON line per step) and a results file (written once, atomically)."""

    def __init__(self, progress_file: Path, results_file: Path | None = None) -> None:
        self.progress_file = progress_file
        self.results_file = results_file

    def step(self, step: int, metrics: Mapping[str, float | int | str]) -> None:
        line = {"step": int(step), "metrics": dict(metrics), "time": time.time()}
        with open(self.progress_file, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
            out.flush()

    def started(self, run: RunStart) -> None:
        """A child process's output is its log: the line it prints says it all."""

    def outcome(self, payload: Mapping[str, Any]) -> None:
        if self.results_file is None:
            return
        tmp = self.results_file.with_name(self.results_file.name + ".tmp")
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, self.results_file)


class ControllerReporter:
    """``ReportProgress`` / ``ReportResult`` to the controller, as the program whose token we hold.

    A reply asking for a suspend sets ``suspend_event``: the step loop stops at this boundary.
    A controller that is away (its operator restarting) is asked again for up to
    ``reconnect_s``; so is one that does not know the token yet (a new operator learns it
    from the program's Secret, named by the report).
    """

    def __init__(
        self, address: str, token: str, suspend_event: threading.Event, program: tuple[str, str],
        reconnect_s: float = 0.0,
    ) -> None:
        self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.ControllerStub(self._channel)
        self._metadata = ((CLIENT_TOKEN_METADATA, token), (PROGRAM_METADATA, f"{program[0]}/{program[1]}"))
        self._suspend = suspend_event
        self._program = pb.ProgramRef(namespace=program[0], name=program[1])
        self._reconnect_s = reconnect_s

    def step(self, step: int, metrics: Mapping[str, float | int | str]) -> None:
        numbers = {k: float(v) for k, v in metrics.items() if not isinstance(v, str)}
        report = pb.ProgressReport(step=int(step), metrics=numbers, program=self._program)
        reply = self._call(self._stub.ReportProgress, report)
        if reply.suspend:
            self._suspend.set()

    def started(self, run: RunStart) -> None:
        report = pb.RunStartReport(step=run.step, restored=run.snapshot is not None, snapshot=run.snapshot or 0,
                                   program=self._program)
        self._call(self._stub.ReportStart, report)

    def outcome(self, payload: Mapping[str, Any]) -> None:
        report = result_report(payload)
        report.program.CopyFrom(self._program)
        self._call(self._stub.ReportResult, report)

    def _call(self, method: Any, request: Any) -> Any:
        deadline = time.monotonic() + self._reconnect_s
        while True:
            try:
                return method(request, metadata=self._metadata, timeout=REPORT_TIMEOUT_S)
            except grpc.RpcError as err:
                again = err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
                if not again or time.monotonic() >= deadline:
                    raise
            time.sleep(0.5)

    def close(self) -> None:
        self._channel.close()
