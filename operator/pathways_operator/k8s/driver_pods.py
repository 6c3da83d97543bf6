"""Driver pods: one ``<program>-driver`` pod per running PathwaysProgram, from the user's image.

The driver (``python -m pathways.driver``) is a Pathways client running the
program's entrypoint. It runs in a pod of its own, owned by the program
(``restartPolicy: Never``), so the operator's pod runs no user code:

* the image is ``spec.driver.image``, by default the worker image; command,
  args, env, resources, ServiceAccount, nodeSelector and tolerations come from
  ``spec.driver`` over the defaults of :func:`driver_pod`;
* it gets no Kubernetes API access: ``automountServiceAccountToken: false``, and
  nothing grants its ServiceAccount any role. Its one credential is the program's
  token, minted by the operator into Secret ``<program>-driver-token`` (owned by
  the program) and mounted read-only at ``/var/run/pathways/driver``;
* it reports each step and its outcome to the controller (``ReportProgress``,
  ``ReportResult``), presenting that token; :class:`DriverPods` checks it and
  keeps what a program's driver reported in the program's work directory,
  ``progress.jsonl`` and ``results.json``, where the program reconciler reads them
  (as it reads a child process driver's, ``k8s.drivers``), and wakes that reconciler
  at each step;
* its exit code (``pathways_wire.driver_protocol``) and what it reported drive
  the program's phase; a pod deleted or evicted before it reported is a lost host
  (``core.program_lifecycle.driver_pod_state``);
* it is admitted with the program's slices (``core.admission``): the pod is
  bound, as gang pods are, to the Node admission chose for it, so it never
  waits for room once the slices run (:attr:`DriverPods.placer`); a driver no
  Node has room for when it starts (placed anew after an operator restart, or
  of a program without an admission group) is left to the Kubernetes scheduler;
* a restarted operator finds the pod running and leaves it alone (binding it
  if it was created but not bound yet); the tokens it checks are read back from
  the Secrets;
* ``kubectl logs <program>-driver`` shows its output; the pod stays after the
  program ends (it holds nothing then) and goes with the program.

The module runs to about 500 lines because it is one concept: the pod, the token Secret
that is the pod's one credential, and the checking of what the pod reports with that
token are made, read back and deleted together by :class:`DriverPods`.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pathways_wire.driver_protocol import (
    COMPILED_PROGRAM_DIR,
    DRIVER_TOKEN_DIR,
    DRIVER_TOKEN_KEY,
    ENV_PROGRAM,
    ENV_PROGRAM_TOKEN_FILE,
    PROGRESS_FILE,
    RESULTS_FILE,
    RunStart,
    driver_pod_name,
    driver_token_secret,
    steps_completed,
)
from pathways_wire.kube_names import (
    COMPONENT_LABEL,
    DRIVER_CONTAINER,
    DRIVER_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PROGRAM_LABEL,
    SCHEDULER_NAME,
)
from pathways_wire.slice_token import new_token

from pathways_operator.core.client_access import ClientScope
from pathways_operator.core.driver_placement import DriverRequest, Toleration
from pathways_operator.core.token_read_back import ReadBackGate
from pathways_operator.core.program_lifecycle import DriverPodFact, DriverState, Reported, driver_pod_state
from pathways_operator.k8s.cluster_api import AlreadyExists, ClusterApi, Json
from pathways_operator.k8s.drivers import DriverLaunch, DriverStatus, read_outcome
from pathways_operator.k8s.gang_pods import check_resources, requested_resources
from pathways_operator.k8s.inventory import unreachable
from pathways_operator.k8s.pathways_program import DriverSpec

log = logging.getLogger(__name__)

RECONNECT_S = 300
"""How long a driver pod waits for its controller to come back (an operator restart) before it fails."""
LOG_TAIL_LINES = 40
"""Lines of a failed driver's log quoted in the program's message (when the kubelet serves them)."""
RUN_STARTS_FILE = "run-starts.log"
"""In a program's work directory: each run's start line (``RunStart.line``), as its driver reported it."""
CheckpointVolumes = Literal["claim", "host-path"]


@dataclass(frozen=True)
class DriverPodSettings:
    """What every driver pod of this operator shares."""

    image: str
    """The default image (the worker image)."""
    controller: str = ""
    """HOST:PORT the drivers dial (the operator's Service on a cluster); set once it listens."""
    pull_policy: str = ""
    """The image pull policy of worker pods ("": the cluster's default)."""
    checkpoint_volumes: CheckpointVolumes = "claim"
    """How ``spec.checkpoint.volume`` reaches the pod: the PersistentVolumeClaim, or (a
    cluster whose nodes share the operator's filesystem: the test and dev clusters) the
    operator's checkpoint directory as a hostPath."""


@dataclass(frozen=True)
class ProgramKey:
    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def driver_args(launch: DriverLaunch, controller: str) -> list[str]:
    """The arguments of ``python -m pathways.driver`` that run ``launch`` in a pod."""
    source = ["--entrypoint", launch.entrypoint]
    if launch.compiled_program is not None:
        source = ["--compiled-program", COMPILED_PROGRAM_DIR]
    args = [
        *source,
        "--args", json.dumps(launch.args),
        "--steps", str(launch.steps),
        "--start-step", str(launch.start_step),
        "--weight", repr(launch.weight),
        "--controller", controller,
        "--namespace", launch.namespace,
        "--program", launch.name,
        "--slices", json.dumps(launch.slices),
        "--report-to-controller",
    ]  # fmt: skip
    if launch.checkpoint_dir:
        args += ["--checkpoint-dir", launch.checkpoint_dir, "--checkpoint-every", str(launch.checkpoint_every)]
    return args


SLICES_ANNOTATION = "pathways.dev/virtual-slices"
"""On a driver pod: the VirtualSlices its token grants (read back by a restarted operator)."""


def virtual_slices(launch: DriverLaunch) -> list[str]:
    """The VirtualSlices the program's token is good for: its spec.slices."""
    return sorted({str(s.get("virtualSlice")) for s in launch.slices.values()})


def driver_pod(launch: DriverLaunch, settings: DriverPodSettings, checkpoint_claim: str = "") -> Json:
    """The pod manifest of ``launch``'s driver; ``spec.driver`` over the operator's defaults."""
    d = launch.pod
    name = driver_pod_name(launch.name)
    mounts: list[Json] = [{"name": "program-token", "mountPath": DRIVER_TOKEN_DIR, "readOnly": True}]
    volumes: list[Json] = [{
        "name": "program-token",
        "secret": {"secretName": driver_token_secret(launch.name), "defaultMode": 0o400},
    }]
    if launch.compiled_program is not None:
        config_map = str((launch.compiled_program.get("metadata") or {}).get("name") or "")
        mounts.append({"name": "compiled-program", "mountPath": COMPILED_PROGRAM_DIR, "readOnly": True})
        volumes.append({"name": "compiled-program", "configMap": {"name": config_map}})
    if launch.checkpoint_dir:
        where = str(PurePosixPath(launch.checkpoint_dir).parent)
        mounts.append({"name": "checkpoints", "mountPath": where})
        source: Json = (
            {"hostPath": {"path": where, "type": "DirectoryOrCreate"}}
            if settings.checkpoint_volumes == "host-path"
            else {"persistentVolumeClaim": {"claimName": checkpoint_claim}}
        )
        volumes.append({"name": "checkpoints", **source})
    env: list[Json] = [
        {"name": ENV_PROGRAM_TOKEN_FILE, "value": f"{DRIVER_TOKEN_DIR}/{DRIVER_TOKEN_KEY}"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "PATHWAYS_RECONNECT_S", "value": str(RECONNECT_S)},
        {"name": "PATHWAYS_NAMESPACE", "value": launch.namespace},
        {"name": ENV_PROGRAM, "value": launch.name},
        *d.env,
    ]
    container: Json = {
        "name": DRIVER_CONTAINER,
        "image": d.image or settings.image,
        "command": list(d.command) or ["python", "-m", "pathways.driver"],
        "args": list(d.args) or driver_args(launch, settings.controller),
        "env": env,
        "volumeMounts": mounts,
    }
    if settings.pull_policy:
        container["imagePullPolicy"] = settings.pull_policy
    if d.resources:
        container["resources"] = dict(d.resources)
    spec: Json = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": volumes,
    }
    if d.service_account_name:
        spec["serviceAccountName"] = d.service_account_name
    if d.node_selector:
        spec["nodeSelector"] = dict(d.node_selector)
    if d.tolerations:
        spec["tolerations"] = [dict(t) for t in d.tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": launch.namespace,
            "labels": {
                DRIVER_LABEL: launch.name,
                PROGRAM_LABEL: launch.name,
                COMPONENT_LABEL: "driver",
                MANAGED_BY_LABEL: MANAGED_BY,
            },
            "annotations": {
                "pathways.dev/start-step": str(launch.start_step),
                SLICES_ANNOTATION: json.dumps(virtual_slices(launch)),
            },
            "ownerReferences": [launch.owner_reference] if launch.owner_reference else [],
        },
        "spec": spec,
    }


