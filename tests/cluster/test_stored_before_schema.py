"""Objects stored before the CRDs refused them: Failed naming the field, and deletable.

The CRDs refuse names too long for the labels and VirtualSlices the operator derives
from them, and checkpoint volumes that are paths. A cluster whose CRDs were installed by
an older release can still hold such objects. ``older_schema`` applies the CRDs without
those rules, stores the objects, and puts the current CRDs back, as an upgrade would;
then the operator must fail each object with a message naming the field, create nothing
for it, write nothing outside the namespace's checkpoint directory, and
``kubectl delete`` must complete: a finalizer the operator cannot remove would hold the
object forever.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml

from tests.cluster.builders import Manifest, inline_slice, program, ref_slice, virtual_slice
from pathways_devcluster.controlplane import REPO_ROOT
from tests.cluster.harness import Cluster, Objects, OperatorProcess, condition

VERDICT_S = 60.0
DELETE_S = 90.0
SCHEMA_S = 30.0

LONG_SLICE = "a-virtualslice-name-longer-than-the-63-characters-of-label-value"  # 64
LONG_PROGRAM = "p" * 64
PROGRAM_50 = "a-program-whose-name-is-fifty-characters-long-0123"


def current_crds() -> list[Manifest]:
    return [yaml.safe_load((REPO_ROOT / "crds" / name).read_text())
            for name in ("virtualslice.yaml", "pathwaysprogram.yaml")]


def older(crd: Manifest) -> Manifest:
    """``crd`` as an older release installed it: no name rules, no checkpoint.volume rule."""
    crd = copy.deepcopy(crd)
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    root.pop("x-kubernetes-validations", None)
    spec = root["properties"]["spec"]["properties"]
    if "checkpoint" in spec:
        spec["checkpoint"]["properties"]["volume"].pop("x-kubernetes-validations", None)
    return crd


def checkpointed(name: str, volume: str) -> Manifest:
    manifest = program(name, "examples.programs:train_regression", inline_slice("main", 2), steps=2)
    manifest["spec"]["checkpoint"] = {"everySteps": 1, "volume": volume}
    return manifest


PROBES = (
    virtual_slice(LONG_SLICE, 2),
    program(PROGRAM_50, "examples.programs:paper_example", inline_slice("s" * 13, 2)),
    checkpointed("probe", "../probe"),
)


def _apply_crds(cluster: Cluster, docs: list[Manifest]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))


def _accepted(cluster: Cluster, namespace: str) -> list[bool]:
    return [
        cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                        input=json.dumps(probe), check=False).returncode == 0
        for probe in PROBES
    ]


@contextmanager
def older_schema(cluster: Cluster, namespace: str) -> Iterator[None]:
    """The CRDs without the new rules while the block runs; the current ones after it."""
    _apply_crds(cluster, [older(crd) for crd in current_crds()])
    cluster.poll(lambda: all(_accepted(cluster, namespace)), timeout=SCHEMA_S, interval=0.5,
                 what="the API server serving the older CRDs")
    try:
        yield
    finally:
        _apply_crds(cluster, current_crds())
        cluster.poll(lambda: not any(_accepted(cluster, namespace)), timeout=SCHEMA_S, interval=0.5,
                     what="the API server serving the current CRDs")


def deletes(objects: Objects, plural: str, name: str) -> None:
    """``kubectl delete`` returns once the object is gone (every finalizer removed)."""
    result = objects.cluster.kubectl("delete", "-n", objects.namespace, plural, name,
                                     f"--timeout={DELETE_S:.0f}s", check=False, timeout=DELETE_S + 30)
    assert result.returncode == 0, f"kubectl delete {plural}/{name}: {result.stderr}"
    assert objects.get(plural, name) is None


def still_updatable(objects: Objects, plural: str, name: str) -> None:
    """An update under the current CRDs (the rules run on create only) is accepted."""
    objects.cluster.kubectl("annotate", "-n", objects.namespace, plural, name, "example.com/touched=yes")


@pytest.mark.timeout(240, func_only=True)
def test_slice_stored_with_a_name_too_long_for_a_label_fails_naming_it_and_deletes(
    objects: Objects, operator: OperatorProcess
) -> None:
    with older_schema(objects.cluster, objects.namespace):
        objects.apply(virtual_slice(LONG_SLICE, 2))
    still_updatable(objects, "virtualslices", LONG_SLICE)

    failed = objects.wait_slice(LONG_SLICE, "Failed", VERDICT_S, operator)
    message = condition(failed, "Ready")["message"]
    assert message.startswith(f"metadata.name {LONG_SLICE!r} is 64 characters; a VirtualSlice name may "
                              "have at most 63"), message
    assert condition(failed, "Ready")["reason"] == "InvalidSpec"
    assert objects.core.list_namespaced_pod(objects.namespace).items == []

    deletes(objects, "virtualslices", LONG_SLICE)
    assert operator.alive()


@pytest.mark.timeout(240, func_only=True)
@pytest.mark.parametrize(
    ("manifest", "words"),
    [
        (program(LONG_PROGRAM, "examples.programs:paper_example", ref_slice("main", "shared")),
         f"metadata.name {LONG_PROGRAM!r} is 64 characters; a PathwaysProgram name may have at most 63"),
        (program(PROGRAM_50, "examples.programs:paper_example", inline_slice("main", 2),
                 inline_slice("s" * 13, 2)),
         f"metadata.name and spec.slices[1].name make VirtualSlice '{PROGRAM_50}-{'s' * 13}', 64 characters"),
    ],
    ids=["program-name", "derived-slice-name"],
)
def test_program_stored_with_names_too_long_fails_naming_them_and_deletes(
    manifest: Manifest, words: str, objects: Objects, operator: OperatorProcess
) -> None:
    name = manifest["metadata"]["name"]
    with older_schema(objects.cluster, objects.namespace):
        objects.apply(manifest)
    still_updatable(objects, "pathwaysprograms", name)

    failed = objects.wait_program(name, {"Failed", "Succeeded"}, VERDICT_S, operator)
    assert failed["status"]["phase"] == "Failed", failed["status"]
    assert words in condition(failed, "Failed")["message"]
    created = objects.custom.list_namespaced_custom_object("pathways.dev", "v1alpha1", objects.namespace,
                                                           "virtualslices")["items"]
    assert created == []

    deletes(objects, "pathwaysprograms", name)
    assert operator.alive()


@pytest.mark.timeout(240, func_only=True)
def test_checkpoint_volume_stored_as_a_path_fails_naming_it_and_writes_nothing(
    objects: Objects, operator: OperatorProcess
) -> None:
    escaped = f"escaped-{objects.namespace}"
    volume = f"../../{escaped}"  # <root>/<namespace>/../../x is <state-dir>/x
    with older_schema(objects.cluster, objects.namespace):
        objects.apply(checkpointed("climber", volume))

    failed = objects.wait_program("climber", {"Failed", "Succeeded"}, VERDICT_S, operator)
    assert failed["status"]["phase"] == "Failed", failed["status"]
    message = condition(failed, "Failed")["message"]
    assert message.startswith(f"spec.checkpoint.volume {volume!r} is not the name of a PersistentVolumeClaim")
    assert f"give the name of a claim in namespace {objects.namespace}" in message
    assert not (operator.state_dir / escaped).exists()
    assert not (operator.state_dir / "checkpoints" / objects.namespace).exists()
    created = objects.custom.list_namespaced_custom_object("pathways.dev", "v1alpha1", objects.namespace,
                                                           "virtualslices")["items"]
    assert created == []

    deletes(objects, "pathwaysprograms", "climber")


@pytest.mark.parametrize(
    "manifest",
    [
        virtual_slice("s" * 63, 2),
        program("p" * 63, "examples.programs:paper_example", ref_slice("main", "shared")),
        program(PROGRAM_50, "examples.programs:paper_example", inline_slice("s" * 12, 2)),
        checkpointed("keeper", "training-ckpt.v2"),
    ],
    ids=["slice-63", "program-63", "derived-slice-63", "claim-name"],
)
def test_names_at_the_limit_and_claim_names_are_accepted(
    manifest: Manifest, cluster: Cluster, namespace: str, crds: None
) -> None:
    result = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                             input=json.dumps(manifest), check=False)
    assert result.returncode == 0, result.stderr
