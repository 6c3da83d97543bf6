"""A compiled program's ``feeds``: a step's outputs carried into the next step's inputs.

Traced without a runtime: the mapping from ``{returned position: argument position}`` to
flat output/input indices, its checks, and its trip through the ConfigMap.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import pathways as pw
from pathways.cli import EXIT_FAILED, EXIT_OK, main
from pathways.driver import read_mounted_config_map
from pathways_devcluster.controlplane import REPO_ROOT
from pathways_wire.compiled_program import SUMMARY_KEY, CompiledProgram, Feed
from pathways_wire.errors import InvalidProgramError

TRAIN_PROGRAM = REPO_ROOT / "examples" / "train_program.py"


def _pytree_program() -> Any:
    pool = pw.make_virtual_device_set().add_slice(devices=2)
    update = pw.jit(lambda a, b, x: (a + x.sum(), b * 2.0, (a * b).sum()), slice=pool)

    @pw.program(name="pytree-step")
    def program(params: Any, x: Any) -> Any:
        a, b, loss = update(params["a"], params["b"], x)
        return loss, {"a": a, "b": b}

    params = {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)}
    return program, (params, np.ones(4, np.float32))


def _compiled_docs(tmp_path: Path, path: Path = TRAIN_PROGRAM) -> list[dict[str, Any]]:
    out = tmp_path / "manifest.yaml"
    err = io.StringIO()
    assert main(["compile", str(path), "-o", str(out), "--steps", "20"], err=err) == EXIT_OK, err.getvalue()
    return list(yaml.safe_load_all(out.read_text()))


def test_feeds_of_a_pytree_map_leaf_by_leaf_onto_flat_indices() -> None:
    program, args = _pytree_program()
    compiled = program.compiled(args, {1: 0})
    # outputs: loss, a, b (dict leaves in key order); inputs: a, b, x
    assert compiled.feeds == (Feed(output=1, input=0), Feed(output=2, input=1))
    following = compiled.next_inputs(["a0", "b0", "x"], ["loss", "a1", "b1"])
    assert following == ["a1", "b1", "x"], "fed inputs take the outputs; the others stay"


def test_feeds_of_another_structure_are_refused_naming_both() -> None:
    program, args = _pytree_program()
    with pytest.raises(InvalidProgramError, match=r"feeds \{0: 0\}: returned value 0 is PyTreeDef\(\*\) but argument 0 is"):
        program.compiled(args, {0: 0})
    with pytest.raises(InvalidProgramError, match=r"feeds \{2: 0\}: it returns 2 values; feed one of 0..1"):
        program.compiled(args, {2: 0})
    with pytest.raises(InvalidProgramError, match=r"feeds \{1: 5\}: it takes 2 arguments; feed one of 0..1"):
        program.compiled(args, {1: 5})


def test_feeds_whose_shapes_differ_are_refused() -> None:
    program, args = _pytree_program()
    compiled = program.compiled(args)
    with pytest.raises(InvalidProgramError, match=r"feeds\[0\] \(output 0 -> input 2\): the output is .* but the input takes"):
        CompiledProgram(compiled.program, compiled.inputs, feeds=(Feed(0, 2),))
    with pytest.raises(InvalidProgramError, match="input 0 is already fed by output 1"):
        CompiledProgram(compiled.program, compiled.inputs, feeds=(Feed(1, 0), Feed(1, 0)))


def test_compile_stores_the_program_files_feeds_and_reads_them_back(tmp_path: Path) -> None:
    config_map, program = _compiled_docs(tmp_path)
    summary = json.loads(config_map["data"][SUMMARY_KEY])
    assert summary["feeds"] == [{"output": 0, "input": 0}]
    compiled = CompiledProgram.from_config_map(config_map)
    assert compiled.feeds == (Feed(output=0, input=0),)
    assert program["spec"]["steps"] == 20


def test_a_configmap_with_bad_feeds_is_refused_naming_the_field(tmp_path: Path) -> None:
    config_map, _ = _compiled_docs(tmp_path)
    summary = json.loads(config_map["data"][SUMMARY_KEY])
    summary["feeds"] = [{"output": 1, "input": 0}]  # the loss (a scalar) into the weights
    config_map["data"][SUMMARY_KEY] = json.dumps(summary)
    with pytest.raises(InvalidProgramError, match=r"data program.json feeds\[0\] \(output 1 -> input 0\): the output is"):
        CompiledProgram.from_config_map(config_map)
    summary["feeds"] = [{"output": "0", "input": 0}]
    config_map["data"][SUMMARY_KEY] = json.dumps(summary)
    with pytest.raises(InvalidProgramError, match=r"feeds must be a list of \{\"output\": N, \"input\": M\} with integer indices"):
        CompiledProgram.from_config_map(config_map)


def test_a_program_file_with_bad_feeds_says_what_feeds_is(tmp_path: Path) -> None:
    path = tmp_path / "prog.py"
    path.write_text(TRAIN_PROGRAM.read_text().replace("feeds = {0: 0}", "feeds = [0, 0]"))
    err = io.StringIO()
    assert main(["compile", str(path)], out=io.StringIO(), err=err) == EXIT_FAILED
    assert "`feeds` is [0, 0]; `feeds` maps a returned value's position to the argument position" in err.getvalue()


def test_a_mounted_configmap_keeps_its_feeds(tmp_path: Path) -> None:
    """A driver pod reads the ConfigMap as a volume, one file per key, data and binaryData alike."""
    config_map, _ = _compiled_docs(tmp_path)
    mount = tmp_path / "mounted"
    mount.mkdir()
    (mount / SUMMARY_KEY).write_text(config_map["data"][SUMMARY_KEY])
    for key, value in config_map["binaryData"].items():
        (mount / key).write_bytes(base64.b64decode(value))
    compiled = CompiledProgram.from_config_map(read_mounted_config_map(str(mount)))
    assert compiled.feeds == (Feed(output=0, input=0),)