def driver_request(program: str, pod: Mapping[str, Any]) -> DriverRequest:
    """What the driver pod ``pod`` of ``program`` (``namespace/name``) asks of a Node."""
    spec = pod.get("spec") or {}
    tolerations = tuple(
        Toleration(str(t.get("key") or ""), str(t.get("operator") or "Equal"), str(t.get("value") or ""),
                   str(t.get("effect") or ""))
        for t in spec.get("tolerations") or [] if isinstance(t, Mapping)
    )
    selector = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    return DriverRequest(program, requested_resources(pod), selector, tolerations)


def spec_request(program: str, spec: DriverSpec) -> DriverRequest:
    """What the driver pod of ``spec.driver`` will ask of a Node; ValueError naming a malformed field."""
    check_resources(spec.resources, "spec.driver.resources")
    return driver_request(program, {"spec": {
        "containers": [{"resources": dict(spec.resources)}],
        "nodeSelector": dict(spec.node_selector),
        "tolerations": [dict(t) for t in spec.tolerations],
    }})


Placer = Callable[[str, DriverRequest], "str | None"]
"""(program uid, what its driver requests) -> the Node its pod goes to, or None: any the scheduler finds."""


def pod_fact(pod: Mapping[str, Any] | None) -> DriverPodFact:
    """The driver pod as the core reads it."""
    if pod is None:
        return DriverPodFact(exists=False)
    status = pod.get("status") or {}
    exit_code: int | None = None
    reason = str(status.get("reason") or "")
    for c in status.get("containerStatuses") or []:
        if c.get("name") == DRIVER_CONTAINER:
            terminated = (c.get("state") or {}).get("terminated")
            if terminated is not None:
                exit_code = int(terminated.get("exitCode", 0))
                reason = reason or str(terminated.get("reason") or "")
    return DriverPodFact(
        exists=True,
        phase=str(status.get("phase") or ""),
        deleting=bool((pod.get("metadata") or {}).get("deletionTimestamp")),
        exit_code=exit_code,
        reason=reason,
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
    )


