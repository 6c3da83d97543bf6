"""Hostile and invalid manifests: each is refused, and the operator keeps serving.

Every file of ``bad_manifests/`` states what it tries and how it must be answered, in
its first comment lines::

    # <what the manifest tries>
    # expect: rejected | failed | pending
    # words: <text the answer must contain, naming the field>

``rejected``: the API server refuses the last document of the file (schema, CEL,
strict field validation, admission); earlier documents are applied first and must be
accepted (that is how an immutable field gets "edited"). ``failed``: the object is
accepted and the operator marks it ``Failed`` with a condition message containing the
words. ``pending``: a request that may become satisfiable (an island nobody has
labelled yet) waits, ``Admitted=False`` / a program message saying why.

A valid program runs in another namespace the whole time (``bystander``) and must
finish with its results; the operator must still be the process that started before
the corpus, alive and serving.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.builders import inline_slice, program
from tests.cluster.harness import Cluster, Objects, OperatorProcess, condition

CORPUS_DIR = Path(__file__).parent / "bad_manifests"
VERDICT_S = 60.0


@dataclass(frozen=True)
class BadManifest:
    path: Path
    why: str
    expect: str
    words: str
    documents: tuple[dict[str, Any], ...]

    @classmethod
    def load(cls, path: Path) -> BadManifest:
        text = path.read_text()
        header = [line[1:].strip() for line in text.splitlines() if line.startswith("#")]
        fields = dict(line.split(": ", 1) for line in header[1:] if ": " in line)
        assert fields.get("expect") in {"rejected", "failed", "pending"}, f"{path.name}: expect?"
        documents = tuple(d for d in yaml.safe_load_all(text) if d is not None)
        assert documents, f"{path.name}: no manifest"
        return cls(path, header[0], fields["expect"], fields["words"], documents)


CORPUS = [BadManifest.load(p) for p in sorted(CORPUS_DIR.glob("*.yaml"))]


def _apply(cluster: Cluster, namespace: str, manifest: dict[str, Any], *, check: bool) -> Any:
    own_namespace = (manifest.get("metadata") or {}).get("namespace")
    where = [] if own_namespace else ["-n", namespace]
    return cluster.kubectl("apply", *where, "-f", "-", input=json.dumps(manifest), check=check)


@pytest.fixture(scope="module")
def bystander(cluster: Cluster, operator: OperatorProcess) -> Iterator[Objects]:
    """A valid 6-step program, started before the corpus and checked after it."""
    found = Objects(cluster, cluster.create_namespace("bystander"))
    found.apply(program("bystander", "examples.programs:paper_example", inline_slice("main", 2),
                        steps=6, args={"step_seconds": 0.5}))
    yield found
    found.cleanup()


def test_corpus_covers_both_kinds_and_all_answers() -> None:
    kinds = {d["kind"] for m in CORPUS for d in m.documents if isinstance(d, dict) and "kind" in d}
    assert len(CORPUS) >= 30 and {"VirtualSlice", "PathwaysProgram"} <= kinds
    assert {m.expect for m in CORPUS} == {"rejected", "failed", "pending"}


@pytest.mark.timeout(120, func_only=True)
@pytest.mark.parametrize("bad", CORPUS, ids=[m.path.stem for m in CORPUS])
def test_bad_manifest_is_refused_naming_the_field(
    bad: BadManifest, bystander: Objects, objects: Objects, operator: OperatorProcess
) -> None:
    starts = operator.starts
    *setup, last = bad.documents
    for manifest in setup:
        _apply(objects.cluster, objects.namespace, manifest, check=True)
    kind, name = last.get("kind"), (last.get("metadata") or {}).get("name")
    plural = "virtualslices" if kind == "VirtualSlice" else "pathwaysprograms"

    if bad.expect == "rejected":
        result = _apply(objects.cluster, objects.namespace, last, check=False)
        assert result.returncode != 0, f"{bad.path.name} ({bad.why}) was accepted"
        assert bad.words in result.stderr, result.stderr
        if setup == [] and name and not (last.get("metadata") or {}).get("namespace"):
            assert objects.get(plural, name) is None
    elif bad.expect == "failed":
        assert name, f"{bad.path.name}: a manifest the operator fails has a name"
        _apply(objects.cluster, objects.namespace, last, check=True)
        if kind == "VirtualSlice":
            failed = objects.wait_slice(name, "Failed", VERDICT_S, operator)
            message = condition(failed, "Ready")["message"]
        else:
            failed = objects.wait_program(name, {"Failed"}, VERDICT_S, operator)
            message = condition(failed, "Failed")["message"]
        assert bad.words in message, message
    else:
        assert name, f"{bad.path.name}: a manifest the operator holds back has a name"
        _apply(objects.cluster, objects.namespace, last, check=True)

        def waiting() -> str | None:
            found = objects.get(plural, name) or {}
            status = found.get("status") or {}
            text = status.get("message") or ""
            if kind == "VirtualSlice" and status.get("conditions"):
                text = condition(found, "Admitted")["message"]
            return text if status.get("phase") == "Pending" and bad.words in text else None

        objects.cluster.poll(waiting, timeout=VERDICT_S, interval=0.5,
                             what=f"{bad.path.name}: Pending saying {bad.words!r}")
    assert operator.alive() and operator.starts == starts, operator.log_tail()


@pytest.mark.timeout(240, func_only=True)
def test_valid_program_beside_the_corpus_finishes(bystander: Objects, operator: OperatorProcess) -> None:
    done = bystander.wait_program("bystander", {"Succeeded", "Failed"}, 180, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert done["status"]["stepsCompleted"] == 6
    where = done["status"]["results"]["configMap"]
    assert json.loads(bystander.configmap(where)["y"]) == [3.0, 5.0]
    assert operator.alive()
