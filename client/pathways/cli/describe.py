"""``pathways describe slice|program NAME``: one object, its neighbours and what happened to it."""

from __future__ import annotations

import argparse
from typing import IO

from pathways.cli.connection import connect, utc_now
from pathways.cli.errors import EXIT_OK
from pathways.cli.render import describe_program, describe_slice
from pathways.kube import Kube, NotFoundError
from pathways.kube_views import ProgramView, SliceView
from pathways_wire.kube_names import PROGRAM_KIND, SLICE_KIND, SLICE_LABEL
def _slice_views_of(kube: Kube, program: ProgramView) -> dict[str, SliceView | None]:
    found: dict[str, SliceView | None] = {}
    for name, vs in program.virtual_slices().items():
        try:
            found[name] = SliceView.from_object(kube.get_slice(program.namespace, vs))
        except NotFoundError:
            found[name] = None
    return found


def cmd_describe(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    kube = connect(args)
    ns, now = kube.namespace, utc_now()
    if args.kind == "slice":
        view = SliceView.from_object(kube.get_slice(ns, args.name))
        pods = kube.pods(ns, f"{SLICE_LABEL}={view.name}")
        users = [
            p for p in map(ProgramView.from_object, kube.list_programs(ns))
            if view.name in p.virtual_slices().values()
        ]  # fmt: skip
        out.write(describe_slice(view, pods, users, kube.events(ns, SLICE_KIND, view.name), now) + "\n")
    else:
        program = ProgramView.from_object(kube.get_program(ns, args.name))
        slices = _slice_views_of(kube, program)
        out.write(describe_program(program, slices, kube.events(ns, PROGRAM_KIND, program.name), now) + "\n")
    return EXIT_OK
