"""``python -m pathways_operator``: the Kubernetes operator, resource manager and island scheduler in one process.

One process runs:

* the **controller** (``pathways_operator.controller``) behind its gRPC service
  on ``--controller-listen``: the island scheduler that clients and program
  drivers talk to;
* **kopf** (standalone, no peering: with ``--leader-election=on`` the process
  starts all of this only once it holds the operator's Lease, ``k8s.leader_lease``)
  with the handlers of ``k8s.handlers``: the
  resource manager that turns VirtualSlices into gangs of worker pods and
  registers them with the controller, and the runner of PathwaysPrograms,
  whose drivers run in pods of their own (``k8s.driver_pods``), from the
  user's image, and reach the controller at ``--controller-address``.
  ``--driver-runtime processes`` runs them as child processes of the operator
  instead (the earlier design, for comparisons and single-machine use).

Run it out of cluster with ``KUBECONFIG`` set, or in a pod with a service
account (see the Helm chart).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import sys
import uuid
from pathlib import Path

import kopf
from kubernetes import client as kclient
from kubernetes import config as kconfig

from pathways_wire import host_port
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.env_flags import env_option
from pathways_operator.controller import Controller, controller_server
from pathways_operator.controller.calls_port import CallsPort
from pathways_operator.controller.client_gate import ClientGate
from pathways_operator.k8s import handlers, log_context
from pathways_operator.k8s.cluster_api import ClusterApi
from pathways_operator.k8s.driver_pods import DriverPods, DriverPodSettings
from pathways_operator.k8s.driver_reports import OperatorControllerService
from pathways_operator.k8s.drivers import DriverSupervisor
from pathways_operator.core.program_look import DEFAULT_SUSPEND_GRACE_S
from pathways_operator.k8s.program_reconciler import DEFAULT_ALLOWED_ENTRYPOINTS, ProgramReconciler
from pathways_operator.k8s.gang_pods import WorkerDefaults, check_resources
from pathways_operator.k8s.host_policy import OperatorPods
from pathways_operator.k8s.leader_lease import DEFAULT_LEASE_S, MIN_LEASE_S, LeaderLease, lease_length_problem
from pathways_operator.k8s.metrics import OperatorMetrics
from pathways_operator.k8s.slice_reconciler import SliceReconciler

log = logging.getLogger("pathways_operator")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pathways_operator",
        description="Kube-Pathways operator: VirtualSlices as gangs of worker pods, "
        "PathwaysPrograms run against the island scheduler.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", help="watch only this namespace")
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace (default)")
    parser.add_argument("--controller-listen", default="0.0.0.0:8470",
                        help="HOST:PORT of the controller's gRPC service (port 0: any free port)")
    parser.add_argument("--allowed-entrypoints", default=None,
                        help="comma-separated prefixes a PathwaysProgram's spec.source.entrypoint "
                        "must start with; an opt-in policy for driver pods (default: any), "
                        f"required of child-process drivers (default {','.join(DEFAULT_ALLOWED_ENTRYPOINTS)})")
    env_option(parser, "--controller-calls-port", variable="PATHWAYS_CONTROLLER_CALLS_PORT", env=os.environ,
               type=_port_or_any, default=0,
               help="serve the controller's calls port on this port of --controller-listen's host: a driver "
               "pod's Run, WaitCall and FinishCall as frames over raw TCP, each through the same token "
               "check, taken in the order they came; 0: off, drivers call over gRPC (default); any: a "
               "free port (PATHWAYS_CONTROLLER_CALLS_PORT). Needs --driver-runtime pods")
    env_option(parser, "--driver-runtime", variable="PATHWAYS_DRIVER_RUNTIME", env=os.environ,
               choices=("pods", "processes"), default="pods",
               help="where program drivers run: in pods of their own (default), or as child "
               "processes of the operator (PATHWAYS_DRIVER_RUNTIME)")
    env_option(parser, "--controller-address", variable="PATHWAYS_CONTROLLER_ADDRESS", env=os.environ,
               default="",
               help="HOST:PORT at which driver pods reach the controller, e.g. the operator's Service "
               "(PATHWAYS_CONTROLLER_ADDRESS; default: the address it listens on, loopback for 0.0.0.0)")
    env_option(parser, "--driver-image", variable="PATHWAYS_DRIVER_IMAGE", env=os.environ, default="",
               help="image of driver pods whose program gives no spec.driver.image (PATHWAYS_DRIVER_IMAGE; "
               "default: the worker image)")
    env_option(parser, "--driver-checkpoint-volumes", variable="PATHWAYS_DRIVER_CHECKPOINT_VOLUMES",
               env=os.environ, choices=("claim", "host-path"), default="claim",
               help="how a driver pod mounts spec.checkpoint.volume: the PersistentVolumeClaim (default), "
               "or the operator's checkpoint directory as a hostPath, for clusters whose nodes share "
               "the operator's filesystem (PATHWAYS_DRIVER_CHECKPOINT_VOLUMES)")
    parser.add_argument("--liveness", default=None,
                        help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    env_option(parser, "--metrics-port", variable="PATHWAYS_METRICS_PORT", env=os.environ, type=_port_or_any,
               default=0,
               help="serve Prometheus /metrics on this port; 0: off; any: a free port, logged once "
               "bound (PATHWAYS_METRICS_PORT)")
    env_option(parser, "--state-dir", variable="PATHWAYS_OPERATOR_STATE_DIR", env=os.environ, type=Path,
               default=Path("/tmp/pathways-operator"),
               help="where program drivers keep progress, results and logs")
    env_option(parser, "--checkpoint-root", variable="PATHWAYS_CHECKPOINT_ROOT", env=os.environ, type=Path,
               default=None,
               help="where PersistentVolumeClaims named by spec.checkpoint.volume are mounted: "
               "snapshots go to ROOT/<namespace>/<claim>/<program>-<uid>/ "
               "(PATHWAYS_CHECKPOINT_ROOT; default <state-dir>/checkpoints)")
    env_option(parser, "--suspend-grace-seconds", variable="PATHWAYS_SUSPEND_GRACE_SECONDS", env=os.environ,
               type=_positive_seconds, default=DEFAULT_SUSPEND_GRACE_S,
               help="how long a suspended program's driver may take to reach a step boundary "
               "(ctx.step_done) before it is stopped; it then resumes from its last periodic "
               "snapshot (PATHWAYS_SUSPEND_GRACE_SECONDS)")
    env_option(parser, "--worker-image", variable="PATHWAYS_WORKER_IMAGE", env=os.environ,
               default=WorkerDefaults.image,
               help="image of worker pods when a VirtualSlice gives none (PATHWAYS_WORKER_IMAGE)")
    env_option(parser, "--worker-image-pull-policy", variable="PATHWAYS_WORKER_IMAGE_PULL_POLICY", env=os.environ,
               default="",
               help="imagePullPolicy of worker pods (PATHWAYS_WORKER_IMAGE_PULL_POLICY)")
    env_option(parser, "--worker-resources", variable="PATHWAYS_WORKER_RESOURCES", env=os.environ,
               type=_json_object, default="{}",
               help="JSON ResourceRequirements of worker containers when a VirtualSlice's "
               "spec.resources is empty (PATHWAYS_WORKER_RESOURCES)")
    env_option(parser, "--devices-per-host", variable="PATHWAYS_DEVICES_PER_HOST", env=os.environ, type=int,
               default=0,
               help="host size of slices without spec.devicesPerHost; 0: the island's "
               "machine size (PATHWAYS_DEVICES_PER_HOST)")
    env_option(parser, "--host-network-policy", variable="PATHWAYS_HOST_NETWORK_POLICY", env=os.environ,
               choices=("on", "off"), default="off",
               help="give each VirtualSlice a NetworkPolicy in front of its host pods, admitting only "
               "kube-pathways hosts and drivers of its namespace and the operator's pods (and its sidecars' "
               "metrics port to anyone), made before its first pod (PATHWAYS_HOST_NETWORK_POLICY; "
               "default off; needs --operator-namespace and --operator-pod-labels)")
    env_option(parser, "--operator-namespace", variable="POD_NAMESPACE", env=os.environ, default="",
               help="the namespace of the operator's pods, for --host-network-policy and --leader-election "
               "(POD_NAMESPACE)")
    env_option(parser, "--operator-pod-labels", variable="PATHWAYS_OPERATOR_POD_LABELS", env=os.environ,
               type=_json_object, default="{}",
               help="JSON labels that select the operator's pods, for --host-network-policy "
               "(PATHWAYS_OPERATOR_POD_LABELS)")
    env_option(parser, "--leader-election", variable="PATHWAYS_LEADER_ELECTION", env=os.environ,
               choices=("on", "off"), default="off",
               help="act only while holding a Lease in --operator-namespace, so that two operators never "
               "serve the cluster at once: wait while another holds it, stop when it cannot be renewed "
               "(PATHWAYS_LEADER_ELECTION; default off; the chart turns it on)")
    env_option(parser, "--leader-election-lease", variable="PATHWAYS_LEADER_ELECTION_LEASE", env=os.environ,
               default="kube-pathways-operator",
               help="the name of that Lease (PATHWAYS_LEADER_ELECTION_LEASE)")
    env_option(parser, "--leader-election-lease-seconds", variable="PATHWAYS_LEADER_ELECTION_LEASE_SECONDS",
               env=os.environ, type=_positive_seconds, default=DEFAULT_LEASE_S,
               help="how long the Lease holds unrenewed; a leader that cannot renew it for two thirds of "
               f"that stops (PATHWAYS_LEADER_ELECTION_LEASE_SECONDS; at least {MIN_LEASE_S:g})")
    parser.add_argument("--allow-system-priority-classes", action="store_true",
                        default=_env_flag("PATHWAYS_ALLOW_SYSTEM_PRIORITY_CLASSES"),
                        help="let VirtualSlices use the system-node-critical and system-cluster-critical "
                        "PriorityClasses (any system-* class); by default such slices are Failed, since "
                        "they would preempt every namespace (PATHWAYS_ALLOW_SYSTEM_PRIORITY_CLASSES=true)")
    return parser


def _env_flag(name: str) -> bool:
    """A boolean environment variable: true/1/yes, false/0/no/unset; anything else stops the operator."""
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise SystemExit(f"pathways_operator: {name}={os.environ[name]!r}: expected true or false")


ANY_PORT = -1
"""``--metrics-port any``: bind port 0 and log the port bound."""


def _port_or_any(text: str) -> int:
    word = text.strip().lower()
    if word == "any":
        return ANY_PORT
    if word.isdigit() and int(word) <= 65535:
        return int(word)
    raise argparse.ArgumentTypeError(f"expected a port number, 0 (off) or any, got {text!r}")


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return seconds


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _api_client() -> kclient.ApiClient:
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        kconfig.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        kconfig.load_kube_config()  # type: ignore[no-untyped-call]
    return kclient.ApiClient()


def _local_address(listen: str, port: int) -> str:
    """How a driver on this machine reaches the controller."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host in ("", "0.0.0.0", "::", "*"):
        host = "127.0.0.1"
    return host_port.join(host, port)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        check_resources(args.worker_resources, "--worker-resources")
    except ValueError as err:
        parser.error(f"{err} (PATHWAYS_WORKER_RESOURCES)")
    host_policy = None
    if args.host_network_policy == "on":
        try:
            host_policy = OperatorPods(args.operator_namespace, args.operator_pod_labels)
        except ValueError as err:
            parser.error(f"--host-network-policy=on: {err}: give --operator-namespace (POD_NAMESPACE) and "
                         "--operator-pod-labels (PATHWAYS_OPERATOR_POD_LABELS)")
    if args.controller_calls_port and args.driver_runtime != "pods":
        parser.error("--controller-calls-port: a calls port checks the tokens of driver pods; it needs "
                     "--driver-runtime pods (or give 0, off)")
    if args.leader_election == "on" and not args.operator_namespace:
        parser.error("--leader-election=on: give --operator-namespace (POD_NAMESPACE), where the Lease is kept")
    lease_problem = lease_length_problem(args.leader_election_lease_seconds)
    if lease_problem:
        parser.error(f"--leader-election-lease-seconds {args.leader_election_lease_seconds:g}: {lease_problem}")
    log_context.configure(os.environ.get("PATHWAYS_LOG_LEVEL", "INFO"))
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per handled event otherwise
    namespace: str | None = args.namespace
    api_client = _api_client()
    lease = None
    if args.leader_election == "on":
        lease = LeaderLease(api_client, args.operator_namespace, args.leader_election_lease,
                            f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}",
                            duration_s=args.leader_election_lease_seconds)
        lease.acquire()
        lease.keep(_stop_at_once)
    try:
        return _serve(args, api_client, namespace, host_policy)
    finally:
        if lease is not None:
            lease.release()


