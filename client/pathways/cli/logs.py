"""``pathways logs program|slice NAME``: the driver's log, then each worker's, line by line prefixed.

The driver's log is its pod's, ``<program>-driver`` (a finished program keeps it), or,
for a driver the operator ran as a child process, the end the operator kept in
ConfigMap ``<program>-driver-log``.

Worker logs come from the pod log API (which asks the node's kubelet, or the dev
cluster's node agent) or, with ``--log-dir``, straight from the files the node agent writes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import IO

from pathways.cli.connection import connect
from pathways.cli.errors import EXIT_OK, CliError
from pathways.cli.render import prefixed
from pathways.kube import Kube, KubeError, NotFoundError
from pathways.kube_views import ProgramView
from pathways_wire.kube_names import DRIVER_CONTAINER, SLICE_LABEL, WORKER_CONTAINER
from pathways_wire.driver_protocol import DRIVER_LOG_KEY, driver_log_config_map, driver_pod_name


def log_file(log_dir: Path, namespace: str, pod: str, container: str) -> Path:
    """Where a node writes a container's log: ``<dir>/<namespace>_<pod>/<container>.log``.

    That is the test cluster's node agent layout (``<state-dir>/pods/...``; the state
    directory itself is accepted too).
    """
    direct = log_dir / f"{namespace}_{pod}" / f"{container}.log"
    nested = log_dir / "pods" / f"{namespace}_{pod}" / f"{container}.log"
    return nested if not direct.exists() and nested.exists() else direct


def _driver_pod_log(kube: Kube, program: ProgramView, log_dir: Path | None, tail: int | None) -> str | None:
    """The log of the program's driver pod ``<program>-driver``: from ``log_dir``, else the kubelet;
    None when there is none to read (no pod, or no kubelet serving it)."""
    pod = driver_pod_name(program.name)
    if log_dir is not None:
        path = log_file(log_dir, program.namespace, pod, DRIVER_CONTAINER)
        return path.read_text(errors="replace") if path.exists() else None
    try:
        return kube.pod_log(program.namespace, pod, DRIVER_CONTAINER, tail)
    except KubeError:
        return None


def _driver_log(
    kube: Kube, program: ProgramView, log_dir: Path | None, tail: int | None, out: IO[str], err: IO[str]
) -> bool:
    """Prints the driver's log: its pod's, else what the operator kept; False when there is none (yet)."""
    text = _driver_pod_log(kube, program, log_dir, tail)
    name = driver_log_config_map(program.name)
    if not text:
        try:
            text = kube.config_map_data(program.namespace, name).get(DRIVER_LOG_KEY, "")
        except NotFoundError:
            text = ""
    if not text:
        if program.done:
            err.write(f"note: no driver log of program {program.name}: no pod {driver_pod_name(program.name)} "
                      f"log and no ConfigMap {name}\n")  # fmt: skip
        else:
            err.write(f"note: the driver of program {program.name} has not started (pod "
                      f"{driver_pod_name(program.name)})\n")  # fmt: skip
        return False
    for line in prefixed("[driver]", text, tail):
        out.write(line + "\n")
    return True


def cmd_logs(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    kube = connect(args)
    ns = kube.namespace
    driver_shown = False
    if args.kind == "program":
        program = ProgramView.from_object(kube.get_program(ns, args.name))
        virtual_slices = sorted(set(program.virtual_slices().values()))
        what = f"program {args.name} (slices {', '.join(virtual_slices) or 'none'})"
        driver_shown = _driver_log(kube, program, Path(args.log_dir) if args.log_dir else None, args.tail,
                                   out, err)
    else:
        kube.get_slice(ns, args.name)
        virtual_slices = [args.name]
        what = f"slice {args.name}"
    pods = [pod for vs in virtual_slices for pod in kube.pods(ns, f"{SLICE_LABEL}={vs}")]
    if not pods:
        if driver_shown:
            return EXIT_OK  # a finished program's slices are gone; its driver's log is what is left
        raise CliError(
            f"{what} has no worker pods in namespace {ns} yet: see `pathways describe {args.kind} {args.name}`"
        )
    log_dir = Path(args.log_dir) if args.log_dir else None
    for pod in pods:
        containers = list(pod.containers) if args.all_containers else [args.container or WORKER_CONTAINER]
        for container in containers:
            host = f"host-{pod.host_index}" if pod.host_index is not None else pod.name
            prefix = f"[{pod.slice}/{host}" + (f"/{container}]" if len(containers) > 1 else "]")
            if log_dir is not None:
                path = log_file(log_dir, ns, pod.name, container)
                if not path.exists():
                    err.write(f"warning: {path}: no log for container {container} of pod {pod.name}\n")
                    continue
                text = path.read_text(errors="replace")
            else:
                try:
                    text = kube.pod_log(ns, pod.name, container, args.tail)
                except KubeError as e:
                    raise CliError(
                        f"{e}\nThe API server reads logs from the node's kubelet. Where a node "
                        "cannot serve them, read the log files directly: "
                        "--log-dir DIR (DIR/<namespace>_<pod>/<container>.log)"
                    ) from None
            for line in prefixed(prefix, text, args.tail):
                out.write(line + "\n")
    return EXIT_OK
