"""The CRDs in crds/: structure, documentation, immutability guards, and agreement with the core.

These are static checks; the CEL rules themselves are exercised against a real API
server in the cluster tier. A small structural validator checks the example
manifests against the schemas (types, required fields, enums, bounds, patterns,
unknown fields), which is what the API server does before CEL.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from pathways_operator.core.object_names import LABEL_VALUE_MAX
from pathways_operator.core.phases import ProgramPhase, SlicePhase
from pathways_operator.core.reasons import Reason

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
EXAMPLES = ROOT / "examples" / "manifests"

Schema = Mapping[str, Any]


def load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((CRDS / name).read_text())
    assert isinstance(doc, dict)
    return doc


VSLICE = load("virtualslice.yaml")
PROGRAM = load("pathwaysprogram.yaml")
BY_KIND = {"VirtualSlice": VSLICE, "PathwaysProgram": PROGRAM}


def version(crd: Mapping[str, Any]) -> dict[str, Any]:
    (v,) = crd["spec"]["versions"]
    assert isinstance(v, dict)
    return v


def schema(crd: Mapping[str, Any]) -> dict[str, Any]:
    s = version(crd)["schema"]["openAPIV3Schema"]
    assert isinstance(s, dict)
    return s


def walk(node: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every sub-schema with its dotted path (list items as ``[]``)."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


def at(root: Schema, path: str) -> Schema:
    node = root
    for part in path.strip(".").split("."):
        node = node["properties"][part]
    return node


def rules(node: Schema) -> list[dict[str, str]]:
    return list(node.get("x-kubernetes-validations", []))


@pytest.mark.parametrize("crd", [VSLICE, PROGRAM], ids=["VirtualSlice", "PathwaysProgram"])
def test_identity_and_subresources(crd: dict[str, Any]) -> None:
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    spec = crd["spec"]
    assert spec["group"] == "pathways.dev"
    assert crd["metadata"]["name"] == f"{spec['names']['plural']}.pathways.dev"
    v = version(crd)
    assert (v["name"], v["served"], v["storage"]) == ("v1alpha1", True, True)
    assert v["subresources"] == {"status": {}}
    assert schema(crd)["type"] == "object"


def test_short_names() -> None:
    assert VSLICE["spec"]["names"]["shortNames"] == ["vslice", "vs"]
    assert PROGRAM["spec"]["names"]["shortNames"] == ["pwprog", "pwp"]


@pytest.mark.parametrize("crd", [VSLICE, PROGRAM], ids=["VirtualSlice", "PathwaysProgram"])
def test_every_property_is_described(crd: dict[str, Any]) -> None:
    # The API server forbids anything but the type on metadata.
    undocumented = [p for p, node in walk(schema(crd)) if p != ".metadata" and not node.get("description")]
    assert undocumented == []


@pytest.mark.parametrize("crd", [VSLICE, PROGRAM], ids=["VirtualSlice", "PathwaysProgram"])
def test_defaults_are_documented(crd: dict[str, Any]) -> None:
    for path, node in walk(schema(crd)):
        if "default" in node and node["default"] != {}:
            assert f"Default {str(node['default']).lower()}" in node["description"].replace(
                "Default:", "Default"
            ), path


@pytest.mark.parametrize("crd", [VSLICE, PROGRAM], ids=["VirtualSlice", "PathwaysProgram"])
def test_printer_columns_point_at_schema_properties_of_the_same_type(crd: dict[str, Any]) -> None:
    root = schema(crd)
    columns = version(crd)["additionalPrinterColumns"]
    assert columns[-1] == {
        "name": "Age",
        "type": "date",
        "jsonPath": ".metadata.creationTimestamp",
        "description": columns[-1]["description"],
    }
    for col in columns[:-1]:
        assert col["description"]
        node = at(root, col["jsonPath"])
        assert node["type"] == col["type"], col


def test_printer_column_names() -> None:
    names = {kind: [c["name"] for c in version(crd)["additionalPrinterColumns"]] for kind, crd in BY_KIND.items()}
    assert names == {
        "VirtualSlice": ["Devices", "Island", "Phase", "Ready", "Restarts", "Age"],
        "PathwaysProgram": ["Slices", "Phase", "Steps", "Weight", "Age"],
    }


def test_phase_enums_are_the_core_phases() -> None:
    assert at(schema(VSLICE), "status.phase")["enum"] == [str(p) for p in SlicePhase]
    assert at(schema(PROGRAM), "status.phase")["enum"] == [str(p) for p in ProgramPhase]


@pytest.mark.parametrize("crd", [VSLICE, PROGRAM], ids=["VirtualSlice", "PathwaysProgram"])
def test_conditions_are_metav1_shaped_and_accept_every_reason(crd: dict[str, Any]) -> None:
    conds = at(schema(crd), "status.conditions")
    assert conds["x-kubernetes-list-type"] == "map"
    assert conds["x-kubernetes-list-map-keys"] == ["type"]
    item = conds["items"]
    assert set(item["properties"]) == {
        "type", "status", "reason", "message", "observedGeneration", "lastTransitionTime"
    }
    pattern = re.compile(item["properties"]["reason"]["pattern"])
    assert all(pattern.fullmatch(str(r)) for r in Reason)


@pytest.mark.parametrize("crd", [VSLICE, PROGRAM], ids=["VirtualSlice", "PathwaysProgram"])
def test_kopf_bookkeeping_survives_pruning(crd: dict[str, Any]) -> None:
    assert at(schema(crd), "status.kopf")["x-kubernetes-preserve-unknown-fields"] is True


@pytest.mark.parametrize(
    ("crd", "path", "field", "kind"),
    [
        (VSLICE, "spec.devices", "devices", "VirtualSlice"),
        (VSLICE, "spec.devicesPerHost", "devicesPerHost", "VirtualSlice"),
        (VSLICE, "spec.island", "island", "VirtualSlice"),
        (PROGRAM, "spec.slices", "slices", "PathwaysProgram"),
        (PROGRAM, "spec.source", "source", "PathwaysProgram"),
        (PROGRAM, "spec.steps", "steps", "PathwaysProgram"),
    ],
)
def test_immutable_fields_are_guarded_with_a_fix_in_the_message(
    crd: dict[str, Any], path: str, field: str, kind: str
) -> None:
    guard = [r for r in rules(at(schema(crd), path)) if r["rule"] == "self == oldSelf"]
    assert guard == [{"rule": "self == oldSelf", "message": f"{field} is immutable; create a new {kind}"}]


def test_optional_immutable_fields_cannot_be_added_or_removed() -> None:
    spec_rules = {r["rule"] for r in rules(at(schema(VSLICE), "spec"))}
    assert "has(self.devicesPerHost) == has(oldSelf.devicesPerHost)" in spec_rules
    assert "has(self.island) == has(oldSelf.island)" in spec_rules


def test_steps_are_documented_as_immutable() -> None:
    assert "slices, source and steps are immutable" in " ".join(at(schema(PROGRAM), "spec")["description"].split())
    assert "Immutable" in at(schema(PROGRAM), "spec.steps")["description"]


def _create_only_rules(crd: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Root rules that run on create only: names cannot change, and stored objects stay updatable."""
    found = [r for r in rules(schema(crd)) if r.get("optionalOldSelf")]
    assert all(r["rule"].startswith("oldSelf.hasValue() || ") for r in found), found
    return found


