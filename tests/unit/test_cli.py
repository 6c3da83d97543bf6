"""The ``pathways`` CLI without a cluster: tables and descriptions from typed views, the
argument and exit-code contract scripts rely on, and ``compile``'s ConfigMap round trip.

Views are built with the small builders below (what the API would have returned, already
parsed); only ``test_views_parse_api_objects`` starts from JSON. Cluster behaviour is in
``tests/cluster/test_cli.py``.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pathways.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from pathways.cli.durations import human_duration, parse_duration
from pathways.cli.logs import log_file
from pathways.cli.render import (
    describe_program,
    describe_slice,
    prefixed,
    program_table,
    render_table,
    results_text,
    slice_table,
    status_text,
)
from pathways_wire.compiled_program import CONFIG_MAP_LIMIT, CompiledProgram, resource_name
from pathways_wire.errors import InvalidProgramError
from pathways_wire.wording import fraction, plural
from pathways.kube import Kube, KubeError
from pathways.kube_views import Condition, EventView, Host, PodView, ProgramSlice, ProgramView, SliceView

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=timezone.utc)


def ago(**kwargs: float) -> datetime:
    return NOW - timedelta(**kwargs)


# -- builders ----------------------------------------------------------------------------


def ready_slice(name: str = "shared", devices: int = 8, per_host: int = 4, island: str = "island-a") -> SliceView:
    hosts = tuple(
        Host(i, f"{name}-{i}", f"{island[-1]}-{i}", f"127.0.0.{10 + i}", per_host) for i in range(devices // per_host)
    )
    return SliceView(
        namespace="team",
        name=name,
        devices=devices,
        devices_per_host=per_host,
        created=ago(minutes=5),
        phase="Ready",
        island=island,
        ready_hosts=f"{len(hosts)}/{len(hosts)}",
        conditions=(
            Condition("Admitted", "True", "Admitted", f"placed on {island}", ago(minutes=5)),
            Condition("Ready", "True", "AllHostsRunning", f"{len(hosts)} hosts running", ago(minutes=4)),
        ),
        hosts=hosts,
        reconciled=True,
    )


def waiting_slice(name: str = "big", devices: int = 16) -> SliceView:
    return SliceView(
        namespace="team",
        name=name,
        devices=devices,
        created=ago(seconds=30),
        phase="Pending",
        conditions=(
            Condition(
                "Admitted", "False", "InsufficientDevices",
                f"needs {devices} devices on one island; best is island-a with 4 free", ago(seconds=30),
            ),
        ),  # fmt: skip
        reconciled=True,
    )


def running_program(name: str = "train", done: int = 3, steps: int = 10) -> ProgramView:
    return ProgramView(
        namespace="team",
        name=name,
        slices=(ProgramSlice("main", ref="shared"), ProgramSlice("aux", template_devices=4)),
        entrypoint="examples.lm:train",
        steps=steps,
        weight=2.0,
        created=ago(hours=2, minutes=5),
        phase="Running",
        steps_completed=done,
        slice_names="main=shared,aux=train-aux",
        reconciled=True,
    )


def pod(name: str, slice_: str, index: int, node: str) -> PodView:
    return PodView("team", name, slice_, index, node, f"127.0.0.{10 + index}", "Running", True, 0, ("worker", "dataflow"))


# -- durations, tables -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (59, "59s"), (119, "119s"), (125, "2m5s"), (600, "10m"), (7500, "125m"),
     (4 * 3600 + 60, "4h1m"), (20 * 3600, "20h"), (3 * 86400 + 3600, "3d1h"), (40 * 86400, "40d"),
     (800 * 86400, "2y70d")],
)  # fmt: skip
def test_ages_read_like_kubectl(seconds: int, shown: str) -> None:
    assert human_duration(seconds) == shown


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("5m", 300), ("1h30m", 5400), ("0.5s", 0.5)])
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bad_duration_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "-w", "--timeout", "soon"]) == EXIT_USAGE
    assert "'soon' is not a duration" in capsys.readouterr().err


def test_render_table_aligns_columns_without_trailing_spaces() -> None:
    text = render_table(["A", "LONGER"], [["xxxx", "1"], ["y", ""]])
    assert text.splitlines() == ["A      LONGER", "xxxx   1", "y"]


def test_slice_table_shows_devices_island_phase_ready_restarts_age() -> None:
    headers, rows = slice_table([ready_slice(), waiting_slice()], NOW)
    assert headers == ["SLICE", "DEVICES", "ISLAND", "PHASE", "READY", "RESTARTS", "AGE"]
    assert rows == [
        ["shared", "8", "island-a", "Ready", "2/2", "0", "5m"],
        ["big", "16", "-", "Pending", "-", "0", "30s"],
    ]


def test_wide_slice_table_says_why_a_slice_waits_and_where_hosts_run() -> None:
    headers, rows = slice_table([ready_slice(), waiting_slice()], NOW, wide=True, all_namespaces=True)
    assert headers[0] == "NAMESPACE" and headers[-3:] == ["PER HOST", "NODES", "WAITING"]
    assert rows[0][-3:] == ["4", "a-0,a-1", "-"]
    assert rows[1][-1] == "InsufficientDevices: needs 16 devices on one island; best is island-a with 4 free"


def test_program_table_shows_slices_phase_steps_weight_age() -> None:
    headers, rows = program_table([running_program()], NOW)
    assert headers == ["PROGRAM", "SLICES", "PHASE", "STEPS", "WEIGHT", "AGE"]
    assert rows == [["train", "main=shared,aux=train-aux", "Running", "3/10", "2", "125m"]]


def test_program_slices_before_the_operator_wrote_status() -> None:
    fresh = ProgramView("team", "p", slices=(ProgramSlice("main", ref="shared"), ProgramSlice("aux", template_devices=4)))
    assert fresh.virtual_slices() == {"main": "shared", "aux": "p-aux"}
    assert program_table([fresh], NOW)[1][0][1:4] == ["main=shared,aux=p-aux", "-", "0/1"]


def test_status_with_nothing_says_where_it_looked() -> None:
    assert status_text([], [], NOW, namespace="team") == "No VirtualSlices or PathwaysPrograms in namespace team."
    assert status_text([], [], NOW, namespace=None).endswith("in any namespace.")


def test_status_prints_one_table_per_kind() -> None:
    text = status_text([ready_slice()], [running_program()], NOW, namespace="team")
    slices, programs = text.split("\n\n")
    assert slices.startswith("SLICE ") and programs.startswith("PROGRAM ")


# -- describe ----------------------------------------------------------------------------


def test_describe_waiting_slice_leads_with_the_reason() -> None:
    text = describe_slice(waiting_slice(), [], [], [], NOW)
    lines = text.splitlines()
    waiting = next(line for line in lines if line.startswith("Waiting:"))
    assert "InsufficientDevices: needs 16 devices on one island; best is island-a with 4 free" in waiting
    assert lines.index(waiting) < lines.index("Conditions:")
    assert "Hosts:         <none>" in lines


def test_describe_ready_slice_lists_hosts_programs_and_events() -> None:
    events = [
        EventView("Normal", "Admitted", "Admitted on island-a", 1, ago(minutes=5), ago(minutes=5), "kube-pathways"),
        EventView("Warning", "GangRecreated", "Gang recreated: pod shared-1 failed", 2, ago(minutes=4), ago(minutes=1)),
    ]
    pods = [pod("shared-0", "shared", 0, "a-0"), pod("shared-1", "shared", 1, "a-1")]
    text = describe_slice(ready_slice(), pods, [running_program()], events, NOW)
    assert "Devices:       8 (4 per host)" in text
    assert "Restarts:      0 (at most 3)" in text
    hosts = text[text.index("Hosts:") : text.index("Programs:")].splitlines()
    assert hosts[1].split() == ["HOST", "POD", "NODE", "POD", "IP", "DEVICES", "STATE", "RESTARTS"]
    assert hosts[2].split() == ["0", "shared-0", "a-0", "127.0.0.10", "4", "Running,", "ready", "0"]
    assert "train     Running   3/10    2" in text
    assert "Gang recreated: pod shared-1 failed" in text and "60s (x2 over 4m)" in text


def test_describe_unreconciled_slice_asks_whether_the_operator_runs() -> None:
    text = describe_slice(SliceView("team", "fresh", 4), [], [], [], NOW)
    assert "no operator has reconciled this object (is it running?" in text


def test_describe_program_names_the_slice_it_waits_for() -> None:
    program = running_program()
    text = describe_program(program, {"main": ready_slice(), "aux": waiting_slice("train-aux", 4)}, [], NOW)
    assert "Source:        entrypoint examples.lm:train" in text
    assert "Steps:         3/10" in text
    assert "Waiting:       slice aux (VirtualSlice train-aux): InsufficientDevices: needs 4 devices" in text
    assert "aux    train-aux      inline   4" in text


def test_describe_program_with_a_missing_slice() -> None:
    text = describe_program(running_program(), {"main": None, "aux": None}, [], NOW)
    assert "main   shared         shared   -         -        not found" in text


TRACEBACK = """the entrypoint raised ValueError: boom
--- driver log (tail) ---
Traceback (most recent call last):
  File "examples/programs.py", line 50, in paper_example
    raise ValueError("boom")
