"""``pathways submit prog.py``: compile, create in the cluster, and with ``--wait`` follow it to its results.

``--wait`` follows the one program with a watch stream, as ``status -w`` does.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import IO

from pathways.cli.connection import connect
from pathways.cli.durations import human_duration
from pathways.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from pathways.cli.program_file import compile_program_file
from pathways.cli.render import results_text
from pathways.cli.watch_state import PROGRAMS, WatchedObjects
from pathways.cli.watch_streams import ObjectStreams
from pathways.kube import Kube, NotFoundError
from pathways.kube_views import ProgramView
from pathways_wire.wording import fraction


def cmd_submit(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    kube = connect(args)
    ns = kube.namespace
    config_map, program, summary = compile_program_file(Path(args.file), args.name, ns, args.steps)
    name = program["metadata"]["name"]
    err.write(summary + "\n")
    try:
        kube.get_program(ns, name)
    except NotFoundError:
        pass
    else:
        raise CliError(
            f"PathwaysProgram {name} already exists in namespace {ns}: delete it "
            f"(`kubectl delete pwprog {name} -n {ns}`) or pass --name"
        )
    kube.create(config_map, ns)
    created = kube.create(program, ns)
    kube.adopt_config_map(ns, config_map["metadata"]["name"], created)
    out.write(f"pathwaysprogram.pathways.dev/{name} created (ConfigMap {config_map['metadata']['name']})\n")
    if not args.wait:
        err.write(f"watch it with `pathways status -w -n {ns}` or `pathways describe program {name} -n {ns}`\n")
        return EXIT_OK
    view = _wait_program(kube, ns, name, args.timeout, err)
    if view is None:
        return EXIT_FAILED
    if view.phase != "Succeeded":
        err.write(f"see `pathways logs program {name} -n {ns}` for the driver's output\n")
        return EXIT_FAILED
    if not view.results_config_map:
        raise CliError(f"{name} Succeeded but its status names no results ConfigMap")
    data = kube.config_map_data(ns, view.results_config_map)
    out.write(results_text(data, args.output) + "\n")
    return EXIT_OK


def _wait_program(
    kube: Kube, ns: str, name: str, timeout: float, err: IO[str], retry_s: float = 1.0
) -> ProgramView | None:
    """Follows the program (a watch stream) until it ends (its view), or None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout if timeout else None
    seen = WatchedObjects(kinds=(PROGRAMS,))
    shown = ""
    with ObjectStreams(kube, ns, retry_s=retry_s, kinds=(PROGRAMS,), name=name) as streams:
        while True:
            streams.catch_up(seen, deadline)
            found = seen.objects(PROGRAMS)
            view = ProgramView.from_object(found[0]) if found else None
            if seen.complete and view is None:
                raise CliError(f"PathwaysProgram {name} in namespace {ns} was deleted before it ended")
            if view is not None:
                line = f"{view.phase or 'Pending'} {fraction(view.steps_completed, view.steps, 'step')}"
                if view.message:
                    line += f": {view.message}"
                if line != shown:
                    err.write(f"{name}: {line}\n")
                    err.flush()
                    shown = line
                if view.done:
                    return view
            if deadline is not None and time.monotonic() >= deadline:
                phase = (view.phase if view is not None else "") or "Pending"
                err.write(
                    f"error: {name} is still {phase} after {human_duration(timeout)}: "
                    f"see `pathways describe program {name} -n {ns}`\n"
                )
                return None
