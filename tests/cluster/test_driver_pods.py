"""Program drivers in pods of their own, against a real API server.

A PathwaysProgram's driver runs in pod ``<program>-driver``: owned by the program, from
its image, with no Kubernetes API credential, reporting to the controller with a token
good for its program alone. These tests check what that pod is and cannot do, and how
the program lives when the pod, or the operator, goes away mid-run.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import grpc
import pytest

from pathways.cli import main as cli_main
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire import process_tree
from pathways_wire.driver_protocol import CLIENT_TOKEN_METADATA, PROGRESS_FILE
from pathways_wire.kube_names import DRIVER_CONTAINER
from tests.cluster.builders import inline_slice, program
from tests.cluster.harness import Objects, OperatorProcess
from tests.cluster.test_checkpoints import PROGRAM_DONE_S, assert_same_training, finished, training, wait_steps


def driver_pod(objects: Objects, program_name: str) -> Any:
    return objects.core.read_namespaced_pod(f"{program_name}-driver", objects.namespace)


@pytest.mark.timeout(300, func_only=True)
def test_driver_pod_is_owned_by_its_program_and_holds_no_api_credential(
    objects: Objects, operator: OperatorProcess
) -> None:
    objects.apply(program("probe", "tests.cluster.faulty_programs:probes_credentials", inline_slice("main", 2)))
    done = objects.wait_program("probe", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    got = {k: json.loads(v) for k, v in objects.configmap("probe-results").items()}
    assert got["token_files"] == 0.0, "no ServiceAccount token is mounted"
    assert got["api_status"] in (401.0, 403.0), got
    assert got["program_token"] == 1.0

    pod = driver_pod(objects, "probe")
    assert pod.spec.restart_policy == "Never"
    assert pod.spec.automount_service_account_token is False
    (owner,) = pod.metadata.owner_references
    assert (owner.kind, owner.name, owner.controller) == ("PathwaysProgram", "probe", True)
    assert owner.uid == done["metadata"]["uid"]
    secret = objects.core.read_namespaced_secret("probe-driver-token", objects.namespace)
    assert secret.metadata.owner_references[0].uid == done["metadata"]["uid"]

    out, err = io.StringIO(), io.StringIO()
    code = cli_main(["--kubeconfig", str(objects.cluster.kubeconfig), "-n", objects.namespace, "logs", "program",
                     "probe", "--log-dir", str(objects.cluster.state_dir)], out=out, err=err)
    assert code == 0, err.getvalue()
    assert any(line.startswith("[driver] probes_credentials: 0 token files") for line in out.getvalue().splitlines())


@pytest.mark.timeout(300, func_only=True)
def test_a_programs_token_reaches_only_its_own_slices_and_strangers_are_refused(
    objects: Objects, operator: OperatorProcess
) -> None:
    for name in ("mine", "theirs"):
        objects.apply(program(name, "tests.cluster.faulty_programs:sleeps", inline_slice("main", 1)))
    for name in ("mine", "theirs"):
        objects.wait_steps(name, 1, PROGRAM_DONE_S, what=f"{name}'s driver running")
    secret = objects.core.read_namespaced_secret("mine-driver-token", objects.namespace)
    mine = ((CLIENT_TOKEN_METADATA, base64.b64decode(secret.data["token"]).decode()),)

    def create_slice(name: str, metadata: tuple[tuple[str, str], ...] = ()) -> pb.SliceInfo:
        spec = pb.VirtualSliceSpec(id=name, name=name, devices=1)
        request = pb.CreateSliceRequest(spec=spec, client="test", namespace=objects.namespace, timeout_s=30)
        return stub.CreateSlice(request, metadata=metadata, timeout=60)

    with grpc.insecure_channel(operator.controller_address) as channel:
        stub = pb_grpc.ControllerStub(channel)
        assert create_slice("mine-main", mine).token, "a driver gets its own slice's token"
        with pytest.raises(grpc.RpcError) as denied:
            create_slice("theirs-main", mine)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"program {objects.namespace}/mine may use only its own slices (mine-main)" in (denied.value.details() or "")
        assert f"slice {objects.namespace}/theirs-main" in (denied.value.details() or "")

        theirs = next(s.slice_id for s in stub.Describe(pb.ClusterInfoRequest(), metadata=mine, timeout=10).slices
                      if s.name == "theirs-main")
        program_ir = pb.Program(name="probe", slices=[pb.VirtualSliceSpec(id="v", name="theirs-main", devices=1)])
        with pytest.raises(grpc.RpcError) as unbound:
            stub.LoadProgram(pb.LoadProgramRequest(program=program_ir, bindings={"v": theirs}), metadata=mine,
                             timeout=10)
        assert unbound.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "did not place slice" in (unbound.value.details() or "")

        their_secret = objects.core.read_namespaced_secret("theirs-driver-token", objects.namespace)
        their_token = ((CLIENT_TOKEN_METADATA, base64.b64decode(their_secret.data["token"]).decode()),)
        stub.KeepAlive(pb.KeepAliveRequest(client="probe-of-mine"), metadata=mine, timeout=10)
        for call in (lambda: stub.DropObjects(pb.DropObjectsRequest(client="probe-of-mine"), metadata=their_token,
                                              timeout=10),
                     lambda: stub.KeepAlive(pb.KeepAliveRequest(client="probe-of-mine"), metadata=their_token,
                                            timeout=10)):
            with pytest.raises(grpc.RpcError) as impostor:
                call()
            assert impostor.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert (f"program {objects.namespace}/theirs may not act for client 'probe-of-mine', which program "
                    f"{objects.namespace}/mine uses") in (impostor.value.details() or "")

        with pytest.raises(grpc.RpcError) as missing:
            create_slice("theirs-main")
        assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "no client token was presented (gRPC metadata x-pathways-client-token)" in (missing.value.details() or "")
        with pytest.raises(grpc.RpcError) as forged:
            stub.ReportResult(pb.ResultReport(results_json="{}"), metadata=((CLIENT_TOKEN_METADATA, "forged"),),
                              timeout=10)
        assert forged.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "belongs to no running PathwaysProgram" in (forged.value.details() or "")


def test_a_driver_pods_calls_go_over_the_controllers_calls_port_in_order(
    objects: Objects, operator: OperatorProcess
) -> None:
    """The driver learns the operator's calls port from the controller and calls over it; each
    call names the output of the small call before it, whose answer has not come."""
    objects.apply(program("ported", "tests.cluster.faulty_programs:chained_small_calls", inline_slice("main", 1),
                          steps=1, args={"calls": 30}))
    said = finished(objects, operator, "ported")
    assert said["calls_port"] == 1.0, "the driver called over gRPC"
    assert said["v"] == [30.0]


@pytest.mark.timeout(500, func_only=True)
def test_driver_pod_deleted_mid_training_ends_on_the_reference_result(
    objects: Objects, operator: OperatorProcess
) -> None:
    steps = 14
    for name, island, disturbed in (("reference", "island-b", False), ("uprooted", "island-a", True)):
        slice_manifest = inline_slice("main", 4, island=island)
        objects.apply(training(name, slice_manifest, steps, checkpoint=disturbed, pause=0.4 if disturbed else 0.0))
    wait_steps(objects, "uprooted", 5)
    first = driver_pod(objects, "uprooted").metadata.uid
    objects.core.delete_namespaced_pod("uprooted-driver", objects.namespace)

    got = finished(objects, operator, "uprooted")
    assert_same_training(got, finished(objects, operator, "reference"), steps)
    status = objects.program("uprooted")["status"]
    assert status["restarts"] == 1 and status["stepsCompleted"] == steps
    assert driver_pod(objects, "uprooted").metadata.uid != first
    lost = objects.wait_event("uprooted", "HostLost")
    assert "uprooted-driver was deleted" in lost.message, lost.message


@pytest.mark.timeout(400, func_only=True)
def test_a_driver_pod_made_after_its_secret_was_deleted_gets_a_new_token_and_the_run_ends(
    objects: Objects, operator: OperatorProcess
) -> None:
    first_pod = paper_example_mid_run(objects, "rekeyed")
    first = objects.core.read_namespaced_secret("rekeyed-driver-token", objects.namespace)
    objects.core.delete_namespaced_secret("rekeyed-driver-token", objects.namespace)
    objects.core.delete_namespaced_pod("rekeyed-driver", objects.namespace)

    done = objects.wait_program("rekeyed", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert done["status"]["restarts"] == 1 and done["status"]["stepsCompleted"] == PAPER_STEPS
    assert driver_pod(objects, "rekeyed").metadata.uid != first_pod
    second = objects.core.read_namespaced_secret("rekeyed-driver-token", objects.namespace)
    assert second.metadata.uid != first.metadata.uid, "the new driver's Secret was made anew"
    assert second.data["token"] != first.data["token"]


PAPER_STEPS = 10


def paper_example_mid_run(objects: Objects, name: str) -> str:
    """Program `name` runs `PAPER_STEPS` steps of the paper's example, half a second each;
    once 2 are done, its driver pod's uid."""
    objects.apply(program(name, "examples.programs:paper_example", inline_slice("main", 4),
                          steps=PAPER_STEPS, args={"step_seconds": 0.5}))
    objects.wait_steps(name, 2, PROGRAM_DONE_S, what="program mid-run")
    return str(driver_pod(objects, name).metadata.uid)