ValueError: boom"""


def test_describe_program_shows_a_traceback_once() -> None:
    """The operator puts one failure in status.message, two conditions and an Event."""
    failed = dataclasses.replace(
        running_program(),
        phase="Failed",
        message=TRACEBACK,
        conditions=(
            Condition("Running", "False", "ComputationFailed", TRACEBACK, ago(seconds=5)),
            Condition("Failed", "True", "ComputationFailed", TRACEBACK, ago(seconds=5)),
        ),
    )
    events = [EventView("Warning", "ComputationFailed", TRACEBACK, 1, ago(seconds=5), ago(seconds=5), "kube-pathways")]
    text = describe_program(failed, {"main": ready_slice(), "aux": None}, events, NOW)
    assert text.count("Traceback (most recent call last):") == 1, text
    assert text.count('raise ValueError("boom")') == 1, text
    assert "Message:       the entrypoint raised ValueError: boom\n               --- driver log (tail) ---" in text
    assert text.count("the entrypoint raised ValueError: boom [5 more lines: see Message]") == 3, text
    assert "Details:" not in text


def test_describe_slice_prints_a_long_message_once_under_details() -> None:
    long = "gang recreated: pod shared-1 failed\nits worker said:\nOSError: no space left"
    view = dataclasses.replace(
        ready_slice(), conditions=(Condition("Degraded", "True", "HostLost", long, ago(minutes=1)),)
    )
    events = [EventView("Warning", "GangRecreated", long, 1, ago(minutes=1), ago(minutes=1))]
    text = describe_slice(view, [], [], events, NOW)
    assert text.count("OSError: no space left") == 1, text
    assert text.count("gang recreated: pod shared-1 failed [2 more lines: see Details]") == 2, text
    assert text.endswith("Details:\n  condition Degraded:\n    gang recreated: pod shared-1 failed\n"
                         "    its worker said:\n    OSError: no space left")


@pytest.mark.parametrize(
    ("count", "noun", "text"),
    [(0, "host", "0 hosts"), (1, "host", "1 host"), (2, "host", "2 hosts"), (1, "device", "1 device")],
)
def test_counts_agree_with_their_nouns(count: int, noun: str, text: str) -> None:
    assert plural(count, noun) == text
    assert fraction(1, count, noun) == f"1/{text}"


def test_results_print_in_output_order_as_text_or_json() -> None:
    data = {f"output_{i}": f"[{i}.0]" for i in (10, 2, 0, 1)}
    assert results_text(data, "text").splitlines() == [
        "output_0: [0.0]", "output_1: [1.0]", "output_2: [2.0]", "output_10: [10.0]",
    ]  # fmt: skip
    assert results_text(data, "json") == '{"output_0": [0.0], "output_1": [1.0], "output_2": [2.0], "output_10": [10.0]}'


# -- logs --------------------------------------------------------------------------------


def test_log_lines_get_the_host_prefix_and_tail() -> None:
    assert prefixed("[s/host-1]", "a\nb\nc\n", tail=2) == ["[s/host-1] b", "[s/host-1] c"]
    assert prefixed("[s/host-1]", "a\n", tail=0) == []


def test_log_dir_accepts_the_node_agent_state_dir(tmp_path: Path) -> None:
    nested = tmp_path / "pods" / "team_p-0" / "worker.log"
    nested.parent.mkdir(parents=True)
    nested.write_text("hello\n")
    assert log_file(tmp_path, "team", "p-0", "worker") == nested
    assert log_file(tmp_path / "pods", "team", "p-0", "worker") == nested


# -- parsing API objects -----------------------------------------------------------------


def test_views_parse_api_objects_with_crd_defaults() -> None:
    raw = {
        "metadata": {"name": "s", "namespace": "ns", "creationTimestamp": "2026-11-23T11:59:00Z"},
        "spec": {"devices": 8},
        "status": {
            "phase": "Ready", "island": "island-b", "readyHosts": "2/2", "restarts": 1,
            "hosts": [{"index": 0, "pod": "s-0", "node": "b-0", "podIP": "127.0.0.10", "devices": 4}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllHostsRunning", "message": "ok",
                            "lastTransitionTime": "2026-11-23T11:59:30Z"}],
        },
    }  # fmt: skip
    view = SliceView.from_object(raw)
    assert (view.devices, view.devices_per_host, view.max_restarts, view.restarts) == (8, None, 3, 1)
    assert view.hosts == (Host(0, "s-0", "b-0", "127.0.0.10", 4),)
    assert view.condition("Ready") == Condition("Ready", "True", "AllHostsRunning", "ok", ago(seconds=30))
    assert not SliceView.from_object({"metadata": {"name": "x"}, "spec": {"devices": 1}}).reconciled
    program = ProgramView.from_object(
        {"metadata": {"name": "p"}, "spec": {"slices": [{"name": "m", "ref": "s"}], "source": {"configMapRef": {"name": "c"}}}}
    )
    assert (program.steps, program.weight, program.config_map, program.virtual_slices()) == (1, 1.0, "c", {"m": "s"})


# -- exit codes and arguments ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["describe", "widget", "x"],
        ["describe", "slice"],
        ["status", "-o", "xml"],
        ["status", "--until-done"],
        ["logs", "program"],
        ["logs", "program", "p", "-c", "worker", "--all-containers"],
        ["compile"],
        ["submit", "prog.py", "--steps", "0"],
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == EXIT_USAGE
    assert capsys.readouterr().err.strip()


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == EXIT_OK
    assert "Exit status: 0 ok, 1 not found/failed/timed out, 2 usage error." in capsys.readouterr().out


def test_missing_kubeconfig_fails_with_what_to_do(tmp_path: Path) -> None:
    err = io.StringIO()
    assert main(["status", "--kubeconfig", str(tmp_path / "nope")], err=err) == EXIT_FAILED
    assert "pass --kubeconfig FILE, set KUBECONFIG" in err.getvalue()


@pytest.mark.parametrize("text", ["not: [valid\n", "a: 1\n---\nb: 2\n"], ids=["broken", "two documents"])
def test_a_kubeconfig_that_is_not_yaml_fails_naming_the_file_not_with_a_traceback(tmp_path: Path, text: str) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(text)
    err = io.StringIO()
    assert main(["status", "--kubeconfig", str(config)], err=err) == EXIT_FAILED
    assert f"kubeconfig {config} is not valid YAML: " in err.getvalue(), err.getvalue()


def kubeconfig(path: Path, contexts: list[dict[str, Any]]) -> Path:
    """A kubeconfig whose current context is ``a``, with one unreachable cluster and user."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": contexts,
    }))  # fmt: skip
    return path


