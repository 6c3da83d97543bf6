"""The objects a PathwaysProgram owns, made and removed against the API.

Inline slices (``spec.slices[i].template``) become VirtualSlices
``<program>-<name>``, owned by the program and labelled as one admission group
(admitted whole or not at all); results go into ConfigMap ``<program>-results``
and the end of the driver's log into ``<program>-driver-log``, both owned by
the program. A ConfigMap of those names that the program does not own is
never written, and a slice is deleted only when the program is its
controller. A deleted program's checkpoint directory is deleted too.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path

from pathways_wire.driver_protocol import DRIVER_LOG_KEY, driver_log_config_map
from pathways_operator.core.ownership import Ownership, owner_refs, ownership
from pathways_operator.core.program_lifecycle import results_owner_problem
from pathways_operator.k8s.cluster_api import AlreadyExists, ClusterApi, Json, KubeError
from pathways_operator.k8s.pathways_program import ProgramObject
from pathways_wire.kube_names import (
    ADMISSION_GROUP_LABEL,
    ADMISSION_GROUP_SIZE_ANNOTATION,
    API_VERSION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PROGRAM_KIND,
    PROGRAM_LABEL,
    SLICE_KIND,
)
from pathways_operator.k8s.virtual_slice import VirtualSliceObject

log = logging.getLogger(__name__)


def create_inline_slice(api: ClusterApi, program: ProgramObject, name: str, index: int) -> None:
    template = program.spec.slices[index].template
    assert template is not None
    spec = template.to_manifest()
    if program.spec.priority_class and "priorityClassName" not in spec:
        spec["priorityClassName"] = program.spec.priority_class
    inline = sum(1 for entry in program.spec.slices if entry.template is not None)
    body = {
        "apiVersion": API_VERSION,
        "kind": SLICE_KIND,
        "metadata": {
            "name": name,
            "namespace": program.namespace,
            "labels": {
                PROGRAM_LABEL: program.name,
                MANAGED_BY_LABEL: MANAGED_BY,
                ADMISSION_GROUP_LABEL: program.uid,  # admitted whole or not at all
            },
            "annotations": {ADMISSION_GROUP_SIZE_ANNOTATION: str(inline)},
            "ownerReferences": [program.owner_reference()],
        },
        "spec": spec,
    }
    try:
        api.create_slice(program.namespace, body)
    except AlreadyExists:
        return  # created by an earlier look whose status write did not land
    log.info("%s: created VirtualSlice %s from spec.slices[%d].template", program.key, name, index)


def delete_inline_slices(api: ClusterApi, namespace: str, name: str, uid: str) -> None:
    for raw in api.list_slices(namespace):
        vslice = VirtualSliceObject.from_manifest(raw)
        owned = ownership(
            owner_refs(raw.get("metadata") or {}), kind=PROGRAM_KIND, name=name, uid=uid
        ) is Ownership.OWNED
        if vslice.labels.get(PROGRAM_LABEL) == name and owned and not vslice.deleting:
            api.delete_slice(namespace, vslice.name, vslice.uid)


def delete_checkpoints(root: Path | None, namespace: str, name: str, uid: str) -> None:
    """Delete the checkpoint directory of a deleted program (under any claim of its namespace)."""
    if root is None or not uid:
        return
    base = (root / namespace).resolve()
    for found in base.glob(f"*/{name}-{uid[:8]}"):
        if found.is_dir() and found.resolve().parent.parent == base:
            shutil.rmtree(found, ignore_errors=True)
            log.info("%s/%s: deleted its checkpoints %s", namespace, name, found)


def config_map_owner_problem(api: ClusterApi, program: ProgramObject, name: str) -> str | None:
    """Why ConfigMap ``name`` may not be written: it exists and the program does not own it."""
    raw = api.get_configmap(program.namespace, name)
    if raw is None:
        return None
    owners = [str(o.get("uid") or "") for o in (raw.get("metadata") or {}).get("ownerReferences") or []]
    return results_owner_problem(name, owners, program.uid)


def apply_owned_config_map(api: ClusterApi, program: ProgramObject, name: str, data: Mapping[str, str]) -> None:
    """Create or replace ConfigMap ``name``, owned by and labelled with the program."""
    body: Json = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": program.namespace,
            "labels": {PROGRAM_LABEL: program.name, MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [program.owner_reference()],
        },
        "data": dict(data),
    }
    api.apply_configmap(program.namespace, body)


def store_results(api: ClusterApi, program: ProgramObject, name: str, results: Mapping[str, object]) -> None:
    """The program's results, one JSON value per key; KubeError when the API server refuses them."""
    apply_owned_config_map(api, program, name, {key: json.dumps(value) for key, value in results.items()})


def keep_driver_log(api: ClusterApi, program: ProgramObject, text: str) -> None:
    """Copy the end of the driver's log into ConfigMap ``<program>-driver-log``, owned by the
    program: ``pathways logs program`` reads it after the program's slices are gone."""
    if not text:
        return  # no driver ever ran (the spec was refused)
    name = driver_log_config_map(program.name)
    problem = config_map_owner_problem(api, program, name)
    if problem is not None:
        log.warning("%s: the driver's log is not kept: %s", program.key, problem)
        return
    try:
        apply_owned_config_map(api, program, name, {DRIVER_LOG_KEY: text})
    except KubeError as err:
        log.warning("%s: keeping the driver's log in ConfigMap %s: %s", program.key, name, err)
