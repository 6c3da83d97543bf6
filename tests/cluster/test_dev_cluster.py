"""``make dev-cluster`` end to end: up, the README quickstart, down, nothing left.

The test runs the entry point the Makefile runs (``python -m pathways_devcluster up``,
then ``down``), with a state directory of its own, and in between does what the README's
quickstart says: ``kubectl apply`` the paper example, ``kubectl get vslice,pwprog`` and
``pathways status -w`` until the program has Succeeded. The operator must be the chart's
Deployment pod, run by the node agent. While the program runs, the test notes every
process below the dev cluster's recorded PID; after ``down`` none of them may be alive,
and neither the state directory nor the shared-memory directories of those processes
and of the node agent's memory volumes may be left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pathways_devcluster.background import Records
from pathways_devcluster.controlplane import REPO_ROOT
from pathways_devcluster.node_agent.pod_volumes import shm_root
from pathways_wire import process_tree
from pathways_wire.process_tree import ProcessId

PAPER_EXAMPLE = REPO_ROOT / "examples" / "manifests" / "paper-example.yaml"
SHM = Path("/dev/shm")


def devcluster(command: str, state: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pathways_devcluster", command, "--state-dir", str(state)],
        capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT, check=False,
    )  # fmt: skip


def kubectl(env: dict[str, str], *args: str) -> str:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "the cluster tier needs kubectl on PATH"
    result = subprocess.run([kubectl, *args], capture_output=True, text=True, timeout=60,
                            env=env, check=False)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def below(server: ProcessId) -> set[ProcessId]:
    found = (ProcessId.of(pid) for pid in process_tree.descendants(server.pid))
    return {p for p in found if p is not None}


@pytest.mark.timeout(1200)
def test_dev_cluster_runs_the_quickstart_and_leaves_nothing_behind(tmp_path: Path) -> None:
    state = tmp_path / "dev-cluster"
    records = Records(state)
    started = time.monotonic()
    up = devcluster("up", state, timeout=660)
    seen: set[ProcessId] = set()
    memory_volumes = Path("/nonexistent")
    try:
        assert up.returncode == 0, f"up exited {up.returncode}:\n{up.stderr}"
        print(f"\ndev cluster up in {time.monotonic() - started:.1f} s "
              f"(serve reports {records.ready_seconds()} s)")
        exports = [line for line in up.stdout.splitlines() if line.startswith("export KUBECONFIG=")]
        assert exports == [f"export KUBECONFIG={records.kubeconfig}"], up.stdout
        env = {**os.environ, "KUBECONFIG": str(records.kubeconfig)}
        server = records.server()
        assert server is not None, "up records the running dev cluster's PID"
        seen |= {server, *records.recorded()}
        memory_volumes = shm_root((state / "node-agent" / "pod-subnet").read_text().strip())

        (operator,) = json.loads(kubectl(env, "get", "pods", "-n", "pathways-system", "-o", "json"))["items"]
        assert operator["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        assert operator["spec"]["containers"][0]["command"] == ["python", "-m", "pathways_operator"]
        assert operator["status"]["phase"] == "Running"
        assert operator["spec"]["serviceAccountName"].endswith("kube-pathways")

        kubectl(env, "apply", "-f", str(PAPER_EXAMPLE))
        listed = kubectl(env, "get", "vslice,pwprog")
        assert "paper-example" in listed, listed
        watch = subprocess.Popen(
            [str(Path(sys.executable).parent / "pathways"), "status", "-w", "--until-done", "--timeout", "5m"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 330
        while watch.poll() is None and time.monotonic() < deadline:
            seen |= below(server)
            time.sleep(0.3)
        out = watch.communicate(timeout=30)[0]
        assert watch.returncode == 0, out
        assert "Succeeded" in out.strip().splitlines()[-1], out
        results = json.loads(kubectl(env, "get", "configmap", "paper-example-results", "-o", "json"))
        assert json.loads(results["data"]["y"]) == [3.0, 5.0]
        assert json.loads(results["data"]["z"]) == [2.0, 4.0]
    finally:
        down = devcluster("down", state, timeout=300)
    assert down.returncode == 0, f"down exited {down.returncode}:\n{down.stderr}"
    assert not state.exists(), f"down leaves {state} behind"
    alive = sorted(p.pid for p in seen if p.alive())
    assert not alive, f"processes of the dev cluster still running after down: {alive}"
    left = [SHM / f"pathways-{p.pid}" for p in seen] + [memory_volumes]
    assert not [str(path) for path in left if path.exists()], "shared memory left behind"
