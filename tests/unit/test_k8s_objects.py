"""VirtualSlice and PathwaysProgram objects as the operator reads and writes them
(``k8s/virtual_slice.py``, ``k8s/pathways_program.py``): defaults applied, status
round-trips, and what junk in a field turns into."""

from __future__ import annotations

from pathways_operator.core.phases import ProgramPhase, SlicePhase
from pathways_operator.k8s.pathways_program import ProgramObject, ProgramStatus
from pathways_operator.k8s.virtual_slice import (
    DEFAULT_MAX_RESTARTS,
    HostRecord,
    SliceSpec,
    SliceStatus,
    VirtualSliceObject,
    parse_timestamp,
)
from tests.unit.k8s_builders import pathways_program, virtual_slice

CONDITION = {"type": "Ready", "status": "True", "reason": "HostsReady", "message": "2/2 hosts ready",
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}  # fmt: skip


def test_slice_spec_defaults() -> None:
    spec = VirtualSliceObject.from_manifest(virtual_slice("s", 8)).spec
    assert spec == SliceSpec(devices=8)
    assert spec.devices_per_host is None and spec.island is None and spec.max_restarts == DEFAULT_MAX_RESTARTS


def test_slice_spec_ignores_values_of_the_wrong_type() -> None:
    spec = SliceSpec.from_manifest({"devices": True, "devicesPerHost": "4", "failurePolicy": {"maxRestarts": 1.5}})
    assert spec.devices == 0 and spec.devices_per_host is None and spec.max_restarts == DEFAULT_MAX_RESTARTS


def test_slice_spec_round_trips_through_a_template() -> None:
    spec = SliceSpec(devices=4, devices_per_host=2, island="island-b", image="i:1",
                     resources={"requests": {"cpu": "1"}}, max_restarts=5, suspend=True, priority_class="high")  # fmt: skip
    assert SliceSpec.from_manifest(spec.to_manifest()) == spec
    assert SliceSpec(devices=2).to_manifest() == {"devices": 2, "failurePolicy": {"maxRestarts": DEFAULT_MAX_RESTARTS}}


def test_slice_status_round_trips() -> None:
    status = SliceStatus.from_manifest({
        "phase": "Ready", "conditions": [CONDITION], "island": "island-a", "restarts": 1, "readyHosts": "2/2",
        "hosts": [{"index": 0, "pod": "s-0", "node": "a-0", "podIP": "10.0.0.1", "devices": 4}],
        "observedGeneration": 3,
    })  # fmt: skip
    assert status.phase is SlicePhase.READY and status.restarts == 1
    assert status.hosts == (HostRecord(0, "a-0", 4, "s-0", "10.0.0.1"),)
    assert status.conditions[0].reason == "HostsReady"
    assert SliceStatus.from_manifest(status.to_manifest()) == status


def test_unknown_phase_reads_as_none() -> None:
    assert SliceStatus.from_manifest({"phase": "Exploded"}).phase is None
    assert ProgramStatus.from_manifest({"phase": "Exploded"}).phase is None


def test_slice_object_identity_and_references() -> None:
    raw = virtual_slice("s", 8, namespace="team")
    raw["metadata"]["deletionTimestamp"] = "2026-01-02T00:00:00Z"
    vslice = VirtualSliceObject.from_manifest(raw)
    assert vslice.key == "team/s" and vslice.deleting and vslice.generation == 1
    assert vslice.created == parse_timestamp("2026-01-01T00:00:00Z") > 0
    assert vslice.owner_reference()["uid"] == "uid-s" and vslice.owner_reference()["controller"]
    assert vslice.reference()["metadata"] == {"name": "s", "namespace": "team", "uid": "uid-s"}
    assert parse_timestamp("") == 0


def test_program_spec_reads_refs_templates_and_sources() -> None:
    raw = pathways_program(
        "p", {"name": "main", "ref": "shared"}, {"name": "own", "template": {"devices": 2}},
        source={"entrypoint": "examples.programs:paper_example"}, args={"lr": 0.1}, steps=5, weight=2,
    )
    program = ProgramObject.from_manifest(raw)
    spec = program.spec
    assert [(s.name, s.ref) for s in spec.slices] == [("main", "shared"), ("own", None)]
    assert spec.slices[1].template == SliceSpec(devices=2)
    assert spec.entrypoint == "examples.programs:paper_example" and spec.config_map is None
    assert (spec.steps, spec.weight, dict(spec.args)) == (5, 2.0, {"lr": 0.1})
    assert program.inline_slice_name("own") == "p-own" and program.key == "ns/p"
    compiled = ProgramObject.from_manifest(pathways_program("q", source={"configMapRef": {"name": "q-compiled"}}))
    assert compiled.spec.config_map == "q-compiled" and compiled.spec.entrypoint is None


def test_program_spec_defaults_for_missing_or_wrong_values() -> None:
    spec = ProgramObject.from_manifest(pathways_program("p", steps=True, weight="heavy")).spec
    assert (spec.steps, spec.weight, spec.suspend, spec.slices) == (1, 1.0, False, ())


def test_program_status_round_trips_with_results() -> None:
    status = ProgramStatus.from_manifest({
        "phase": "Succeeded", "conditions": [CONDITION], "sliceNames": "main=shared", "stepsCompleted": 3,
        "progress": "3/3", "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:01:00Z",
        "results": {"configMap": "p-results", "keys": ["y", "z"]}, "message": "done", "observedGeneration": 2,
    })  # fmt: skip
    assert status.phase is ProgramPhase.SUCCEEDED and status.results_keys == ("y", "z")
    assert ProgramStatus.from_manifest(status.to_manifest()) == status
    assert ProgramStatus().to_manifest()["results"] is None