@pytest.mark.timeout(400, func_only=True)
def test_operator_restart_leaves_the_driver_pod_running_and_reruns_no_step(
    objects: Objects, operator: OperatorProcess
) -> None:
    pod = paper_example_mid_run(objects, "steady")

    operator.restart(kill=True)

    done = objects.wait_program("steady", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert done["status"]["restarts"] == 0
    assert driver_pod(objects, "steady").metadata.uid == pod, "the driver pod ran on"
    uid = done["metadata"]["uid"]
    progress = operator.state_dir / objects.namespace / f"steady-{uid[:8]}" / PROGRESS_FILE
    reported = [json.loads(line)["step"] for line in progress.read_text().splitlines()]
    assert reported == list(range(PAPER_STEPS)), "each step reported once"


@pytest.mark.timeout(400, func_only=True)
def test_a_driver_pod_deleted_while_the_operator_was_down_counts_as_a_lost_run(
    objects: Objects, operator: OperatorProcess
) -> None:
    first = paper_example_mid_run(objects, "orphaned")
    pid = objects.cluster.container_pid(objects.namespace, "orphaned-driver", DRIVER_CONTAINER)

    operator.stop(kill=True)
    # at once, as a node's loss or a force deletion ends it: the driver has no moment to report
    objects.core.delete_namespaced_pod("orphaned-driver", objects.namespace, grace_period_seconds=0)
    objects.cluster.poll(
        lambda: not process_tree.pid_alive(pid) and not objects.pods("pathways.dev/driver=orphaned"),
        timeout=60, interval=0.2, what="the driver pod and its process gone while no operator ran",
    )
    operator.start()

    done = objects.wait_program("orphaned", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert done["status"]["restarts"] == 1, "the run lost with its pod counts, as when the operator saw it go"
    assert done["status"]["stepsCompleted"] == PAPER_STEPS
    assert driver_pod(objects, "orphaned").metadata.uid != first
    lost = objects.wait_event("orphaned", "HostLost")
    assert "orphaned-driver was deleted" in lost.message, lost.message
