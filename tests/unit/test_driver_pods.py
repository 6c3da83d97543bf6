"""Driver pods: their manifest, their program tokens, and the reports their drivers make."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_wire.driver_protocol import (
    COMPILED_PROGRAM_DIR,
    DRIVER_TOKEN_DIR,
    PROGRESS_FILE,
    RESULTS_FILE,
    outcome_payload,
    result_report,
    steps_completed,
)
from pathways_operator.core.driver_placement import DriverRequest, Toleration
from pathways_operator.core.placement import HostResources
from pathways_operator.core.program_lifecycle import DriverState, Reported
from pathways_operator.k8s.cluster_api import AlreadyExists
from pathways_operator.k8s.driver_pods import (
    DriverPods,
    DriverPodSettings,
    UnknownProgramToken,
    driver_pod,
    pod_fact,
    spec_request,
)
from pathways_operator.k8s.drivers import DriverLaunch
from pathways_operator.k8s.pathways_program import DriverSpec
from pathways_wire.kube_names import SCHEDULER_NAME

OWNER = {"apiVersion": "pathways.dev/v1alpha1", "kind": "PathwaysProgram", "name": "train", "uid": "uid-1",
         "controller": True, "blockOwnerDeletion": True}
SETTINGS = DriverPodSettings(image="kube-pathways:1", controller="kube-pathways.ops.svc:8470")


def launch(**changes: Any) -> DriverLaunch:
    fields: dict[str, Any] = dict(
        namespace="ns", name="train", uid="uid-1", entrypoint="examples.programs:train_regression",
        args={"features": 8}, steps=10, start_step=3, weight=2.0,
        slices={"main": {"virtualSlice": "train-main", "devices": 4}}, owner_reference=OWNER,
    )
    fields.update(changes)
    return DriverLaunch(**fields)


def test_driver_pod_is_owned_by_the_program_runs_once_and_holds_no_api_token() -> None:
    pod = driver_pod(launch(), SETTINGS)
    assert pod["metadata"]["name"] == "train-driver"
    assert pod["metadata"]["ownerReferences"] == [OWNER]
    assert pod["metadata"]["labels"]["pathways.dev/driver"] == "train"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec
    (container,) = spec["containers"]
    assert container["image"] == "kube-pathways:1"
    assert container["command"] == ["python", "-m", "pathways.driver"]
    args = container["args"]
    assert args[args.index("--entrypoint") + 1] == "examples.programs:train_regression"
    assert args[args.index("--start-step") + 1] == "3"
    assert args[args.index("--controller") + 1] == "kube-pathways.ops.svc:8470"
    assert "--report-to-controller" in args
    assert {"name": "program-token", "mountPath": DRIVER_TOKEN_DIR, "readOnly": True} in container["volumeMounts"]
    assert {"name": "program-token", "secret": {"secretName": "train-driver-token", "defaultMode": 0o400}} \
        in spec["volumes"]


def test_spec_driver_replaces_each_default_it_gives() -> None:
    custom = DriverSpec(
        image="me/models:2", command=("python", "-m", "mymodels.run"), args=("--fast",),
        env=({"name": "MODEL", "value": "big"},), resources={"requests": {"cpu": "2"}},
        service_account_name="models", node_selector={"pool": "cpu"},
        tolerations=({"key": "cpu-only", "operator": "Exists"},),
    )
    pod = driver_pod(launch(pod=custom), SETTINGS)
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "me/models:2"
    assert container["command"] == ["python", "-m", "mymodels.run"] and container["args"] == ["--fast"]
    assert {"name": "MODEL", "value": "big"} in container["env"]
    assert container["resources"] == {"requests": {"cpu": "2"}}
    assert pod["spec"]["serviceAccountName"] == "models"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert pod["spec"]["tolerations"] == [{"key": "cpu-only", "operator": "Exists"}]


def test_compiled_program_is_mounted_from_its_config_map() -> None:
    pod = driver_pod(launch(compiled_program={"metadata": {"name": "lm-compiled"}}), SETTINGS)
    (container,) = pod["spec"]["containers"]
    assert container["args"][:2] == ["--compiled-program", COMPILED_PROGRAM_DIR]
    assert {"name": "compiled-program", "configMap": {"name": "lm-compiled"}} in pod["spec"]["volumes"]


@pytest.mark.parametrize(("volumes", "source"), [
    ("claim", {"persistentVolumeClaim": {"claimName": "ckpt"}}),
    ("host-path", {"hostPath": {"path": "/ckpt/ns/ckpt", "type": "DirectoryOrCreate"}}),
])
def test_checkpoint_volume_is_mounted_where_the_driver_writes_snapshots(volumes: Any, source: Any) -> None:
    settings = DriverPodSettings(image="i", controller="c:1", checkpoint_volumes=volumes)
    pod = driver_pod(launch(checkpoint_dir="/ckpt/ns/ckpt/train-uid1", checkpoint_every=5), settings, "ckpt")
    assert {"name": "checkpoints", **source} in pod["spec"]["volumes"]
    assert {"name": "checkpoints", "mountPath": "/ckpt/ns/ckpt"} in pod["spec"]["containers"][0]["volumeMounts"]


def test_pod_fact_reads_the_driver_container_exit_code() -> None:
    pod = {"metadata": {}, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "driver", "state": {"terminated": {"exitCode": 75, "reason": "Error"}}}]}}
    fact = pod_fact(pod)
    assert (fact.exists, fact.phase, fact.exit_code, fact.deleting) == (True, "Failed", 75, False)
    assert not pod_fact(None).exists


@pytest.mark.parametrize("payload", [
    {"results": {"y": [1.0, 2.0]}},
    {"suspended": True, "stepsCompleted": 7},
    {"error": "ValueError: empty", "retryable": False, "badProgram": False, "logTail": "Traceback ..."},
])
def test_an_outcome_crosses_the_wire_unchanged(payload: dict[str, Any]) -> None:
    assert outcome_payload(pb.ResultReport.FromString(result_report(payload).SerializeToString())) == payload


class FakeApi:
    """The ClusterApi calls DriverPods makes, on dicts."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.secrets: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.bound: list[tuple[str, str]] = []

    def bind_pod(self, namespace: str, pod: str, node: str) -> None:
        self.bound.append((pod, node))
        self.pods[pod]["spec"]["nodeName"] = node

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get(name)

    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if name in self.pods:
            raise AlreadyExists("creating pod", 409, "exists")
        self.pods[name] = {**body, "metadata": {**body["metadata"], "uid": "pod-1"}, "status": {"phase": "Pending"}}
        return self.pods[name]

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int | None = None) -> None:
        self.deleted.append(name)
        self.pods.pop(name, None)

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.secrets.get(name)

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.secrets[body["metadata"]["name"]] = body
        return body

    def pod_log(self, namespace: str, name: str, container: str, tail_lines: int) -> str:
        return ""


