"""The operator under test, as a real process, and builders for the objects it serves.

``operator`` (module fixture) applies ``crds/`` with kubectl, waits until both CRDs
are Established, and starts ``python -m pathways_operator --all-namespaces`` against the
test cluster, with its controller on a free loopback port and kopf's liveness endpoint
as its readiness signal. ``OperatorProcess.restart(kill=True)`` SIGKILLs it and starts a
new one on the same state directory, which is what an operator pod restart looks like.
Module scope, not session: test modules import the fixture, which gives each importing
module its own instance, and session-scoped ones all lived to the end of the session --
several operators serving every namespace at once, fighting over each gang's control
streams. Now one runs at a time, and modules without one (``test_cli``) see none.

Builders (``virtual_slice``, ``program``, ``inline_slice``, ``ref_slice``) return
complete manifests so tests state only what they are about.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster import processes
from tests.cluster.conftest import Cluster
from tests.cluster.controlplane import REPO_ROOT, free_port

Manifest = dict[str, Any]
GROUP, VERSION = "pathways.dev", "v1alpha1"
CRDS = ("virtualslices.pathways.dev", "pathwaysprograms.pathways.dev")
READY_TIMEOUT_S = 60.0
ALLOWED_ENTRYPOINTS = "examples.,tests.cluster.faulty_programs:"
"""The examples, and the misbehaving entrypoints of ``faulty_programs``."""


class OperatorProcess:
    """``python -m pathways_operator`` against the test cluster; logs in ``log_path``."""

    def __init__(self, kubeconfig: Path, run_dir: Path, *extra_args: str) -> None:
        self.kubeconfig = kubeconfig
        self.run_dir = run_dir
        self.state_dir = run_dir / "state"
        self.log_path = run_dir / "operator.log"
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self.liveness_port = 0
        self.metrics_port = 0
        self.starts = 0

    def start(self, timeout: float = READY_TIMEOUT_S) -> OperatorProcess:
        self.liveness_port = free_port()
        self.metrics_port = free_port()
        argv = [
            sys.executable, "-m", "pathways_operator", "--all-namespaces",
            "--controller-listen", "127.0.0.1:0",
            "--state-dir", str(self.state_dir),
            "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
            "--metrics-port", str(self.metrics_port),
            "--allowed-entrypoints", ALLOWED_ENTRYPOINTS,
            *self.extra_args,
        ]
        env = {**_base_env(), "KUBECONFIG": str(self.kubeconfig), "PATHWAYS_LOG_LEVEL": "INFO"}
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== operator start #{self.starts} =====\n".encode())
        self.process = processes.spawn(argv, log=self.log_path, env=env, cwd=REPO_ROOT, append_log=True)
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.liveness_port}/healthz"
        while processes.wait_until(deadline, 0.2):
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the operator exited with {self.process.returncode} while starting:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                continue
        raise AssertionError(f"the operator was not live within {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, *, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            processes.signal_group(self.process, signal.SIGKILL)
            self.process.wait(10)
        else:
            processes.stop(self.process, grace_seconds=15.0)
        self.process = None

    def restart(self, *, kill: bool = True) -> None:
        self.stop(kill=kill)
        self.start()

    def metrics(self) -> str:
        """The operator's Prometheus exposition text."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, max_bytes: int = 6000) -> str:
        return processes.log_tail(self.log_path, max_bytes)


def _base_env() -> dict[str, str]:
    import os

    keep = ("PATH", "HOME", "LANG", "TMPDIR", "KPW_CACHE")
    return {k: os.environ[k] for k in keep if k in os.environ}


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds"))
    cluster.kubectl("wait", "--for", "condition=Established", "--timeout=30s",
                    *(f"crd/{name}" for name in CRDS), timeout=40)


@pytest.fixture(scope="module")
def operator(cluster: Cluster, crds: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    run_dir = tmp_path_factory.mktemp("operator")
    proc = OperatorProcess(cluster.kubeconfig, run_dir).start()
    try:
        yield proc
    finally:
        proc.stop()
        print(f"operator log: {proc.log_path}")


@pytest.fixture
def objects(cluster: Cluster, operator: OperatorProcess, namespace: str) -> Iterator[Objects]:
    """The test namespace's objects; everything in it is deleted (and waited for) afterwards."""
    found = Objects(cluster, namespace)
    yield found
    found.cleanup()


# -- builders ------------------------------------------------------------------------------


def virtual_slice(
    name: str,
    devices: int,
    *,
    island: str | None = None,
    devices_per_host: int | None = None,
    max_restarts: int | None = None,
) -> Manifest:
    spec: Manifest = {"devices": devices}
    if island is not None:
        spec["island"] = island
    if devices_per_host is not None:
        spec["devicesPerHost"] = devices_per_host
    if max_restarts is not None:
        spec["failurePolicy"] = {"maxRestarts": max_restarts}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VirtualSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


def ref_slice(name: str, ref: str) -> Manifest:
    return {"name": name, "ref": ref}


def inline_slice(name: str, devices: int, **template: Any) -> Manifest:
    return {"name": name, "template": {"devices": devices, **template}}


def program(
    name: str,
    entrypoint: str,
    *slices: Manifest,
    steps: int = 1,
    args: Manifest | None = None,
) -> Manifest:
    spec: Manifest = {"slices": list(slices), "source": {"entrypoint": entrypoint}, "steps": steps}
    if args:
        spec["args"] = args
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PathwaysProgram",
        "metadata": {"name": name},
        "spec": spec,
    }