def test_unknown_context_lists_the_known_ones(tmp_path: Path) -> None:
    config = kubeconfig(
        tmp_path / "kubeconfig",
        [{"name": n, "context": {"cluster": "c", "user": "u", "namespace": f"ns-{n}"}} for n in "ab"],
    )
    with pytest.raises(KubeError, match=r"context 'z' is not in kubeconfig .* \(contexts: a, b\)"):
        Kube.connect(str(config), "z")
    session = Kube.connect(str(config), "b")
    assert (session.context, session.namespace) == ("b", "ns-b")
    assert Kube.connect(str(config), None, "explicit").namespace == "explicit"


def test_unreachable_api_server_exits_1_naming_the_server(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", [{"name": "a", "context": {"cluster": "c", "user": "u"}}])
    err = io.StringIO()
    assert main(["--kubeconfig", str(config), "describe", "slice", "x"], err=err) == EXIT_FAILED
    assert "cannot reach the API server at https://127.0.0.1:1" in err.getvalue()


# -- compile -----------------------------------------------------------------------------


PROGRAM_FILE = textwrap.dedent(
    """
    import numpy as np
    import pathways as pw

    device_set = pw.make_virtual_device_set()
    private = device_set.add_slice(devices=2, devices_per_host=1, island="island-b")
    shared = device_set.add_slice(devices=2, name="shared-pool")
    double = pw.pmap(lambda x: x * 2.0, devices=private.devices)
    add = pw.pmap(lambda x, y: x + y, devices=shared.devices)

    @pw.program(name="Double_Then_Add", weight=3)
    def program(v):
        return add(double(v), np.ones(2, np.float32))

    def example_args():
        return np.arange(2, dtype=np.float32){extra}
    """
)


def program_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM_FILE.replace("{extra}", extra))
    return path