@pytest.mark.parametrize(("crd", "label"), [(VSLICE, "pathways.dev/slice"), (PROGRAM, "pathways.dev/program")],
                         ids=["VirtualSlice", "PathwaysProgram"])
def test_names_longer_than_a_label_value_are_refused_on_create(crd: dict[str, Any], label: str) -> None:
    (name_rule,) = [r for r in _create_only_rules(crd) if r["rule"].endswith("self.metadata.name.size() <= 63")]
    assert name_rule["message"].startswith(f"metadata.name may have at most {LABEL_VALUE_MAX} characters")
    assert label in name_rule["message"]


def test_template_slice_names_derived_from_the_program_name_are_bounded() -> None:
    derived = [r for r in _create_only_rules(PROGRAM) if "s.name.size()" in r["rule"]]
    assert [" ".join(r["rule"].split()) for r in derived] == [
        "oldSelf.hasValue() || self.spec.slices.all(s, !has(s.template) || "
        "self.metadata.name.size() + 1 + s.name.size() <= 63)"
    ]
    assert derived[0]["message"].startswith(
        "metadata.name and spec.slices[].name make a VirtualSlice name longer than 63 characters"
    )


def _volume_pattern() -> re.Pattern[str]:
    (rule,) = rules(at(schema(PROGRAM), "spec.checkpoint.volume"))
    found = re.fullmatch(r"self\.matches\('(.*)'\)", rule["rule"])
    assert found is not None, rule
    assert "not a path" in rule["message"]
    return re.compile(found.group(1))


@pytest.mark.parametrize(
    ("volume", "ok"),
    [("training-ckpt", True), ("ckpt.v2", True), ("a", True),
     ("../../../../tmp/x", False), ("/tmp/abs", False), ("../other-namespace-claim", False),
     ("..", False), (".", False), ("a/b", False), ("a..b", False), ("Ckpt", False), ("-a", False)],
)
def test_checkpoint_volume_accepts_only_a_claim_name(volume: str, ok: bool) -> None:
    assert bool(_volume_pattern().search(volume)) is ok
    assert at(schema(PROGRAM), "spec.checkpoint.volume")["maxLength"] == 253


def test_program_slice_and_source_rules() -> None:
    slices = at(schema(PROGRAM), "spec.slices")
    assert slices["minItems"] == 1
    assert "self.all(s, self.exists_one(t, t.name == s.name))" in {r["rule"] for r in rules(slices)}
    assert {r["rule"] for r in rules(slices["items"])} == {"has(self.ref) != has(self.template)"}
    source = at(schema(PROGRAM), "spec.source")
    assert "has(self.entrypoint) != has(self.configMapRef)" in {r["rule"] for r in rules(source)}