class UnknownProgramToken(Exception):
    """A report presented no token, or one of no running program."""


class DriverPods:
    """Starts, watches and stops driver pods, and takes their drivers' reports."""

    def __init__(
        self, api: ClusterApi, state_dir: Path, settings: DriverPodSettings,
        wake: Callable[[str], None] = lambda key: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._clock = clock
        self._read_backs = ReadBackGate()
        """When an unseen token may be checked against its program's Secret (`program_of`)."""
        self._wake = wake
        """``wake(namespace/name)``: a program's driver reported a step; its reconciler looks now,
        so ``status.stepsCompleted`` follows the report, not the reconciler's next poll."""
        self._state_dir = state_dir
        self.settings = settings
        self._lock = threading.Lock()
        self._tokens: dict[str, ProgramKey] = {}
        """Program token -> its program."""
        self._token_of: dict[str, str] = {}
        self._started: set[str] = set()
        """Programs whose pod this operator started or saw running: its disappearance is a loss."""
        self._suspend: set[str] = set()
        self._slices: dict[str, frozenset[str]] = {}
        """Program key -> the VirtualSlices its token grants."""
        self.placer: Placer | None = None
        """Where admission put each driver (``AdmissionQueue.driver_node``); None: the scheduler places them."""

    # ------------------------------------------------------------ the reconciler's side

    def workdir(self, namespace: str, name: str, uid: str) -> Path:
        return self._state_dir / namespace / f"{name}-{uid[:8]}"

    def steps_completed(self, namespace: str, name: str, uid: str) -> int:
        return steps_completed(self.workdir(namespace, name, uid) / PROGRESS_FILE)

    def log_text(self, namespace: str, name: str, uid: str, limit_bytes: int) -> str:
        """The driver's log: where each run started (its earlier pods are gone), then the last pod's
        log as the kubelet serves it (where none does, the runs' starts alone)."""
        try:
            starts = (self.workdir(namespace, name, uid) / RUN_STARTS_FILE).read_text().splitlines(keepends=True)
        except OSError:
            starts = []
        last = self._api.pod_log(namespace, driver_pod_name(name), DRIVER_CONTAINER, 10_000)
        text = "".join(starts[:-1] if last else starts) + last
        return text[-limit_bytes:]

    def status(self, namespace: str, name: str, uid: str, ran_before: bool = False) -> DriverStatus:
        """Where the program's driver is. ``ran_before``: the program's status says its driver
        runs (`driver_was_running`), so a pod gone without an outcome was lost even where this
        operator, restarted meanwhile, never saw it."""
        program = ProgramKey(namespace, name, uid)
        pod = self._api.get_pod(namespace, driver_pod_name(name))
        if pod is not None and _owner_uid(pod) not in ("", uid):
            pod = None  # a pod of an earlier program of the same name, going away with it
        workdir = self.workdir(namespace, name, uid)
        reported = (workdir / RESULTS_FILE).exists()
        with self._lock:
            started = program.key in self._started or ran_before
        fact = self._with_node(pod_fact(pod))
        where = driver_pod_state(fact, reported=reported, started_here=started, pod_name=driver_pod_name(name))
        if where.remove and pod is not None:
            log.warning("%s: driver pod %s is being deleted on Node %s, which stopped reporting; "
                        "removing it now", program.key, driver_pod_name(name), fact.node)
            self._delete(pod, grace_seconds=0)
        if where.state is DriverState.RUNNING and pod is not None:
            self._bind_if_unbound(ProgramKey(namespace, name, _owner_uid(pod) or uid), pod)
        if where.state is DriverState.RUNNING:
            self._register(program)
            with self._lock:
                self._started.add(program.key)
        if where.state is not DriverState.EXITED:
            return DriverStatus(where.state)
        if where.lost:
            return DriverStatus(DriverState.EXITED, None, error=where.lost, retryable=True, reported=Reported.LOST)
        tail = ""
        if where.exit_code not in (0, None):
            tail = self._api.pod_log(namespace, driver_pod_name(name), DRIVER_CONTAINER, LOG_TAIL_LINES).strip()
        return read_outcome(workdir, where.exit_code, tail)

    def start(self, launch: DriverLaunch) -> None:
        """Mint (or read back) the program's token and create its driver pod."""
        program = ProgramKey(launch.namespace, launch.name, launch.uid)
        workdir = self.workdir(launch.namespace, launch.name, launch.uid)
        workdir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (workdir / RESULTS_FILE).unlink()
        self._register(program, launch.owner_reference)
        with self._lock:
            self._slices[program.key] = frozenset(virtual_slices(launch))
        claim = ""
        if launch.checkpoint_dir:
            claim = PurePosixPath(launch.checkpoint_dir).parent.name
        manifest = driver_pod(launch, self.settings, claim)
        node = None if self.placer is None else self.placer(launch.uid, driver_request(program.key, manifest))
        if node is not None:
            manifest["spec"]["schedulerName"] = SCHEDULER_NAME
        try:
            self._api.create_pod(launch.namespace, manifest)
        except AlreadyExists:
            log.info("%s: driver pod already exists", program.key)
        else:
            if node is not None:
                self._api.bind_pod(launch.namespace, driver_pod_name(launch.name), node)
        with self._lock:
            self._started.add(program.key)
            self._suspend.discard(program.key)
        log.info("%s: driver pod %s created, starting at step %d", program.key,
                 driver_pod_name(launch.name), launch.start_step)

    def _bind_if_unbound(self, program: ProgramKey, pod: Json) -> None:
        """Bind a driver pod created for binding but not bound (the operator stopped in between)."""
        spec = pod.get("spec") or {}
        if self.placer is None or spec.get("schedulerName") != SCHEDULER_NAME or spec.get("nodeName"):
            return
        node = self.placer(program.uid, driver_request(program.key, pod))
        if node is None:
            return  # no Node has room now: it is bound once one has, at a later look
        self._api.bind_pod(program.namespace, driver_pod_name(program.name), node)
        log.info("%s: driver pod %s bound to %s", program.key, driver_pod_name(program.name), node)

    def stop(self, namespace: str, name: str, uid: str) -> None:
        """Delete the driver pod if it still runs (a finished one stays for ``kubectl logs``)."""
        with self._lock:
            self._started.discard(f"{namespace}/{name}")
        pod = self._api.get_pod(namespace, driver_pod_name(name))
        if pod is None or _owner_uid(pod) not in ("", uid):
            return
        fact = pod_fact(pod)
        if fact.exit_code is None and fact.phase not in ("Succeeded", "Failed") and not fact.deleting:
            self._delete(pod)

    def request_suspend(self, namespace: str, name: str) -> bool:
        """Answer the driver's next ``ReportProgress`` with ``suspend``."""
        with self._lock:
            self._suspend.add(f"{namespace}/{name}")
        return True

    def discard_outcome(self, namespace: str, name: str, uid: str) -> None:
        """Forget how the last run ended: its pod is deleted, so that the next look starts a new one."""
        with self._lock:
            self._started.discard(f"{namespace}/{name}")
            self._suspend.discard(f"{namespace}/{name}")
        pod = self._api.get_pod(namespace, driver_pod_name(name))
        if pod is not None and _owner_uid(pod) in ("", uid) and not pod_fact(pod).deleting:
            self._delete(pod)
        with contextlib.suppress(FileNotFoundError):
            (self.workdir(namespace, name, uid) / RESULTS_FILE).unlink()

    def retire(self, namespace: str, name: str, uid: str) -> None:
        """The program ended: its token is good for nothing any more."""
        self.stop(namespace, name, uid)
        self._unregister(f"{namespace}/{name}")

    def forget(self, namespace: str, name: str, uid: str) -> None:
        """The program is gone (its pod and Secret go with it): forget its token and work directory."""
        key = f"{namespace}/{name}"
        with self._lock:
            self._started.discard(key)
            self._suspend.discard(key)
        self._unregister(key)
        shutil.rmtree(self.workdir(namespace, name, uid), ignore_errors=True)

    def stop_all(self) -> None:
        """An operator that stops leaves driver pods running: the next one carries on with them."""

    # ------------------------------------------------------------ the drivers' side (gRPC)

    def program_of(self, token: str, named: tuple[str, str] = ("", "")) -> ProgramKey:
        """The program whose token this is; UnknownProgramToken otherwise.

        ``named`` (namespace, program), as the report names it, lets an operator that
        restarted check a token it has not seen against that program's Secret.
        """
        with self._lock:
            found = self._tokens.get(token) if token else None
        if found is None and token and all(named):
            found = self._read_back(token, *named)
        if found is None:
            raise UnknownProgramToken(
                "no program token was presented (metadata x-pathways-client-token)" if not token
                else "the program token presented belongs to no running PathwaysProgram"
            )
        return found

    def _read_back(self, token: str, namespace: str, name: str) -> ProgramKey | None:
        """The named program, if `token` is the one its Secret holds. The Secret is read only
        where the program's token is not known yet, and as `ReadBackGate` allows; what a read
        finds is kept, so a wrong token for that program is then refused without one."""
        key = f"{namespace}/{name}"
        with self._lock:
            if key in self._token_of:
                return None  # its token is known, and it is not this one
            if not self._read_backs.allow(key, self._clock()):
                return None
        secret = self._api.get_secret(namespace, driver_token_secret(name))
        owner = _owner_uid(secret) if secret is not None else ""
        held = ""
        if secret is not None and owner:
            held = base64.b64decode((secret.get("data") or {}).get(DRIVER_TOKEN_KEY, "")).decode()
        with self._lock:
            if not held:
                self._read_backs.missed(key, self._clock())
                return None
            self._read_backs.found(key)
            program = ProgramKey(namespace, name, owner)
            if key not in self._token_of:
                self._tokens[held] = program
                self._token_of[key] = held
        return program if hmac.compare_digest(held, token) else None

    def scope_of(self, token: str, named: tuple[str, str]) -> ClientScope | None:
        """What a client token grants: its program's own VirtualSlices (``client_gate.TokenScopes``)."""
        try:
            program = self.program_of(token, named)
        except UnknownProgramToken:
            return None
        with self._lock:
            slices = self._slices.get(program.key)
        if slices is None:
            pod = self._api.get_pod(program.namespace, driver_pod_name(program.name))
            annotation = ((pod or {}).get("metadata") or {}).get("annotations", {}).get(SLICES_ANNOTATION, "[]")
            slices = frozenset(json.loads(annotation)) if pod is not None else frozenset()
            with self._lock:
                self._slices[program.key] = slices
        return ClientScope.program(program.namespace, program.name, slices)

    def report_progress(
        self, token: str, step: int, metrics: Mapping[str, float], named: tuple[str, str] = ("", "")
    ) -> bool:
        """Record a completed step of the token's program; True when it should suspend now."""
        program = self.program_of(token, named)
        if step < 0:
            raise ValueError(f"step {step} is negative; steps count from 0")
        line = {"step": int(step), "metrics": dict(metrics)}
        workdir = self.workdir(program.namespace, program.name, program.uid)
        workdir.mkdir(parents=True, exist_ok=True)
        with open(workdir / PROGRESS_FILE, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
        self._wake(program.key)
        with self._lock:
            return program.key in self._suspend

    def report_start(self, token: str, run: RunStart, named: tuple[str, str] = ("", "")) -> None:
        """Record where a run of the token's program's driver starts (its pod's log goes with the pod)."""
        program = self.program_of(token, named)
        workdir = self.workdir(program.namespace, program.name, program.uid)
        workdir.mkdir(parents=True, exist_ok=True)
        with open(workdir / RUN_STARTS_FILE, "a", encoding="utf-8") as out:
            out.write(run.line + "\n")

    def report_result(self, token: str, payload: Mapping[str, Any], named: tuple[str, str] = ("", "")) -> None:
        """Record how the token's program's driver ended (it exits right after)."""
        program = self.program_of(token, named)
        workdir = self.workdir(program.namespace, program.name, program.uid)
        workdir.mkdir(parents=True, exist_ok=True)
        tmp = workdir / (RESULTS_FILE + ".tmp")
        tmp.write_text(json.dumps(payload))
        tmp.replace(workdir / RESULTS_FILE)

    # ------------------------------------------------------------ tokens

    def _register(self, program: ProgramKey, owner: Json | None = None) -> None:
        """Know the program's token: read its Secret, or mint one into a new Secret owned by the
        program. With ``owner`` (a driver pod is about to be made, which mounts the Secret as it
        is now) the Secret is read again even if the token is known: one deleted meanwhile is
        made anew, and the new token replaces the old."""
        with self._lock:
            if owner is None and program.key in self._token_of:
                return
        name = driver_token_secret(program.name)
        secret = self._api.get_secret(program.namespace, name)
        if secret is None and owner is not None:
            token = new_token()
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {
                    "name": name,
                    "namespace": program.namespace,
                    "labels": {PROGRAM_LABEL: program.name, MANAGED_BY_LABEL: MANAGED_BY},
                    "ownerReferences": [owner],
                },
                "data": {DRIVER_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
            }
            try:
                self._api.create_secret(program.namespace, body)
            except AlreadyExists:
                secret = self._api.get_secret(program.namespace, name)
        if secret is not None:
            if _owner_uid(secret) != program.uid:
                log.warning("%s: Secret %s is not owned by the program; its driver cannot report", program.key, name)
                return
            token = base64.b64decode((secret.get("data") or {}).get(DRIVER_TOKEN_KEY, "")).decode()
        elif owner is None:
            return
        if not token:
            return
        with self._lock:
            old = self._token_of.get(program.key)
            if old is not None and old != token:
                self._tokens.pop(old, None)
            self._tokens[token] = program
            self._token_of[program.key] = token

    def _unregister(self, key: str) -> None:
        with self._lock:
            self._slices.pop(key, None)
            token = self._token_of.pop(key, None)
            if token is not None:
                self._tokens.pop(token, None)

    def _with_node(self, fact: DriverPodFact) -> DriverPodFact:
        """The fact with its Node's reachability, read only for a pod being deleted whose
        container has not ended: the one case where a dead Node would hold it forever."""
        if not (fact.deleting and fact.node and fact.exit_code is None):
            return fact
        node = self._api.get_node(fact.node)
        return replace(fact, node_unreachable=node is None or unreachable(node))

    def _delete(self, pod: Json, grace_seconds: int | None = None) -> None:
        meta = pod.get("metadata") or {}
        self._api.delete_pod(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")),
                             grace_seconds=grace_seconds)


def _owner_uid(obj: Mapping[str, Any]) -> str:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid") or "")
    return ""
