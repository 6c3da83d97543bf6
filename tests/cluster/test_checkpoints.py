"""Checkpoints, suspend/resume and priorities against a real API server.

Each training test runs ``examples.programs:train_regression`` twice, side by side on
the two islands: once undisturbed (the reference), once suspended, recreated or
preempted mid-run with ``spec.checkpoint``. The disturbed run must end with exactly
the reference's weights and loss curve, and its driver's log must show that it restored
its state from an orbax snapshot and continued from that snapshot's step: the programs
are deterministic, so a rerun from step 0 would give the same result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pathways_wire.driver_protocol import RunStart
from tests.cluster.builders import inline_slice, program, ref_slice, virtual_slice
from tests.cluster.harness import Objects, OperatorProcess, condition

SLICE_READY_S = 120.0
PROGRAM_DONE_S = 240.0
ENTRYPOINT = "examples.programs:train_regression"
FAULTY = "tests.cluster.faulty_programs"
SUSPEND_GRACE_S = 5
"""This module's operator stops a driver asked to suspend after 5 s, not the default 60 s."""
ARGS = {"features": 8, "batch_per_device": 8, "learning_rate": 0.05, "seed": 5}


@pytest.fixture(scope="module")
def operator_args() -> tuple[str, ...]:
    return ("--suspend-grace-seconds", str(SUSPEND_GRACE_S))


def training(name: str, slice_manifest: dict[str, Any], steps: int, *, checkpoint: bool,
             pause: float = 0.0, priority_class: str = "") -> dict[str, Any]:
    manifest = program(name, ENTRYPOINT, slice_manifest, steps=steps,
                       args={**ARGS, "step_seconds": pause} if pause else dict(ARGS))
    if checkpoint:
        manifest["spec"]["checkpoint"] = {"everySteps": 3, "volume": "training-ckpt"}
    if priority_class:
        manifest["spec"]["priorityClassName"] = priority_class
    return manifest


def results(objects: Objects, done: dict[str, Any]) -> dict[str, Any]:
    data = objects.configmap(done["status"]["results"]["configMap"])
    return {k: json.loads(v) for k, v in data.items()}


def wait_steps(objects: Objects, name: str, steps: int) -> None:
    objects.wait_steps(name, steps, PROGRAM_DONE_S, interval=0.3)


