"""A program's life under the operator: failures, retries, deadlines, waiting, files, apply order.

Misbehaving entrypoints come from ``tests.cluster.faulty_programs``. What every test
checks besides the verdict: a program that cannot progress holds no slice (its
template slice is deleted), and problems are Warning Events.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pathways_wire import process_tree
from tests.cluster.builders import inline_slice, program, ref_slice, virtual_slice
from pathways_devcluster.controlplane import REPO_ROOT
from tests.cluster.harness import Objects, OperatorProcess, condition

FAULTY = "tests.cluster.faulty_programs"
VERDICT_S = 90.0
EXAMPLES_DONE_S = 540.0


def failed(objects: Objects, operator: OperatorProcess, name: str) -> dict[str, Any]:
    """Wait for ``name`` to end; it must be Failed. Returns the program."""
    done = objects.wait_program(name, {"Failed", "Succeeded"}, VERDICT_S, operator)
    assert done["status"]["phase"] == "Failed", done["status"]
    return done


def run_faulty(objects: Objects, operator: OperatorProcess, name: str, entrypoint: str) -> dict[str, Any]:
    """Runs ``faulty_programs:<entrypoint>`` on a 1-device inline slice; returns it Failed."""
    objects.apply(program(name, f"{FAULTY}:{entrypoint}", inline_slice("main", 1)))
    return failed(objects, operator, name)


def slice_released(objects: Objects, name: str) -> None:
    objects.cluster.poll(
        lambda: objects.get("virtualslices", name) is None and not objects.pods(f"pathways.dev/slice={name}"),
        timeout=60, interval=0.5, what=f"VirtualSlice {name} and its pods deleted",
    )


def warning_event(objects: Objects, name: str, reason: str) -> str:
    """The message of the Warning Event ``reason`` about ``name``, waited for (within a bound):
    the operator posts Events after it writes the status that goes with them."""
    event = objects.wait_event(name, reason)
    assert event.type == "Warning", (reason, event.type, event.message)
    return str(event.message)


@pytest.mark.timeout(180, func_only=True)
def test_program_that_raises_fails_at_once_with_its_log_once_and_releases_its_slice(
    objects: Objects, operator: OperatorProcess
) -> None:
    done = run_faulty(objects, operator, "raiser", "raises")
    message = condition(done, "Failed")["message"]
    assert condition(done, "Failed")["reason"] == "ComputationFailed"
    assert "Traceback (most recent call last)" in message
    assert message.count("ValueError: the data set is empty") == 1, message
    assert "Traceback" not in condition(done, "Running")["message"]
    assert done["status"].get("restarts", 0) == 0
    warning_event(objects, "raiser", "ComputationFailed")
    slice_released(objects, "raiser-main")


@pytest.mark.timeout(180, func_only=True)
def test_results_the_api_server_refuses_fail_the_program_and_release_its_slice(
    objects: Objects, operator: OperatorProcess
) -> None:
    done = run_faulty(objects, operator, "forger", "forges_results")
    refused = condition(done, "Failed")
    assert refused["reason"] == "ResultsNotStored"
    assert "the API server refused its results" in refused["message"]
    assert "HTTP 422" in refused["message"] and "a/b" in refused["message"]
    warning_event(objects, "forger", "ResultsNotStored")
    slice_released(objects, "forger-main")


@pytest.mark.timeout(240, func_only=True)
def test_ref_to_a_slice_not_created_yet_waits_then_runs(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(program("early", "examples.programs:paper_example", ref_slice("main", "later")))

    def waiting() -> dict[str, Any] | None:
        found = objects.program("early")
        status = found.get("status") or {}
        return found if status.get("phase") == "Pending" and status.get("conditions") else None

    pending = objects.cluster.poll(waiting, timeout=60, interval=0.5, what="program Pending")
    running = condition(pending, "Running")
    assert running["reason"] == "SliceNotFound"
    assert "VirtualSlice 'later' (spec.slices[0].ref) does not exist" in running["message"]
    warning_event(objects, "early", "SliceNotFound")

    objects.apply(virtual_slice("later", 2))
    done = objects.wait_program("early", {"Succeeded", "Failed"}, 180, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")


@pytest.mark.timeout(180, func_only=True)
def test_active_deadline_stops_the_program_and_releases_its_slice(
    objects: Objects, operator: OperatorProcess
) -> None:
    manifest = program("sleeper", f"{FAULTY}:sleeps", inline_slice("main", 1))
    manifest["spec"]["activeDeadlineSeconds"] = 4
    objects.apply(manifest)
    done = failed(objects, operator, "sleeper")
    passed = condition(done, "Failed")
    assert passed["reason"] == "DeadlineExceeded"
    assert passed["message"].startswith("spec.activeDeadlineSeconds (4) passed")
    warning_event(objects, "sleeper", "DeadlineExceeded")
    slice_released(objects, "sleeper-main")
    drivers = driver_pids(objects, operator, "sleeper")
    assert drivers, "the operator logged no driver of the program"
    objects.cluster.poll(lambda: not any(process_tree.pid_alive(pid) for pid in drivers),
                         timeout=30, what="the driver of the stopped program gone")


def driver_pids(objects: Objects, operator: OperatorProcess, name: str) -> list[int]:
    """The PID of the program's driver, as the node agent recorded it when it started its pod."""
    return [objects.cluster.container_pid(objects.namespace, f"{name}-driver", "driver")]


