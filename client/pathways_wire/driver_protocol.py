"""What a program's driver and the operator that runs it agree on.

The driver (``python -m pathways.driver``) runs a user's program and reports through its
exit status and, in its own pod, through the controller's ``ReportProgress`` and
``ReportResult`` calls, presenting its program's token (metadata
:data:`CLIENT_TOKEN_METADATA`, read from the Secret ``<program>-driver-token`` mounted
at :data:`DRIVER_TOKEN_DIR`). The operator keeps what it reports in a progress file and
a results file, and reads them. Each run also says where it starts, in its log before the
entrypoint runs (:class:`RunStart`): a resumed program names the step it continues
from and the snapshot it restored, so ``pathways logs program`` (and a test) can tell a
resume from a rerun from step 0, which deterministic programs would not show. Both sides take the numbers and names from here, so a
status the driver means as "run me again" is never read as a failure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pathways_wire import pathways_pb2 as pb

EXIT_OK = 0
EXIT_FAILED = 1
"""The program failed (raised, or its results cannot be stored): it is not run again."""
EXIT_BAD_PROGRAM = 2
"""A bad entrypoint or bad arguments."""
EXIT_RETRYABLE = 75
"""A host or slice was lost: run the driver again, from its last snapshot (``EX_TEMPFAIL``)."""

CLIENT_TOKEN_METADATA = "x-pathways-client-token"
"""gRPC metadata on every call to the controller: the caller's client token (a driver's is its
program's token, good for that program's slices alone; the embedded runtime's client gets one
from the controller it starts)."""
PROGRAM_METADATA = "x-pathways-program"
"""gRPC metadata from a driver pod: ``namespace/program`` it runs, so that a controller that
restarted can check a token it has not seen against that program's Secret."""
ENV_PROGRAM = "PATHWAYS_PROGRAM"
"""A driver pod's program name (with ``PATHWAYS_NAMESPACE``: the ``x-pathways-program`` it sends)."""
CLIENT_TOKEN_FILE = "client.token"
"""The embedded controller's client token, a 0600 file in its state directory."""
DRIVER_TOKEN_KEY = "token"
"""Key of the token in the Secret ``<program>-driver-token``."""
DRIVER_TOKEN_DIR = "/var/run/pathways/driver"
"""Where the driver pod mounts that Secret."""
ENV_PROGRAM_TOKEN_FILE = "PATHWAYS_PROGRAM_TOKEN_FILE"
"""The file a client reads its program token from (a driver pod's mounted Secret)."""
COMPILED_PROGRAM_DIR = "/var/run/pathways/compiled-program"
"""Where a driver pod mounts a ``spec.source.configMapRef`` ConfigMap."""

START_LINE = "--- starting at step {step}: -m pathways.driver"
"""The first line of each run of a driver in its log: a driver pod prints it itself; for a
child-process driver the operator writes it (``k8s.drivers``). Log tails start after the last."""

PROGRESS_FILE = "progress.jsonl"
"""One JSON object a line, ``{"step": N, ...}`` for each step done."""
RESULTS_FILE = "results.json"
"""The outcome, written once (see :func:`result_report` for its forms)."""

DRIVER_LOG_KEY = "driver.log"
"""Key of the driver's log in its ConfigMap (see :func:`driver_log_config_map`)."""


def driver_log_config_map(program: str) -> str:
    """The ConfigMap where the operator keeps a finished program's driver log, owned by the program."""
    return f"{program}-driver-log"


def driver_pod_name(program: str) -> str:
    """The pod a program's driver runs in, owned by the program."""
    return f"{program}-driver"


def driver_token_secret(program: str) -> str:
    """The Secret holding a program's token, owned by the program and mounted into its driver pod."""
    return f"{program}-driver-token"


def steps_completed(progress_file: Path) -> int:
    """Steps recorded in a progress file: one more than the highest step done (0 if none)."""
    if not progress_file.exists():
        return 0
    done = 0
    for line in progress_file.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            done = max(done, step + 1)
    return done


def result_report(payload: Mapping[str, Any]) -> pb.ResultReport:
    """An outcome as the wire's ``ResultReport``.

    The outcome is the payload a results file holds: ``{"results": {...}}``,
    ``{"error": text, "retryable": bool, "badProgram": bool, "logTail": text}`` or
    ``{"suspended": true, "stepsCompleted": n}``.
    """
    if payload.get("suspended") is True:
        return pb.ResultReport(suspended_after=int(payload.get("stepsCompleted", 0)))
    if "results" in payload:
        return pb.ResultReport(results_json=json.dumps(payload["results"]))
    return pb.ResultReport(error=pb.DriverError(
        message=str(payload.get("error", "")),
        retryable=bool(payload.get("retryable")),
        bad_program=bool(payload.get("badProgram")),
        log_tail=str(payload.get("logTail", "")),
    ))


def outcome_payload(report: pb.ResultReport) -> dict[str, Any]:
    """A ``ResultReport`` back as the payload the results file holds; ValueError for bad results JSON."""
    kind = report.WhichOneof("outcome")
    if kind == "suspended_after":
        return {"suspended": True, "stepsCompleted": int(report.suspended_after)}
    if kind == "results_json":
        results = json.loads(report.results_json)
        if not isinstance(results, dict):
            raise ValueError("results_json must be a JSON object of result name -> value")
        return {"results": results}
    error = report.error
    return {"error": error.message or "the driver reported an error without a message",
            "retryable": error.retryable, "badProgram": error.bad_program, "logTail": error.log_tail}


@dataclass(frozen=True)
class RunStart:
    """Where one run of a driver began: its first step, and the snapshot it restored.

    ``snapshot`` is the step of the orbax snapshot the run restored (the number of
    steps done when it was written), or None when it restored none and starts from
    the steps its progress file records.
    """

    step: int
    snapshot: int | None

    @property
    def line(self) -> str:
        how = "no snapshot restored" if self.snapshot is None else f"restored the snapshot of step {self.snapshot}"
        return f"pathways.driver: starting at step {self.step} ({how})"


_RUN_START = re.compile(
    r"^pathways\.driver: starting at step (\d+) "
    r"\((?:no snapshot restored|restored the snapshot of step (\d+))\)$",
    re.MULTILINE,
)


def run_starts(log_text: str) -> list[RunStart]:
    """Every run's start in a driver log, oldest first."""
    return [
        RunStart(int(m.group(1)), None if m.group(2) is None else int(m.group(2)))
        for m in _RUN_START.finditer(log_text)
    ]