def token_of(api: FakeApi) -> str:
    return base64.b64decode(api.secrets["train-driver-token"]["data"]["token"]).decode()


def pods(tmp_path: Path) -> tuple[DriverPods, FakeApi]:
    api = FakeApi()
    return DriverPods(api, tmp_path, SETTINGS), api  # type: ignore[arg-type]


def test_start_mints_a_token_owned_by_the_program_and_reports_need_it(tmp_path: Path) -> None:
    drivers, api = pods(tmp_path)
    drivers.start(launch())
    assert api.secrets["train-driver-token"]["metadata"]["ownerReferences"] == [OWNER]
    token = token_of(api)
    assert drivers.report_progress(token, 0, {"loss": 1.5}) is False
    drivers.report_progress(token, 1, {})
    assert drivers.steps_completed("ns", "train", "uid-1") == 2
    with pytest.raises(UnknownProgramToken, match="no program token was presented"):
        drivers.report_progress("", 2, {})
    with pytest.raises(UnknownProgramToken, match="belongs to no running PathwaysProgram"):
        drivers.report_result("forged", {"results": {}})


def test_a_step_report_wakes_its_programs_reconciler_once_the_step_is_written(tmp_path: Path) -> None:
    api = FakeApi()
    woken: list[tuple[str, int]] = []
    drivers = DriverPods(api, tmp_path, SETTINGS,  # type: ignore[arg-type]
                         wake=lambda key: woken.append((key, drivers.steps_completed("ns", "train", "uid-1"))))
    drivers.start(launch())
    assert woken == []
    drivers.report_progress(token_of(api), 0, {"loss": 1.5})
    assert woken == [("ns/train", 1)]


def test_suspend_is_asked_in_the_reply_to_the_next_step_report(tmp_path: Path) -> None:
    drivers, api = pods(tmp_path)
    drivers.start(launch())
    drivers.request_suspend("ns", "train")
    assert drivers.report_progress(token_of(api), 4, {}) is True


