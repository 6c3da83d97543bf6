"""The ``pathways`` command line: every command's flags, and the checks argparse cannot express.

Building the parser imports no command, no Kubernetes client and no JAX, so ``--help``
and usage errors are quick; :mod:`pathways.cli` runs the command ``args.command`` names.
"""

from __future__ import annotations

import argparse

from pathways.cli.connection import add_cluster_options
from pathways.cli.durations import parse_duration
from pathways_wire.env_flags import positive_int
from pathways.cli.program_file import PROGRAM_FILE_HELP
from pathways_wire.kube_names import SIDECAR_CONTAINER, WORKER_CONTAINER
KIND_NAMES = {
    "slice": ("slice", "slices", "virtualslice", "virtualslices", "vslice", "vs"),
    "program": ("program", "programs", "pathwaysprogram", "pathwaysprograms", "pwprog", "pwp"),
}
"""What each kind may be called: its own word, and kubectl's names for its resource (the
CRDs' plural, singular and short names), with or without the group (``vslice.pathways.dev``)."""


KIND_HELP = "or as kubectl names it: vslice, vs, virtualslice(s); pwprog, pwp, pathwaysprogram(s)"


def object_kind(text: str) -> str:
    """A kind argument as ``slice`` or ``program``, whichever name of it is given."""
    word = text.lower().removesuffix(".pathways.dev")
    for kind, names in KIND_NAMES.items():
        if word in names:
            return kind
    raise argparse.ArgumentTypeError(
        f"{text!r} names no kind: use slice (or {', '.join(KIND_NAMES['slice'][1:])}) "
        f"or program (or {', '.join(KIND_NAMES['program'][1:])})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pathways",
        description="Watch and drive Kube-Pathways: VirtualSlices and PathwaysPrograms.",
        epilog="Exit status: 0 ok, 1 not found/failed/timed out, 2 usage error.",
    )
    add_cluster_options(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    status = commands.add_parser("status", help="table of slices and programs")
    add_cluster_options(status, suppress=True)
    status.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    status.add_argument("-o", "--output", choices=("table", "wide", "yaml", "json"), default="table")
    status.add_argument("-w", "--watch", action="store_true", help="print again whenever something changes")
    status.add_argument(
        "--timeout", type=parse_duration, default=0.0, help="stop watching after this long (e.g. 10m; default: never)"
    )
    status.add_argument(
        "--until-done", action="store_true",
        help="with -w: stop when every program has Succeeded or Failed (exit 1 if any Failed)",
    )  # fmt: skip
    # how long -w waits before watching again after a dropped connection
    status.add_argument("--interval", type=parse_duration, default=1.0, help=argparse.SUPPRESS)

    describe = commands.add_parser("describe", help="conditions, hosts, events and why a slice waits")
    add_cluster_options(describe, suppress=True)
    describe.add_argument("kind", type=object_kind, metavar="{slice,program}", help=KIND_HELP)
    describe.add_argument("name")

    logs = commands.add_parser(
        "logs", help="a program's driver log and its workers' logs, each line prefixed by where it came from"
    )
    add_cluster_options(logs, suppress=True)
    logs.add_argument("kind", type=object_kind, metavar="{program,slice}", help=KIND_HELP)
    logs.add_argument("name")
    which = logs.add_mutually_exclusive_group()
    which.add_argument(
        "-c", "--container", default=None, choices=(WORKER_CONTAINER, SIDECAR_CONTAINER),
        help=f"container of each worker pod (default {WORKER_CONTAINER})",
    )  # fmt: skip
    which.add_argument("--all-containers", action="store_true", help="worker and dataflow sidecar")
    logs.add_argument("--tail", type=int, default=None, help="only the last N lines of each container")
    logs.add_argument(
        "--log-dir", default=None,
        help="read DIR/<namespace>_<pod>/<container>.log instead of the pod log API "
        "(for nodes without a kubelet, such as the test cluster's node agent)",
    )  # fmt: skip

    compile_ = commands.add_parser("compile", help="trace prog.py into a ConfigMap + PathwaysProgram manifest")
    compile_.add_argument("file", help=f"a Python file that must {PROGRAM_FILE_HELP}")
    compile_.add_argument("-o", "--output", default="-", help="manifest file (default: stdout)")
    compile_.add_argument("--name", default=None, help="PathwaysProgram name (default: the program's)")
    compile_.add_argument("-n", "--namespace", default=argparse.SUPPRESS, help="namespace to write into the manifest")
    compile_.add_argument("--steps", type=positive_int, default=1, help="spec.steps (default 1)")

    submit = commands.add_parser("submit", help="compile prog.py and create it in the cluster")
    add_cluster_options(submit, suppress=True)
    submit.add_argument("file", help=f"a Python file that must {PROGRAM_FILE_HELP}")
    submit.add_argument("--name", default=None, help="PathwaysProgram name (default: the program's)")
    submit.add_argument("--steps", type=positive_int, default=1, help="spec.steps (default 1)")
    submit.add_argument(
        "--wait", action="store_true",
        help="wait for Succeeded (print the results, exit 0) or Failed (exit 1)",
    )  # fmt: skip
    submit.add_argument("-o", "--output", choices=("text", "json"), default="text", help="with --wait: results as")
    submit.add_argument("--timeout", type=parse_duration, default=0.0, help="with --wait: give up after this long")

    run = commands.add_parser("run", help="run prog.py on the embedded local runtime (no cluster)")
    run.add_argument("file", help=f"a Python file that must {PROGRAM_FILE_HELP}")
    run.add_argument("--steps", type=positive_int, default=1, help="calls of the program (default 1)")
    run.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return parser


def usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with flags argparse accepted one by one but not together; None when nothing."""
    if args.command == "status" and args.until_done and not args.watch:
        return "--until-done needs -w (watch)"
    return None
