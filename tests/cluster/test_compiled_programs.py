"""Programs compiled by ``pathways compile`` run under the operator (``spec.source.configMapRef``).

The user's Python never reaches the operator: ``pathways submit`` (or ``compile`` and
``kubectl apply``) stores the IR, the ``jax.export`` artifacts and the inputs in a
ConfigMap; the operator reads and checks it, hands it to the driver as a file, and the
driver binds the IR's slices to the VirtualSlices ``spec.slices`` names and runs it
``spec.steps`` times. A ConfigMap edited by hand, or inputs swapped for bigger ones,
fails the program with a message naming the field before any slice is made.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pathways.cli import EXIT_OK, compile_program_file, main
from pathways_wire.compiled_program import ARTIFACT_SUFFIX, INPUTS_KEY, PROGRAM_KEY
from pathways_wire import pathways_pb2 as pb
from tests.cluster.builders import Manifest, virtual_slice
from pathways_devcluster.controlplane import REPO_ROOT
from tests.cluster.harness import Objects, OperatorProcess, condition
from tests.cluster.program_files import double_inc_program, example_module

PROGRAM_DONE_S = 180.0

SHARED_PROGRAM = double_inc_program("compiled-pool")


def results(objects: Objects, done: Manifest) -> dict[str, object]:
    where = done["status"]["results"]
    data = objects.configmap(where["configMap"])
    assert sorted(data) == sorted(where["keys"])
    return {k: json.loads(v) for k, v in data.items()}


def cli(objects: Objects, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--kubeconfig", str(objects.cluster.kubeconfig), "-n", objects.namespace, *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def apply_all(objects: Objects, *manifests: Manifest) -> None:
    for manifest in manifests:
        objects.cluster.kubectl("apply", "--server-side", "-n", objects.namespace, "-f", "-",
                               input=json.dumps(manifest))


@pytest.mark.timeout(300, func_only=True)
def test_submitted_program_succeeds_with_its_results(objects: Objects, operator: OperatorProcess) -> None:
    code, out, err = cli(objects, "submit", str(REPO_ROOT / "examples" / "paper_program.py"),
                         "--steps", "3", "--wait", "--timeout", "3m")
    done = objects.program("paper-program")
    assert code == EXIT_OK, f"{err}\n{json.dumps(done.get('status'), indent=1)}\n{operator.log_tail()}"
    assert "paper-program created" in out
    assert out.splitlines()[-2:] == ["output_0: [3.0, 5.0]", "output_1: [2.0, 4.0]"], "--wait prints the results"
    assert done["status"]["phase"] == "Succeeded"
    assert done["status"]["stepsCompleted"] == 3 and done["status"]["progress"] == "3/3"
    assert results(objects, done) == {"output_0": [3.0, 5.0], "output_1": [2.0, 4.0]}
    assert condition(done, "Succeeded")["status"] == "True"
    assert f"[program:{objects.namespace}/paper-program]: " in operator.log_path.read_text(), "lines name the object"
    inline = done["spec"]["slices"][0]["name"]
    objects.cluster.poll(
        lambda: objects.get("virtualslices", f"paper-program-{inline}") is None,
        timeout=60, what="the program's inline slice removed when it ended",
    )
    code, logs, err = cli(objects, "logs", "program", "paper-program", "--log-dir", str(objects.cluster.state_dir))
    assert code == EXIT_OK, err
    assert "[driver] --- starting at step 0: -m pathways.driver" in logs.splitlines(), logs


@pytest.mark.timeout(300, func_only=True)
def test_compiled_manifest_runs_on_the_shared_slice_it_names(
    objects: Objects, operator: OperatorProcess, tmp_path: Path
) -> None:
    path = tmp_path / "prog.py"
    path.write_text(SHARED_PROGRAM)
    manifest = tmp_path / "manifest.yaml"
    code, _, err = cli(objects, "compile", str(path), "-o", str(manifest), "--steps", "2")
    assert code == EXIT_OK, err
    objects.apply(virtual_slice("compiled-pool", 2))
    objects.cluster.kubectl("apply", "--server-side", "-n", objects.namespace, "-f", str(manifest))
    done = objects.wait_program("double-inc", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["spec"]["slices"] == [{"name": "compiled-pool", "ref": "compiled-pool"}]
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert results(objects, done) == {"output_0": [3.0, 5.0]}
    assert done["status"]["stepsCompleted"] == 2
    assert objects.get("virtualslices", "compiled-pool") is not None, "a ref slice outlives the program"


def _edit_program(config_map: Manifest) -> None:
    message = pb.Program.FromString(base64.b64decode(config_map["binaryData"][PROGRAM_KEY]))
    message.outputs[0].index += 1
    config_map["binaryData"][PROGRAM_KEY] = base64.b64encode(message.SerializeToString()).decode()


def _swap_artifact(config_map: Manifest) -> None:
    key = next(k for k in config_map["binaryData"] if k.endswith(ARTIFACT_SUFFIX))
    config_map["binaryData"][key] = base64.b64encode(b"not StableHLO").decode()


def _bigger_inputs(config_map: Manifest) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, np.zeros(50_000, np.float32))
    config_map["binaryData"][INPUTS_KEY] = base64.b64encode(buffer.getvalue()).decode()


def _drop_config_map(config_map: Manifest) -> None:
    config_map["metadata"]["name"] = "someone-else"


def _rename_slice(program: Manifest) -> None:
    program["spec"]["slices"][0]["name"] = "main"


@pytest.mark.timeout(120, func_only=True)
@pytest.mark.parametrize(
    ("edit_config_map", "edit_program", "field", "words"),
    [
        (_edit_program, None, "spec.source.configMapRef", "does not match the recorded"),
        (_swap_artifact, None, "spec.source.configMapRef", "does not match the recorded"),
        (_bigger_inputs, None, "spec.source.configMapRef", "inputs.npz input 0 is float32[50000]"),
        (_drop_config_map, None, "spec.source.configMapRef.name", "does not exist"),
        (None, _rename_slice, "spec.slices[0].name", "has no slice 'main'"),
    ],
    ids=["edited-ir", "swapped-artifact", "oversized-inputs", "missing-configmap", "unknown-slice-name"],
)
def test_a_bad_compiled_program_fails_naming_the_field(
    objects: Objects, operator: OperatorProcess, edit_config_map: Any, edit_program: Any,
    field: str, words: str,
) -> None:
    config_map, program, _ = compile_program_file(
        REPO_ROOT / "examples" / "paper_program.py", "bad-compiled", objects.namespace, 1
    )
    if edit_config_map is not None:
        edit_config_map(config_map)
    if edit_program is not None:
        edit_program(program)
    apply_all(objects, config_map, program)
    failed = objects.wait_program("bad-compiled", {"Failed"}, 60, operator)
    message = condition(failed, "Failed")["message"]
    assert message.startswith(field) and words in message, message
    assert not objects.get("virtualslices", "bad-compiled-" + program["spec"]["slices"][0]["name"])


@pytest.mark.timeout(300, func_only=True)
def test_a_submitted_program_with_feeds_trains_across_its_steps(objects: Objects, operator: OperatorProcess) -> None:
    path = REPO_ROOT / "examples" / "train_program.py"
    code, out, err = cli(objects, "submit", str(path), "--steps", "20", "--wait", "--timeout", "3m")
    done = objects.program("train-program")
    assert code == EXIT_OK, f"{err}\n{json.dumps(done.get('status'), indent=1)}\n{operator.log_tail()}"
    assert done["status"]["stepsCompleted"] == 20
    got = results(objects, done)
    weights, loss = example_module(path).reference(20)
    np.testing.assert_allclose(np.asarray(got["output_0"]), weights, rtol=1e-4, atol=1e-5)
    assert float(np.asarray(got["output_1"])) == pytest.approx(loss, rel=1e-3)
    first_loss = example_module(path).reference(1)[1]
    assert float(np.asarray(got["output_1"])) < first_loss / 10, "twenty steps of training, not one step twenty times"