def test_reported_results_and_the_pods_exit_code_make_the_outcome(tmp_path: Path) -> None:
    drivers, api = pods(tmp_path)
    drivers.start(launch())
    assert drivers.status("ns", "train", "uid-1").state is DriverState.RUNNING
    drivers.report_result(token_of(api), {"results": {"y": [3.0]}})
    api.pods["train-driver"]["status"] = {"phase": "Succeeded", "containerStatuses": [
        {"name": "driver", "state": {"terminated": {"exitCode": 0}}}]}
    status = drivers.status("ns", "train", "uid-1")
    assert (status.state, status.exit_code, status.reported, status.results) == (
        DriverState.EXITED, 0, Reported.RESULTS, {"y": [3.0]})
    assert json.loads((drivers.workdir("ns", "train", "uid-1") / RESULTS_FILE).read_text()) == {
        "results": {"y": [3.0]}}


def test_a_deleted_driver_pod_is_lost_and_a_restarted_operator_reads_the_token_back(tmp_path: Path) -> None:
    drivers, api = pods(tmp_path)
    drivers.start(launch())
    api.pods.clear()
    lost = drivers.status("ns", "train", "uid-1")
    assert (lost.state, lost.reported) == (DriverState.EXITED, Reported.LOST)
    drivers.discard_outcome("ns", "train", "uid-1")
    drivers.start(launch(start_step=4))
    api.pods["train-driver"]["status"] = {"phase": "Running"}
    restarted = DriverPods(api, tmp_path, SETTINGS)  # type: ignore[arg-type]
    assert restarted.status("ns", "train", "uid-1").state is DriverState.RUNNING
    restarted.report_progress(token_of(api), 4, {})
    assert steps_completed(restarted.workdir("ns", "train", "uid-1") / PROGRESS_FILE) == 5


def test_an_ended_program_keeps_its_finished_pod_and_its_token_stops_working(tmp_path: Path) -> None:
    drivers, api = pods(tmp_path)
    drivers.start(launch())
    token = token_of(api)
    api.pods["train-driver"]["status"] = {"phase": "Succeeded", "containerStatuses": [
        {"name": "driver", "state": {"terminated": {"exitCode": 0}}}]}
    drivers.retire("ns", "train", "uid-1")
    assert api.deleted == [] and "train-driver" in api.pods
    with pytest.raises(UnknownProgramToken):
        drivers.report_progress(token, 9, {})


def test_a_restarted_operator_checks_an_unseen_token_against_the_named_programs_secret(tmp_path: Path) -> None:
    drivers, api = pods(tmp_path)
    drivers.start(launch())
    token = token_of(api)
    restarted = DriverPods(api, tmp_path, SETTINGS)  # type: ignore[arg-type]
    with pytest.raises(UnknownProgramToken):
        restarted.report_progress(token, 0, {})
    with pytest.raises(UnknownProgramToken):
        restarted.report_progress("forged", 0, {}, ("ns", "train"))
    assert restarted.report_progress(token, 0, {}, ("ns", "train")) is False
    assert restarted.program_of(token).uid == "uid-1"


def test_each_runs_start_is_kept_with_the_driver_log(tmp_path: Path) -> None:
    from pathways_wire.driver_protocol import RunStart, run_starts

    drivers, api = pods(tmp_path)
    drivers.start(launch())
    drivers.report_start(token_of(api), RunStart(0, None))
    drivers.report_start(token_of(api), RunStart(6, 6))
    assert run_starts(drivers.log_text("ns", "train", "uid-1", 1 << 20)) == [RunStart(0, None), RunStart(6, 6)]


def test_a_driver_admitted_with_its_slices_is_bound_to_the_node_admission_chose(tmp_path: Path) -> None:
    drivers, api = pods(tmp_path)
    asked: list[tuple[str, DriverRequest]] = []

    def placer(group: str, request: DriverRequest) -> str:
        asked.append((group, request))
        return "cpu-0"

    drivers.placer = placer
    resources = {"requests": {"cpu": "2", "memory": "1Gi"}}
    drivers.start(launch(pod=DriverSpec(resources=resources, node_selector={"pool": "drivers"})))
    assert asked == [("uid-1", DriverRequest("ns/train", HostResources(2000, 1 << 30), {"pool": "drivers"}))]
    assert api.pods["train-driver"]["spec"]["schedulerName"] == SCHEDULER_NAME
    assert api.bound == [("train-driver", "cpu-0")]


def test_a_driver_no_node_has_room_for_at_its_start_is_left_to_the_scheduler(tmp_path: Path) -> None:
    drivers, api = pods(tmp_path)
    drivers.placer = lambda group, request: None
    drivers.start(launch())
    assert "schedulerName" not in api.pods["train-driver"]["spec"]
    assert api.bound == []