def _without_transition_rules(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _without_transition_rules(v) for k, v in node.items() if k != "x-kubernetes-validations"}
        kept = [r for r in node.get("x-kubernetes-validations", []) if "oldSelf" not in r["rule"]]
        if kept:
            out["x-kubernetes-validations"] = kept
        return out
    if isinstance(node, list):
        return [_without_transition_rules(v) for v in node]
    return node


def test_inline_template_is_the_virtualslice_spec() -> None:
    """Same fields, bounds and defaults; only transition rules differ (they cannot live in list items)."""
    template = at(schema(PROGRAM), "spec.slices")["items"]["properties"]["template"]
    vspec = _without_transition_rules(at(schema(VSLICE), "spec"))
    for key in ("properties", "required", "x-kubernetes-validations", "type"):
        assert template[key] == vspec[key], key


@pytest.mark.parametrize(
    ("value", "ok"),
    [("models.lm:train_step", True), ("lm:step", True), ("_p.q_1:_f2", True),
     ("models.lm", False), ("models.lm:a.b", False), ("1lm:f", False), ("lm:", False)],
)
def test_entrypoint_pattern(value: str, ok: bool) -> None:
    pattern = at(schema(PROGRAM), "spec.source.entrypoint")["pattern"]
    assert bool(re.search(pattern, value)) is ok


def test_weight_is_strictly_positive_with_default_one() -> None:
    weight = at(schema(PROGRAM), "spec.weight")
    assert (weight["minimum"], weight["exclusiveMinimum"], weight["default"]) == (0, True, 1)


# --- example manifests -----------------------------------------------------------------


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,),
    "integer": (int,), "number": (int, float), "boolean": (bool,),
}


def structural_errors(value: Any, node: Schema, path: str = "") -> list[str]:
    """What the API server's structural validation would reject (no CEL, no formats)."""
    expected = _TYPES[node["type"]]
    if isinstance(value, bool) and node["type"] != "boolean" or not isinstance(value, expected):
        return [f"{path}: expected {node['type']}, got {type(value).__name__}"]
    errors: list[str] = []
    if "enum" in node and value not in node["enum"]:
        errors.append(f"{path}: {value!r} not in {node['enum']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in node and (value < node["minimum"] or (node.get("exclusiveMinimum") and value == node["minimum"])):
            errors.append(f"{path}: {value} below minimum {node['minimum']}")
        if "maximum" in node and value > node["maximum"]:
            errors.append(f"{path}: {value} above maximum {node['maximum']}")
    if isinstance(value, str):
        if "pattern" in node and not re.search(node["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {node['pattern']}")
        if len(value) > node.get("maxLength", len(value)) or len(value) < node.get("minLength", 0):
            errors.append(f"{path}: length {len(value)} out of bounds")
    if isinstance(value, list):
        if not node.get("minItems", 0) <= len(value) <= node.get("maxItems", len(value)):
            errors.append(f"{path}: {len(value)} items out of bounds")
        for i, item in enumerate(value):
            errors += structural_errors(item, node["items"], f"{path}[{i}]")
    if isinstance(value, dict):
        props = node.get("properties", {})
        errors += [f"{path}.{r}: required" for r in node.get("required", []) if r not in value]
        if len(value) > node.get("maxProperties", len(value)):
            errors.append(f"{path}: more than {node['maxProperties']} properties")
        for key, item in value.items():
            if key in props:
                if path == "" and key == "metadata":
                    continue
                errors += structural_errors(item, props[key], f"{path}.{key}")
            elif not node.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{key}: unknown field")
    return errors


def examples() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def test_the_three_examples_exist() -> None:
    docs = [yaml.safe_load(p.read_text()) for p in examples()]
    slices = [d for d in docs if d["kind"] == "VirtualSlice"]
    programs = [d for d in docs if d["kind"] == "PathwaysProgram"]
    templates = [e["template"] for p in programs for e in p["spec"]["slices"] if "template" in e]
    assert any(s["spec"]["devices"] == 8 for s in slices) or any(t["devices"] == 8 for t in templates)
    shared = {s["metadata"]["name"] for s in slices}
    assert any(
        p["spec"].get("weight") == 2 and any(s.get("ref") in shared for s in p["spec"]["slices"])
        for p in programs
    )
    assert any(any("template" in s for s in p["spec"]["slices"]) for p in programs)


@pytest.mark.parametrize("path", examples(), ids=lambda p: p.name)
def test_examples_pass_structural_validation(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "pathways.dev/v1alpha1"
    assert structural_errors(doc, schema(BY_KIND[doc["kind"]])) == []


def test_validator_catches_what_the_server_would() -> None:
    bad = {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "VirtualSlice",
        "metadata": {"name": "x"},
        "spec": {"devices": 0, "devicesPerhost": 2, "failurePolicy": {"maxRestarts": -1}},
    }
    errors = structural_errors(bad, schema(VSLICE))
    assert errors == [
        ".spec.devices: 0 below minimum 1",
        ".spec.devicesPerhost: unknown field",
        ".spec.failurePolicy.maxRestarts: -1 below minimum 0",
    ]