def compile_to_docs(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    out = tmp_path / "manifest.yaml"
    assert main(["compile", str(program_file(tmp_path)), "-o", str(out), *args]) == EXIT_OK
    return list(yaml.safe_load_all(out.read_text()))


def test_compile_writes_a_configmap_and_a_program_that_references_it(tmp_path: Path) -> None:
    config_map, program = compile_to_docs(tmp_path, "-n", "team", "--steps", "5")
    assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["namespace"] == "team"
    assert program["kind"] == "PathwaysProgram" and program["metadata"]["name"] == "double-then-add"
    spec = program["spec"]
    assert spec["source"] == {"configMapRef": {"name": config_map["metadata"]["name"]}}
    assert (spec["steps"], spec["weight"]) == (5, 3.0)
    by_kind = {("ref" in s): s for s in spec["slices"]}
    assert by_kind[True] == {"name": "shared-pool", "ref": "shared-pool"}
    assert by_kind[False]["template"] == {"devices": 2, "devicesPerHost": 1, "island": "island-b"}


def test_compiled_configmap_round_trips_ir_artifacts_and_inputs(tmp_path: Path) -> None:
    config_map, program = compile_to_docs(tmp_path)
    compiled = CompiledProgram.from_config_map(config_map)
    assert compiled.program.fingerprint == program["metadata"]["annotations"]["pathways.dev/program-fingerprint"]
    assert len(compiled.program.computations) == 2
    assert all(c.artifact for c in compiled.program.computations)
    assert {s.id for s in compiled.program.slices} == {s["name"] for s in program["spec"]["slices"]}
    np.testing.assert_array_equal(compiled.inputs[0], np.arange(2, dtype=np.float32))
    np.testing.assert_array_equal(compiled.inputs[1], np.ones(2, np.float32))  # captured constant
    assert compiled.weight == 3.0


def test_a_tampered_configmap_is_refused_with_the_fix(tmp_path: Path) -> None:
    config_map, _ = compile_to_docs(tmp_path)
    artifact = next(k for k in config_map["binaryData"] if k.endswith(".jaxexport"))
    del config_map["binaryData"][artifact]
    with pytest.raises(InvalidProgramError, match=f"needs artifact {artifact}, which is missing: compile it again"):
        CompiledProgram.from_config_map(config_map)
    config_map["metadata"]["annotations"] = {}
    with pytest.raises(InvalidProgramError, match="is not a compiled program"):
        CompiledProgram.from_config_map(config_map)


def test_compile_refuses_a_program_too_big_for_a_configmap(tmp_path: Path) -> None:
    path = tmp_path / "big.py"
    path.write_text(PROGRAM_FILE.replace("np.arange(2, dtype=np.float32)", "np.zeros((2, 300_000), np.float32)").replace("{extra}", ""))
    err = io.StringIO()
    assert main(["compile", str(path)], out=io.StringIO(), err=err) == EXIT_FAILED
    assert f"a ConfigMap holds at most {CONFIG_MAP_LIMIT}" in err.getvalue()
    assert "make example_args() smaller" in err.getvalue()


IMPORTING = "importing it raised"


@pytest.mark.parametrize(
    ("source", "compile_says", "run_says", "shown"),
    [
        ("import helper\n", f"{IMPORTING} ZeroDivisionError", f"{IMPORTING} ZeroDivisionError",
         "helper.py\", line 2, in half"),
        ("def f(:\n", f"{IMPORTING} SyntaxError", f"{IMPORTING} SyntaxError", "def f(:"),
        ("import pathways as pw\nprogram = pw.program(lambda x: x)\ndef example_args():\n    return {}['k']\n",
         "example_args() raised KeyError", "example_args() raised KeyError", "in example_args"),
        ("import pathways as pw\n@pw.program\ndef program(x):\n    return x.missing\ndef example_args():\n    return 1.0\n",
         "tracing `program` raised AttributeError", "calling `program` raised AttributeError", "in program"),
    ],
    ids=["a module it imports raises", "a syntax error", "example_args raises", "the program's body raises"],
)
def test_a_program_file_whose_own_code_fails_shows_that_codes_traceback_not_the_commands(
    tmp_path: Path, source: str, compile_says: str, run_says: str, shown: str
) -> None:
    (tmp_path / "helper.py").write_text("def half(x):\n    return x / 0\nhalf(1)\n")
    path = tmp_path / "prog.py"
    path.write_text(source)
    for command, says in (("compile", compile_says), ("run", run_says)):
        err = io.StringIO()
        assert main([command, str(path)], out=io.StringIO(), err=err) == EXIT_FAILED
        text = err.getvalue()
        assert f"\nerror: {path}: {says}" in f"\n{text}"
        assert shown in text
        assert "pathways/cli" not in text and "importlib" not in text


def test_compile_to_an_output_it_cannot_write_says_so_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM_FILE.replace("{extra}", ""))
    err = io.StringIO()
    assert main(["compile", str(path), "-o", str(tmp_path / "missing" / "out.yaml")], err=err) == EXIT_FAILED
    assert f"-o {tmp_path / 'missing' / 'out.yaml'}: cannot write the manifest there (No such file or directory)" in err.getvalue()
    assert main(["compile", str(path), "-o", str(tmp_path)], err=err) == EXIT_FAILED
    assert "(Is a directory)" in err.getvalue()


def test_compile_of_a_file_without_the_convention_says_what_to_define(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    path.write_text("x = 1\n")
    err = io.StringIO()
    assert main(["compile", str(path)], err=err) == EXIT_FAILED
    assert "it has no `program`; define a module-level `program`" in err.getvalue()
    assert main(["compile", str(tmp_path / "missing.py")], err=err) == EXIT_FAILED
    assert "missing.py: no such file" in err.getvalue()


def test_resource_names_are_dns_labels() -> None:
    assert resource_name("Double_Then_Add") == "double-then-add"
    assert resource_name("x" * 80, "-compiled") == "x" * 54 + "-compiled"
    with pytest.raises(InvalidProgramError, match="pass --name"):
        resource_name("__")


def test_binary_data_is_base64_as_the_api_expects(tmp_path: Path) -> None:
    config_map, _ = compile_to_docs(tmp_path)
    for key, value in config_map["binaryData"].items():
        assert base64.b64encode(base64.b64decode(value)).decode() == value, key