def _stop_at_once(why: str) -> None:
    """Leadership is lost: stop acting now, before another operator may take over."""
    log.critical("%s: this operator stops at once, so that it never acts beside the new leader", why)
    logging.shutdown()
    os._exit(1)


def _serve(args: argparse.Namespace, api_client: kclient.ApiClient, namespace: str | None,
           host_policy: OperatorPods | None) -> int:
    """The operator proper: the controller, the reconcilers and kopf, until kopf stops."""
    api = ClusterApi(api_client, namespace)
    wakeups = handlers.Wakeups()

    slices: SliceReconciler | None = None
    controller = Controller.kubernetes(
        lambda: slices.machines() if slices is not None else [],
        explain_missing=lambda key: slices.explain(key) if slices is not None else "starting",
    )
    driver_pods: DriverPods | None = None
    if args.driver_runtime == "pods":
        driver_pods = DriverPods(api, args.state_dir, DriverPodSettings(
            image=args.driver_image or args.worker_image, pull_policy=args.worker_image_pull_policy,
            checkpoint_volumes=args.driver_checkpoint_volumes,
        ), wake=lambda key: wakeups.wake(handlers.program_key(*key.split("/", 1))))
    gate = ClientGate(driver_pods) if driver_pods is not None else None
    server = controller_server([gate] if gate is not None else [])
    port = server.add_insecure_port(args.controller_listen)
    if port == 0:
        print(f"pathways_operator: cannot listen on {args.controller_listen}", file=sys.stderr)
        return 2
    address = args.controller_address or _local_address(args.controller_listen, port)
    if driver_pods is not None:
        driver_pods.settings = dataclasses.replace(driver_pods.settings, controller=address)
    service = OperatorControllerService(controller, driver_pods)
    pb_grpc.add_ControllerServicer_to_server(service, server)
    calls: CallsPort | None = None
    if args.controller_calls_port and gate is not None:
        wanted = 0 if args.controller_calls_port == ANY_PORT else args.controller_calls_port
        listen_host = host_port.split(args.controller_listen, "--controller-listen")[0]
        try:
            calls = CallsPort(service, gate, listen_host, port=wanted)
        except OSError as err:
            print(f"pathways_operator: --controller-calls-port {wanted}: cannot listen on "
                  f"{host_port.join(listen_host, wanted)}: {err}", file=sys.stderr)
            return 2
        service.calls_port = calls.port  # told in Describe: drivers take it at the host of their address
    server.start()
    log.info("controller listening on %s (drivers use %s)%s", args.controller_listen, address,
             f"; its calls port on {calls.port}" if calls is not None else "")

    metrics = OperatorMetrics(lambda: controller.computations_dispatched, controller.contended_grants)
    if args.metrics_port:
        bound = metrics.serve(0 if args.metrics_port == ANY_PORT else args.metrics_port)
        log.info("serving /metrics on port %d", bound)
    slices = SliceReconciler(
        api,
        controller.gangs,
        metrics=metrics,
        defaults=WorkerDefaults(
            image=args.worker_image,
            pull_policy=args.worker_image_pull_policy,
            resources=args.worker_resources,
            devices_per_host=args.devices_per_host,
        ),
        wake=lambda key: wakeups.wake(handlers.slice_key(*key.split("/", 1))),
        allow_system_priority_classes=args.allow_system_priority_classes,
        driver_pods=driver_pods is not None,
        host_policy=host_policy,
    )
    if driver_pods is not None:
        driver_pods.placer = slices.driver_node
    drivers = driver_pods or DriverSupervisor(args.state_dir, address)
    allowed_text = args.allowed_entrypoints
    if allowed_text is None:
        allowed_text = "" if driver_pods is not None else ",".join(DEFAULT_ALLOWED_ENTRYPOINTS)
    allowed = tuple(p.strip() for p in allowed_text.split(",") if p.strip())
    programs = ProgramReconciler(
        api, drivers, allowed_entrypoints=allowed, metrics=metrics,
        checkpoint_root=args.checkpoint_root or args.state_dir / "checkpoints",
        suspend_grace_s=args.suspend_grace_seconds,
    )

    registry = kopf.OperatorRegistry()
    handlers.register(registry, slices, programs, wakeups)
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    try:
        kopf.run(
            registry=registry,
            settings=settings,
            standalone=True,
            clusterwide=namespace is None,
            namespaces=[namespace] if namespace else [],
            liveness_endpoint=args.liveness,
        )
    finally:
        drivers.stop_all()
        server.stop(grace=1)
        controller.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
