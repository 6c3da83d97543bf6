"""A program's slices are admitted together or not at all, as Kueue admits a workload.

The test cluster has two islands of 8 devices. Program ``first`` takes 8 devices of
island-a and 4 of island-b; program ``second`` asks for the same. While ``first`` runs,
``second``'s island-b slice would fit in the 4 free devices, but its island-a slice does
not: neither is admitted, no pod of ``second`` exists, and the island-b slice says which
slice of its group it waits for. When ``first`` is done, ``second`` runs; both succeed.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.builders import inline_slice, program
from tests.cluster.harness import Objects, OperatorProcess, condition

PROGRAM_DONE_S = 240.0


def _two_slice_program(name: str, steps: int) -> dict[str, Any]:
    return program(
        name, "examples.programs:paper_example",
        inline_slice("main", 8, island="island-a"), inline_slice("aux", 4, island="island-b"),
        steps=steps, args={"step_seconds": 0.5},
    )


def group_of_second(objects: Objects) -> str:
    return str(objects.program("second")["metadata"]["uid"])


@pytest.mark.timeout(600, func_only=True)
def test_competing_programs_are_admitted_whole_in_turn(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(_two_slice_program("first", steps=40))

    def running() -> bool:
        status = objects.program("first").get("status") or {}
        return status.get("phase") == "Running" and status.get("stepsCompleted", 0) >= 1

    objects.cluster.poll(running, timeout=PROGRAM_DONE_S, interval=0.5, what="program first running")
    first_main = objects.slice("first-main")
    group = first_main["metadata"]["labels"]["pathways.dev/admission-group"]
    assert group == objects.program("first")["metadata"]["uid"]
    assert first_main["metadata"]["annotations"]["pathways.dev/admission-group-size"] == "2"

    objects.apply(_two_slice_program("second", steps=4))

    def both_waiting() -> dict[str, dict[str, Any]] | None:
        found = {n: objects.get("virtualslices", f"second-{n}") or {} for n in ("main", "aux")}
        if not all((s.get("status") or {}).get("conditions") for s in found.values()):
            return None
        reasons = {n: condition(s, "Admitted")["reason"] for n, s in found.items()}
        return found if reasons == {"main": "InsufficientDevices", "aux": "AdmissionGroupWaiting"} else None

    waiting = objects.cluster.poll(both_waiting, timeout=60, interval=0.5, what="second's slices both waiting")
    assert objects.program("first")["status"]["phase"] == "Running", "checked while first holds its devices"
    ns = objects.namespace
    aux = condition(waiting["aux"], "Admitted")["message"]
    assert aux.startswith(f"slice '{ns}/second-aux' holds no devices until its whole admission group "
                          f"'{group_of_second(objects)}' (2 slices) fits: slice '{ns}/second-main' needs 8 devices"), aux
    main = condition(waiting["main"], "Admitted")["message"]
    assert "is admitted whole or not at all" in main, main
    for name in ("second-main", "second-aux"):
        assert objects.pods(f"pathways.dev/slice={name}") == [], f"{name} holds no pods while its group waits"
        assert objects.slice(name)["status"]["phase"] == "Pending"

    for name in ("first", "second"):
        done = objects.wait_program(name, {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
        assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
