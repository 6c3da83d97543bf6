"""The Helm chart, the image and the kind workflow, checked without helm, Docker or a cluster.

What can drift silently is checked here: the chart's copy of the CRDs against
``crds/``, ``values.yaml`` against ``values.schema.json`` and against what the
templates read, the image's user against the Deployment's ``runAsUser``, and the kind
cluster's worker count against the islands ``helm/label-nodes.sh`` makes. Rendering,
``helm lint`` and server-side validation are the cluster tier's job
(``tests/cluster/test_chart.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kube-pathways"
TEMPLATES = CHART / "templates"
SYNC_HINT = "run `make sync-crds` (copies crds/*.yaml into helm/kube-pathways/crds/)"


def values() -> dict[str, Any]:
    doc = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def values_schema() -> dict[str, Any]:
    doc = json.loads((CHART / "values.schema.json").read_text())
    assert isinstance(doc, dict)
    return doc


# -- CRDs --------------------------------------------------------------------------------


def test_chart_crds_are_byte_for_byte_the_top_level_crds() -> None:
    top = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert top, "crds/ holds no CRDs"
    assert sorted(chart) == sorted(top), f"chart CRD files {sorted(chart)} != {sorted(top)}: {SYNC_HINT}"
    stale = [name for name in top if chart[name] != top[name]]
    assert not stale, f"helm/kube-pathways/crds/{', '.join(stale)} differ from crds/: {SYNC_HINT}"


# -- values ------------------------------------------------------------------------------


class SchemaViolation(AssertionError):
    pass


def validate(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any], path: str) -> None:
    """The subset of JSON Schema that values.schema.json uses (helm checks the rest)."""
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/definitions/")
        return validate(value, root["definitions"][name], root, path)
    types = schema.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else list(types)
        python: dict[str, type | tuple[type, ...]] = {
            "object": dict, "array": list, "string": str, "boolean": bool,
            "integer": int, "number": (int, float),
        }  # fmt: skip
        ok = any(
            isinstance(value, python[t]) and not (t in ("integer", "number") and isinstance(value, bool))
            for t in allowed
        )
        if not ok:
            raise SchemaViolation(f"{path}: {value!r} is not {'/'.join(allowed)}")
    if "enum" in schema and value not in schema["enum"]:
        raise SchemaViolation(f"{path}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        raise SchemaViolation(f"{path}: {value!r} < {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        raise SchemaViolation(f"{path}: {value!r} > {schema['maximum']}")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        raise SchemaViolation(f"{path}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                raise SchemaViolation(f"{path}.{key}: required")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, child in value.items():
            if key in props:
                validate(child, props[key], root, f"{path}.{key}")
            elif extra is False:
                raise SchemaViolation(f"{path}.{key}: not a chart value (known: {sorted(props)})")
            elif isinstance(extra, dict):
                validate(child, extra, root, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            validate(item, schema["items"], root, f"{path}[{i}]")
    return None


def test_default_values_satisfy_the_schema() -> None:
    schema = values_schema()
    validate(values(), schema, schema, "values")


@pytest.mark.parametrize(
    ("override", "complaint"),
    [
        ({"operator": {"loglevel": "info"}}, "values.operator.loglevel: not a chart value"),
        ({"operator": {"logLevel": "verbose"}}, "not in"),
        ({"operator": {"controllerPort": 70000}}, "> 65535"),
        ({"worker": {"devicesPerHost": -1}}, "< 0"),
        ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "not in"),
        ({"operator": {"watchNamespace": "Bad_NS"}}, "does not match"),
    ],
)
def test_schema_rejects_bad_values(override: dict[str, Any], complaint: str) -> None:
    schema = values_schema()
    merged = values()
    for key, sub in override.items():
        merged[key] = {**merged.get(key, {}), **sub}
    with pytest.raises(SchemaViolation, match=re.escape(complaint)):
        validate(merged, schema, schema, "values")


def value_paths(node: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, child in node.items():
        path = f"{prefix}.{key}" if prefix else key
        yield path
        if isinstance(child, dict) and key not in ("resources", "requests", "limits"):
            yield from value_paths(child, path)


def test_templates_read_only_values_that_exist() -> None:
    known = set(value_paths(values()))
    used: dict[str, str] = {}
    for template in sorted(TEMPLATES.iterdir()):
        for match in re.finditer(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()):
            used.setdefault(match.group(1).rstrip("."), template.name)
    unknown = {path: where for path, where in used.items() if path not in known}
    assert not unknown, f"templates read values that values.yaml does not define: {unknown}"
    unused = {
        p for p in known if not any(u == p or u.startswith(p + ".") or p.startswith(u + ".") for u in used)
    }
    assert not unused, f"values.yaml defines values no template reads: {sorted(unused)}"


def test_every_value_is_documented_in_values_yaml() -> None:
    """Each key has a comment right above it, alone or heading a run of one-line keys.

    Keys inside ``resources:`` are data (a ResourceRequirements), not chart fields.
    """
    undocumented: list[str] = []
    resources_indent: int | None = None
    previous = ""
    for line in (CHART / "values.yaml").read_text().splitlines():
        match = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):(.*)$", line)
        if match is not None:
            indent, key, rest = len(match.group(1)), match.group(2), match.group(3).strip()
            if resources_indent is not None and indent > resources_indent:
                previous = line
                continue
            resources_indent = indent if key == "resources" else None
            prev = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):(.*)$", previous)
            in_documented_run = (
                prev is not None and len(prev.group(1)) == indent and prev.group(3).strip() != ""
            )
            if not (previous.strip().startswith("#") or in_documented_run) and rest != "":
                undocumented.append(line.strip())
            elif not previous.strip().startswith("#") and rest == "" and indent > 0:
                undocumented.append(line.strip())
        previous = line
    assert not undocumented, (
        f"values.yaml keys without a comment saying default and allowed values: {undocumented}"
    )


# -- image -------------------------------------------------------------------------------


def test_image_runs_as_the_user_the_deployment_requires() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    deployment = (TEMPLATES / "deployment.yaml").read_text()
    user = re.search(r"^USER (\d+)(?::(\d+))?$", dockerfile, re.M)
    assert user, "the Dockerfile must switch to a numeric non-root USER"
    assert user.group(1) != "0"
    assert f"runAsUser: {user.group(1)}" in deployment
    assert "runAsNonRoot: true" in deployment
    assert "readOnlyRootFilesystem: true" in deployment
    assert re.search(r"^FROM python:3\.11-slim", dockerfile, re.M)


def test_image_has_entrypoints_for_operator_worker_and_sidecar() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for module in ("pathways_operator", "pathways_worker.worker", "pathways_worker.sidecar"):
        assert f"python -m {module} " in dockerfile, f"no entrypoint runs `python -m {module}`"
    assert "command: [python, -m, pathways_operator]" in (TEMPLATES / "deployment.yaml").read_text()


def test_dockerignore_keeps_what_pip_install_needs() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    needed = {"pyproject.toml", "README.md", "client", "operator", "worker"}
    assert not ignored & needed, f".dockerignore excludes {sorted(ignored & needed)}, which `pip install .` needs"
    assert {".git", ".venv"} <= ignored


# -- kind --------------------------------------------------------------------------------


def label_script_plan() -> tuple[list[str], int]:
    """The islands and workers per island that helm/label-nodes.sh assigns."""
    script = (ROOT / "helm" / "label-nodes.sh").read_text()
    islands = re.search(r"^ISLANDS=\(([^)]*)\)$", script, re.M)
    per_island = re.search(r"^WORKERS_PER_ISLAND=(\d+)$", script, re.M)
    assert islands and per_island, "label-nodes.sh must define ISLANDS=(...) and WORKERS_PER_ISLAND=N"
    return islands.group(1).split(), int(per_island.group(1))


def test_kind_config_has_the_workers_the_labelling_script_expects() -> None:
    config = yaml.safe_load((ROOT / "helm" / "kind-config.yaml").read_text())
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [node["role"] for node in config["nodes"]]
    assert roles.count("control-plane") == 1
    islands, per_island = label_script_plan()
    assert islands == ["island-a", "island-b"]
    assert roles.count("worker") == len(islands) * per_island, (
        f"helm/kind-config.yaml has {roles.count('worker')} workers; label-nodes.sh puts "
        f"{per_island} in each of {islands}"
    )