@pytest.mark.timeout(180, func_only=True)
def test_lost_host_runs_again_up_to_the_backoff_limit(objects: Objects, operator: OperatorProcess) -> None:
    manifest = program("unlucky", f"{FAULTY}:loses_host", inline_slice("main", 1), steps=5)
    manifest["spec"]["backoffLimit"] = 1
    objects.apply(manifest)
    done = failed(objects, operator, "unlucky")
    exhausted = condition(done, "Failed")
    assert exhausted["reason"] == "BackoffLimitExceeded"
    assert "lost a host 2 times, more than spec.backoffLimit (1) allows" in exhausted["message"]
    assert done["status"]["restarts"] == 1
    warning_event(objects, "unlucky", "HostLost")
    warning_event(objects, "unlucky", "BackoffLimitExceeded")
    slice_released(objects, "unlucky-main")


@pytest.mark.timeout(180, func_only=True)
def test_driver_output_is_its_pods_log(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(program("chatty", f"{FAULTY}:prints", inline_slice("main", 1), args={"mib": 20}))
    done = objects.wait_program("chatty", {"Succeeded", "Failed"}, VERDICT_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    log = objects.cluster.container_log(objects.namespace, "chatty-driver", "driver")
    assert log.stat().st_size >= 20 * 1024 * 1000, "20 Ki lines of 1000 characters and more"
    with open(log, "rb") as f:
        f.seek(-100, 2)
        assert f.read().rstrip().endswith(b"the end")


@pytest.mark.timeout(240, func_only=True)
def test_deleting_a_program_deletes_its_checkpoints(objects: Objects, operator: OperatorProcess) -> None:
    manifest = program("saver", "examples.programs:train_regression", inline_slice("main", 2), steps=3,
                       args={"features": 4, "batch_per_device": 4})
    manifest["spec"]["checkpoint"] = {"everySteps": 1, "volume": "ckpt"}
    objects.apply(manifest)
    done = objects.wait_program("saver", {"Succeeded", "Failed"}, 180, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    uid = done["metadata"]["uid"]
    where = operator.state_dir / "checkpoints" / objects.namespace / "ckpt" / f"saver-{uid[:8]}"
    assert where.is_dir() and any(where.iterdir()), "the finished program's snapshots are kept"

    objects.delete("pathwaysprograms", "saver")
    objects.cluster.poll(lambda: not where.exists() and objects.get("pathwaysprograms", "saver") is None,
                         timeout=60, interval=0.5, what="program and its checkpoint directory deleted")
    assert where.parent.is_dir(), "only the program's own directory goes"


@pytest.mark.timeout(600, func_only=True)
def test_kubectl_apply_of_the_examples_directory_runs_every_example_to_success(
    objects: Objects, operator: OperatorProcess
) -> None:
    """``kubectl apply -f examples/manifests/``: files in name order, so ``lm-train``
    (program-on-shared-slice.yaml) comes before the VirtualSlice it refers to."""
    directory = REPO_ROOT / "examples" / "manifests"
    files = sorted(directory.glob("*.yaml"))
    documents = [d for path in files for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = [d["kind"] for d in documents]
    assert kinds.index("PathwaysProgram") < kinds.index("VirtualSlice"), "a program precedes its slice"
    objects.cluster.kubectl("apply", "-n", objects.namespace, "-f", str(directory))
    programs = [d["metadata"]["name"] for d in documents if d["kind"] == "PathwaysProgram"]
    assert len(programs) >= 5
    started = time.monotonic()

    def all_done() -> dict[str, str] | None:
        phases = {n: (objects.program(n).get("status") or {}).get("phase", "") for n in programs}
        broken = {n: p for n, p in phases.items() if p == "Failed"}
        assert not broken, {n: objects.program(n)["status"].get("message") for n in broken}
        return phases if set(phases.values()) == {"Succeeded"} else None

    objects.cluster.poll(all_done, timeout=EXAMPLES_DONE_S, interval=2.0, what="every example Succeeded")
    print(f"\n{len(programs)} example programs Succeeded {time.monotonic() - started:.0f} s after apply")
