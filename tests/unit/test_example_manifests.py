"""Every example manifest would run on a default operator: entrypoints allowed and importable.

``test_crds`` checks the manifests against the schemas; this checks what the schema
cannot: the entrypoint starts with the operator's default ``--allowed-entrypoints``
prefix and imports to a callable (the driver's own loader), and a ``ref`` names a
VirtualSlice another example manifest defines. The program file for ``pathways
compile`` compiles, and its slices are what the manifest it writes names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pathways.cli import compile_program_file
from pathways.driver import load_entrypoint
from pathways_operator.k8s.program_reconciler import DEFAULT_ALLOWED_ENTRYPOINTS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "manifests"


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict)
    ]


PROGRAMS = [(name, doc) for name, doc in documents() if doc["kind"] == "PathwaysProgram"]
SLICES = {doc["metadata"]["name"] for _, doc in documents() if doc["kind"] == "VirtualSlice"}


def test_there_are_program_examples() -> None:
    assert len(PROGRAMS) >= 4


@pytest.mark.parametrize(("file", "doc"), PROGRAMS, ids=[name for name, _ in PROGRAMS])
def test_entrypoint_is_allowed_by_default_and_imports_to_a_callable(file: str, doc: dict[str, Any]) -> None:
    entrypoint = doc["spec"]["source"]["entrypoint"]
    assert entrypoint.startswith(DEFAULT_ALLOWED_ENTRYPOINTS), (
        f"{file}: spec.source.entrypoint {entrypoint!r} needs --allowed-entrypoints beyond the default"
    )
    assert callable(load_entrypoint(entrypoint))


@pytest.mark.parametrize(("file", "doc"), PROGRAMS, ids=[name for name, _ in PROGRAMS])
def test_slice_refs_name_an_example_virtualslice(file: str, doc: dict[str, Any]) -> None:
    for i, entry in enumerate(doc["spec"]["slices"]):
        if "ref" in entry:
            assert entry["ref"] in SLICES, f"{file}: spec.slices[{i}].ref {entry['ref']!r} is in no example"


def test_program_file_compiles_to_a_program_on_its_own_slice() -> None:
    config_map, program, _ = compile_program_file(ROOT / "examples" / "paper_program.py", None, "ns", 2)
    assert program["metadata"]["name"] == "paper-program"
    assert program["spec"]["source"] == {"configMapRef": {"name": config_map["metadata"]["name"]}}
    (entry,) = program["spec"]["slices"]
    assert entry["template"] == {"devices": 2}
