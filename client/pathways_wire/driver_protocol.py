"""What a program's driver and the process that runs it agree on.

The driver (``python -m pathways.driver``) runs a user's program and reports through its
exit status, a progress file and a results file; the operator, or ``pw.launch`` in the
embedded runtime, reads them. Each run also says where it starts, in its log before the
entrypoint runs (:class:`RunStart`): a resumed program names the step it continues
from and the snapshot it restored, so ``pathways logs program`` (and a test) can tell a
resume from a rerun from step 0, which deterministic programs would not show. Both sides take the numbers and names from here, so a
status the driver means as "run me again" is never read as a failure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1
"""The program failed (raised, or its results cannot be stored): it is not run again."""
EXIT_BAD_PROGRAM = 2
"""A bad entrypoint or bad arguments."""
EXIT_RETRYABLE = 75
"""A host or slice was lost: run the driver again, from its last snapshot (``EX_TEMPFAIL``)."""

PROGRESS_FILE = "progress.jsonl"
"""One JSON object a line, ``{"step": N, ...}`` for each step done."""

DRIVER_LOG_KEY = "driver.log"
"""Key of the driver's log in its ConfigMap (see :func:`driver_log_config_map`)."""


def driver_log_config_map(program: str) -> str:
    """The ConfigMap where the operator keeps a finished program's driver log, owned by the program."""
    return f"{program}-driver-log"


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
