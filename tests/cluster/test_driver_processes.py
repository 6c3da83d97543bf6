"""Program drivers as child processes of the operator (``--driver-runtime processes``).

The design before driver pods, kept for comparisons (experiment 9 of ``make bench`` times
it against driver pods): each program's driver runs as a child process of the operator,
and no pod is made for it. An operator of child-process drivers serves no calls port (the
port checks the tokens of driver pods), so its drivers call over gRPC.
"""

from __future__ import annotations

import pytest

from pathways_wire.kube_names import DRIVER_LABEL
from tests.cluster.harness import Objects, OperatorProcess, driver_runtime
from tests.cluster.test_operator import PROGRAM_DONE_S, apply_example, results


@pytest.fixture(scope="module")
def operator_args() -> tuple[str, ...]:
    return ("--driver-runtime", "processes")


def test_driver_runtime_is_read_from_the_operators_flags() -> None:
    assert driver_runtime(()) == "pods"
    assert driver_runtime(("--driver-runtime", "processes")) == "processes"
    assert driver_runtime(("--state-dir", "x", "--driver-runtime=processes")) == "processes"


@pytest.mark.timeout(300, func_only=True)
def test_paper_example_runs_in_a_child_process_of_the_operator_with_its_results(
    objects: Objects, operator: OperatorProcess
) -> None:
    name = apply_example(objects, "paper-example.yaml")
    done = objects.wait_program(name, {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert results(objects, done) == {"y": [3.0, 5.0], "z": [2.0, 4.0]}
    assert objects.pods(f"{DRIVER_LABEL}={name}") == [], "a child-process driver makes no pod"