def test_a_restarted_operator_binds_a_driver_pod_created_but_not_bound(tmp_path: Path) -> None:
    drivers, api = pods(tmp_path)
    drivers.start(launch())
    api.pods["train-driver"]["spec"]["schedulerName"] = SCHEDULER_NAME  # created for binding, then stopped
    restarted = DriverPods(api, tmp_path, SETTINGS)  # type: ignore[arg-type]
    restarted.placer = lambda group, request: "cpu-1"
    assert restarted.status("ns", "train", "uid-1").state is DriverState.RUNNING
    assert api.bound == [("train-driver", "cpu-1")]
    restarted.status("ns", "train", "uid-1")
    assert api.bound == [("train-driver", "cpu-1")], "bound once"


def test_spec_driver_resources_become_the_request_admission_checks() -> None:
    spec = DriverSpec(resources={"limits": {"cpu": "500m", "memory": "2Gi"}},
                      tolerations=({"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"},))
    assert spec_request("ns/train", spec) == DriverRequest(
        "ns/train", HostResources(500, 2 << 30), {}, (Toleration("dedicated", "Exists", "", "NoSchedule"),))
    with pytest.raises(ValueError, match="spec.driver.resources.requests.cpu"):
        spec_request("ns/train", DriverSpec(resources={"requests": {"cpu": "lots"}}))


class CountingApi(FakeApi):
    """`FakeApi` that counts the Secret reads made."""

    def __init__(self) -> None:
        super().__init__()
        self.secret_reads = 0

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.secret_reads += 1
        return super().get_secret(namespace, name)


def restarted_operator(tmp_path: Path) -> tuple[DriverPods, CountingApi, str, list[float]]:
    """An operator that restarted after starting the `train` program's driver, on a clock the test moves."""
    api = CountingApi()
    DriverPods(api, tmp_path, SETTINGS).start(launch())  # type: ignore[arg-type]
    now = [0.0]
    restarted = DriverPods(api, tmp_path, SETTINGS, clock=lambda: now[0])  # type: ignore[arg-type]
    api.secret_reads = 0
    return restarted, api, token_of(api), now


def test_after_one_read_a_wrong_token_for_the_program_is_refused_without_reading_its_secret(
    tmp_path: Path,
) -> None:
    drivers, api, token, _ = restarted_operator(tmp_path)
    with pytest.raises(UnknownProgramToken):
        drivers.report_progress("forged", 0, {}, ("ns", "train"))
    assert api.secret_reads == 1
    for _ in range(50):
        with pytest.raises(UnknownProgramToken):
            drivers.report_progress("forged-again", 0, {}, ("ns", "train"))
    assert api.secret_reads == 1
    assert drivers.report_progress(token, 0, {}, ("ns", "train")) is False  # the read taught the real token
    assert api.secret_reads == 1


def test_tokens_naming_a_program_without_a_secret_read_it_once_per_hold(tmp_path: Path) -> None:
    drivers, api, _, now = restarted_operator(tmp_path)
    for _ in range(20):
        with pytest.raises(UnknownProgramToken):
            drivers.report_progress("forged", 0, {}, ("ns", "ghost"))
    assert api.secret_reads == 1
    now[0] = 60.0
    with pytest.raises(UnknownProgramToken):
        drivers.report_progress("forged", 0, {}, ("ns", "ghost"))
    assert api.secret_reads == 2


def test_tokens_naming_invented_programs_cost_the_api_server_a_bounded_number_of_reads(tmp_path: Path) -> None:
    from pathways_operator.core.token_read_back import BURST, RATE_PER_S

    drivers, api, token, now = restarted_operator(tmp_path)
    for i in range(500):
        with pytest.raises(UnknownProgramToken):
            drivers.report_progress("forged", 0, {}, ("ns", f"invented-{i}"))
    assert api.secret_reads == BURST
    with pytest.raises(UnknownProgramToken):  # the flood spent the reads: the real driver retries
        drivers.report_progress(token, 0, {}, ("ns", "train"))
    now[0] = 1.0 / RATE_PER_S
    assert drivers.report_progress(token, 0, {}, ("ns", "train")) is False
    assert api.secret_reads == BURST + 1


def test_a_restarted_operator_counts_a_pod_deleted_while_it_was_away_as_lost_where_the_status_says_it_ran(
    tmp_path: Path,
) -> None:
    drivers, api = pods(tmp_path)
    drivers.start(launch())
    api.pods["train-driver"]["status"] = {"phase": "Running"}
    del api.pods["train-driver"]  # deleted while no operator ran
    restarted = DriverPods(api, tmp_path, SETTINGS)  # type: ignore[arg-type]
    assert restarted.status("ns", "train", "uid-1").state is DriverState.ABSENT  # nothing says it ran
    lost = restarted.status("ns", "train", "uid-1", ran_before=True)
    assert lost.state is DriverState.EXITED and lost.reported is Reported.LOST and lost.retryable
    assert "train-driver was deleted before it reported" in lost.error