# -- reading state ---------------------------------------------------------------------------


class Objects:
    """Reads VirtualSlices, PathwaysPrograms, pods and events of one namespace."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(cluster.api)
        self.core = client.CoreV1Api(cluster.api)

    def apply(self, manifest: Manifest) -> float:
        """``kubectl apply`` a manifest; returns the monotonic time the command returned."""
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(manifest))
        return time.monotonic()

    def get(self, plural: str, name: str) -> Manifest | None:
        try:
            found: Manifest = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name
            )
            return found
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def slice(self, name: str) -> Manifest:
        found = self.get("virtualslices", name)
        assert found is not None, f"VirtualSlice {self.namespace}/{name} does not exist"
        return found

    def program(self, name: str) -> Manifest:
        found = self.get("pathwaysprograms", name)
        assert found is not None, f"PathwaysProgram {self.namespace}/{name} does not exist"
        return found

    def pods(self, label_selector: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=label_selector).items)

    def pod_uids(self, label_selector: str) -> dict[str, str]:
        return {p.metadata.name: p.metadata.uid for p in self.pods(label_selector)}

    def delete(self, plural: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, name)
        except client.ApiException as e:
            if e.status != 404:
                raise

    def configmap(self, name: str) -> dict[str, str]:
        return dict(self.core.read_namespaced_config_map(name, self.namespace).data or {})

    def cleanup(self, timeout: float = 90.0) -> None:
        """Delete the namespace's programs and slices and wait until their pods are gone.

        Tests share the cluster's islands: a test must not leave devices held for the next.
        """
        for plural in ("pathwaysprograms", "virtualslices"):
            listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)
            for item in listed.get("items", []):
                self.delete(plural, item["metadata"]["name"])
        self.cluster.poll(
            lambda: not self.pods("pathways.dev/slice") and not self._remaining(),
            timeout=timeout, interval=0.5,
            what=f"pods and slices of namespace {self.namespace} deleted",
        )

    def _remaining(self) -> list[str]:
        left = []
        for plural in ("pathwaysprograms", "virtualslices"):
            listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)
            left += [f"{plural}/{i['metadata']['name']}" for i in listed.get("items", [])]
        return left

    def events(self, name: str) -> list[Any]:
        found = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        ).items
        return list(found)

    def wait_event(self, name: str, reason: str, timeout: float = 30.0, text: str = "") -> Any:
        """The first Event about ``name`` with ``reason`` (and ``text`` in its message).

        The operator posts Events after it writes status, from a queue of its own, so a test that has just
        seen a phase waits here a bounded time for the Event that goes with it.
        """

        def posted() -> Any:
            for event in self.events(name):
                if event.reason == reason and text in (event.message or ""):
                    return event
            return None

        return self.cluster.poll(posted, timeout=timeout, interval=0.25,
                                 what=f"Event {reason!r} about {name} (seen: "
                                      f"{[(e.reason, e.message) for e in self.events(name)]})")

    def wait_slice(self, name: str, phase: str, timeout: float, operator: OperatorProcess) -> Manifest:
        def reached() -> Manifest | None:
            found = self.get("virtualslices", name)
            status = (found or {}).get("status") or {}
            return found if status.get("phase") == phase else None

        return self._wait(reached, f"VirtualSlice {name} {phase}", timeout, operator, "virtualslices", name)

    def wait_program(self, name: str, phases: set[str], timeout: float, operator: OperatorProcess) -> Manifest:
        def reached() -> Manifest | None:
            found = self.get("pathwaysprograms", name)
            status = (found or {}).get("status") or {}
            return found if status.get("phase") in phases else None

        return self._wait(reached, f"PathwaysProgram {name} in {sorted(phases)}", timeout, operator,
                          "pathwaysprograms", name)

    def _wait(
        self, check: Any, what: str, timeout: float, operator: OperatorProcess, plural: str, name: str
    ) -> Manifest:
        try:
            result: Manifest = self.cluster.poll(check, timeout=timeout, interval=0.25, what=what)
            return result
        except AssertionError as e:
            last = self.get(plural, name)
            raise AssertionError(
                f"{e}\nlast status: {json.dumps((last or {}).get('status'), indent=1)}\n"
                f"operator log tail:\n{operator.log_tail()}"
            ) from None


def condition(obj: Manifest, type_: str) -> Manifest:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    raise AssertionError(f"no condition {type_} in {json.dumps(obj.get('status'))}")