def finished(objects: Objects, operator: OperatorProcess, name: str) -> dict[str, Any]:
    done = objects.wait_program(name, {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    return results(objects, done)


def assert_same_training(got: dict[str, Any], expected: dict[str, Any], steps: int) -> None:
    assert len(got["losses"]) == steps
    np.testing.assert_array_equal(np.asarray(got["weights"]), np.asarray(expected["weights"]))
    np.testing.assert_array_equal(np.asarray(got["losses"]), np.asarray(expected["losses"]))


def assert_resumed_from_snapshots(starts: list[RunStart], *, at_least: int) -> None:
    """The first run started fresh; every later one restored a snapshot of at least
    ``at_least`` steps and started at the snapshot's step."""
    assert starts[0] == RunStart(0, None), starts
    assert len(starts) >= 2, f"the driver never started again: {starts}"
    for start in starts[1:]:
        assert start.snapshot is not None and start.snapshot >= at_least, starts
        assert start.step == start.snapshot, starts


def checkpoint_dir(objects: Objects, operator: OperatorProcess, name: str) -> Path:
    uid = objects.program(name)["metadata"]["uid"]
    return operator.state_dir / "checkpoints" / objects.namespace / "training-ckpt" / f"{name}-{uid[:8]}"


@pytest.mark.timeout(500, func_only=True)
def test_suspend_and_resume_mid_training_give_the_uninterrupted_result(
    objects: Objects, operator: OperatorProcess
) -> None:
    steps = 14
    objects.apply(training("reference", inline_slice("main", 4, island="island-b"), steps, checkpoint=False))
    objects.apply(training("paused", inline_slice("main", 4, island="island-a"), steps,
                           checkpoint=True, pause=0.4))
    wait_steps(objects, "paused", 4)

    objects.cluster.kubectl("patch", "pwprog", "paused", "-n", objects.namespace, "--type", "merge",
                            "-p", '{"spec":{"suspend":true}}')
    suspended = objects.wait_program("paused", {"Suspended"}, 90, operator)
    assert condition(suspended, "Suspended")["status"] == "True"
    stopped = suspended["status"]["stepsCompleted"]
    assert 4 <= stopped < steps
    objects.cluster.poll(lambda: objects.get("virtualslices", "paused-main") is None
                         and not objects.pods("pathways.dev/slice=paused-main"),
                         timeout=90, interval=0.5, what="the suspended program's own slice released")

    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(checkpoint_dir(objects, operator, "paused"))
    assert manager.latest_step() == stopped, "the suspend snapshotted the step it stopped at"
    snapshot = manager.restore(stopped, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    assert len(snapshot["state"]["losses"]) == stopped
    manager.close()

    objects.cluster.kubectl("patch", "pwprog", "paused", "-n", objects.namespace, "--type", "merge",
                            "-p", '{"spec":{"suspend":false}}')
    assert_same_training(finished(objects, operator, "paused"), finished(objects, operator, "reference"), steps)
    assert objects.driver_starts("paused") == [RunStart(0, None), RunStart(stopped, stopped)]
    objects.wait_event("paused", "StepsRunning", text=f"Resumed at step {stopped} from the snapshot of step {stopped}")


@pytest.mark.timeout(300, func_only=True)
def test_a_driver_that_reaches_no_step_boundary_is_stopped_and_resumes_from_its_last_snapshot(
    objects: Objects, operator: OperatorProcess
) -> None:
    manifest = program("stuck", f"{FAULTY}:stalls_once", inline_slice("main", 1), steps=8, args={"stall_at": 5})
    manifest["spec"]["checkpoint"] = {"everySteps": 2, "volume": "training-ckpt"}
    objects.apply(manifest)
    wait_steps(objects, "stuck", 5)  # steps 0-4 done, snapshots of steps 2 and 4; stalled in step 5

    objects.cluster.kubectl("patch", "pwprog", "stuck", "-n", objects.namespace, "--type", "merge",
                            "-p", '{"spec":{"suspend":true}}')
    suspended = objects.wait_program("stuck", {"Suspended"}, 60 + SUSPEND_GRACE_S, operator)  # hang guard
    assert suspended["status"]["stepsCompleted"] == 5
    assert "continues from its last checkpoint" in condition(suspended, "Suspended")["message"]

    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(checkpoint_dir(objects, operator, "stuck"))
    assert manager.latest_step() == 4, "stopped inside a step: no snapshot beyond the periodic one"
    manager.close()

    objects.cluster.kubectl("patch", "pwprog", "stuck", "-n", objects.namespace, "--type", "merge",
                            "-p", '{"spec":{"suspend":false}}')
    assert finished(objects, operator, "stuck") == {"steps": 8}
    assert objects.driver_starts("stuck") == [RunStart(0, None), RunStart(4, 4)]
    objects.wait_event("stuck", "StepsRunning", text="Resumed at step 4 from the snapshot of step 4")


@pytest.mark.timeout(500, func_only=True)
def test_program_restores_its_snapshot_after_gang_recreation(
    objects: Objects, operator: OperatorProcess
) -> None:
    steps = 14
    objects.apply(virtual_slice("recreated", 4, island="island-a"))
    objects.wait_slice("recreated", "Ready", SLICE_READY_S, operator)
    objects.apply(training("reference", inline_slice("main", 4, island="island-b"), steps, checkpoint=False))
    objects.apply(training("survivor", ref_slice("main", "recreated"), steps, checkpoint=True, pause=0.4))
    wait_steps(objects, "survivor", 5)
    objects.core.delete_namespaced_pod("recreated-0", objects.namespace)

    got = finished(objects, operator, "survivor")
    assert objects.slice("recreated")["status"]["restarts"] == 1
    starts = [e.message for e in objects.events("survivor") if e.reason == "StepsRunning"]
    assert len(starts) >= 2, starts
    assert_same_training(got, finished(objects, operator, "reference"), steps)
    # five steps were done before the pod went: the snapshot of step 3 at least was written
    assert_resumed_from_snapshots(objects.driver_starts("survivor"), at_least=3)


@pytest.mark.timeout(600, func_only=True)
def test_higher_priority_slice_preempts_and_the_low_program_resumes(
    objects: Objects, operator: OperatorProcess
) -> None:
    for name, value in (("pw-test-low", 10), ("pw-test-high", 1000)):
        objects.cluster.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value,
        }))
    steps = 16
    objects.apply(training("reference", inline_slice("main", 8, island="island-b"), steps, checkpoint=False))
    objects.apply(training("humble", inline_slice("main", 8, island="island-a"), steps,
                           checkpoint=True, pause=0.4, priority_class="pw-test-low"))
    wait_steps(objects, "humble", 4)

    urgent = virtual_slice("urgent", 8, island="island-a")
    urgent["spec"]["priorityClassName"] = "pw-test-high"
    objects.apply(urgent)
    objects.wait_slice("urgent", "Ready", SLICE_READY_S, operator)
    preempted = objects.wait_event("humble-main", "Preempted")
    assert "urgent" in preempted.message, preempted.message
    assert objects.program("humble")["status"]["phase"] in ("Pending", "Running")
    assert objects.slice("humble-main")["status"]["phase"] != "Ready"

    objects.delete("virtualslices", "urgent")
    assert_same_training(finished(objects, operator, "humble"), finished(objects, operator, "reference"), steps)
    assert_resumed_from_snapshots(objects.driver_starts("humble"), at_least=3)


@pytest.mark.timeout(120, func_only=True)
def test_missing_priority_class_is_named_in_the_admitted_condition(
    objects: Objects, operator: OperatorProcess
) -> None:
    manifest = virtual_slice("classless", 4)
    manifest["spec"]["priorityClassName"] = "no-such-class"
    objects.apply(manifest)

    def explained() -> dict[str, Any] | None:
        found = objects.slice("classless")
        admitted = [c for c in (found.get("status") or {}).get("conditions") or [] if c["type"] == "Admitted"]
        return found if admitted and admitted[0]["reason"] == "PriorityClassNotFound" else None

    found = objects.cluster.poll(explained, timeout=60, what="Admitted=False, PriorityClassNotFound")
    assert "spec.priorityClassName 'no-such-class'" in condition(found, "Admitted")["message"]
