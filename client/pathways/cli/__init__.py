"""``pathways``: watch and drive Kube-Pathways from a terminal, with kubectl's habits.

Cluster commands read what the operator wrote into the objects' ``status`` (through
:mod:`pathways.kube`), so they need only API access, never the operator itself::

    pathways status [-A] [-o table|wide|yaml|json] [-w [--until-done] [--timeout 10m]]
    pathways describe slice|program NAME
    pathways logs program|slice NAME [-c CONTAINER | --all-containers] [--tail N] [--log-dir DIR]

``logs program`` starts with the driver's log (``[driver]``), which the operator keeps in
ConfigMap ``<program>-driver-log`` when the program ends, so it is there after the
program's own slices are gone.

Program commands load a Python file that defines ``program`` (a ``@pw.program``) and
``example_args()`` (the arguments to trace and run it with, a tuple)::

    pathways compile prog.py -o manifest.yaml    # ConfigMap (IR + jax.export artifacts) + PathwaysProgram
    pathways submit prog.py [--wait [-o json]]   # the same, created in the cluster; --wait prints the results
    pathways run prog.py                         # on the embedded local runtime, no cluster

Every cluster command takes ``--kubeconfig``, ``--context``, ``-n/--namespace`` (before
or after the command, as with kubectl). Exit status: 0 ok; 1 not found, failed or timed
out; 2 usage (bad flags or arguments); 130 interrupted. Errors go to stderr and say
what to do next; tables and documents go to stdout.

The package: :mod:`~pathways.cli.parser` (the flags), :mod:`~pathways.cli.connection`
(which cluster), :mod:`~pathways.cli.render` (tables, ``describe`` pages, documents),
:mod:`~pathways.cli.program_file` (``prog.py`` files), and one module per command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from pathways.cli import compile, describe, logs, run, status, submit
from pathways.cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CliError
from pathways.cli.parser import build_parser, usage_problem
from pathways.cli.program_file import compile_program_file
from pathways.kube import KubeError

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "CliError", "compile_program_file", "main"]

Command = Callable[[argparse.Namespace, IO[str], IO[str]], int]

COMMANDS: Mapping[str, Command] = {
    "status": status.cmd_status,
    "describe": describe.cmd_describe,
    "logs": logs.cmd_logs,
    "compile": compile.cmd_compile,
    "submit": submit.cmd_submit,
    "run": run.cmd_run,
}


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help (0) or a usage error (2, message already printed)
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    problem = usage_problem(args)
    if problem is not None:
        err.write(f"error: {problem}\n")
        return EXIT_USAGE
    try:
        return COMMANDS[args.command](args, out, err)
    except CliError as e:
        err.write(f"error: {e}\n")
        return e.code
    except KubeError as e:
        err.write(f"error: {e}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
