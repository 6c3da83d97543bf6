"""``pathways status``: the slices and programs tables, once or (``-w``) whenever they change.

``-w`` follows both kinds with watch streams (:mod:`pathways.cli.watch_streams`) and
prints again when an event changes what is known (:mod:`pathways.cli.watch_state`):
no polling, and nothing is printed twice for the same versions.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from datetime import datetime
from typing import IO

from pathways.cli.connection import connect, utc_now
from pathways.cli.durations import human_duration
from pathways.cli.errors import EXIT_FAILED, EXIT_OK
from pathways.cli.render import dump_documents, status_text
from pathways.cli.watch_state import PROGRAMS, SLICES, Manifest, WatchedObjects, until_done
from pathways.cli.watch_streams import ObjectStreams
from pathways.kube_views import ProgramView, SliceView


def _print(
    raw_slices: Sequence[Manifest], raw_programs: Sequence[Manifest], args: argparse.Namespace,
    namespace: str | None, out: IO[str], *, again: bool,
) -> None:  # fmt: skip
    if args.output in ("yaml", "json"):
        items = [*raw_slices, *raw_programs]
        docs = items if args.watch else [{"apiVersion": "v1", "kind": "List", "items": items}]
        dump_documents(docs, args.output, out)
    else:
        if again:
            out.write(f"\n--- {datetime.now().strftime('%H:%M:%S')} ---\n")
        slices = [SliceView.from_object(o) for o in raw_slices]
        programs = [ProgramView.from_object(o) for o in raw_programs]
        wide = args.output == "wide"
        out.write(status_text(slices, programs, utc_now(), namespace=namespace, wide=wide) + "\n")
    out.flush()


def cmd_status(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    kube = connect(args)
    namespace = None if args.all_namespaces else kube.namespace
    if not args.watch:
        _print(kube.list_slices(namespace), kube.list_programs(namespace), args, namespace, out, again=False)
        return EXIT_OK
    deadline = time.monotonic() + args.timeout if args.timeout else None
    seen = WatchedObjects()
    printed = None
    with ObjectStreams(kube, namespace, retry_s=args.interval) as streams:
        while True:
            streams.catch_up(seen, deadline)
            raw_programs = seen.objects(PROGRAMS)
            if seen.complete and seen.snapshot() != printed:
                _print(seen.objects(SLICES), raw_programs, args, namespace, out, again=printed is not None)
                printed = seen.snapshot()
            outcome = until_done([ProgramView.from_object(o) for o in raw_programs])
            if args.until_done and seen.complete and outcome.done:
                if outcome.failed:
                    err.write(
                        f"error: programs failed: {', '.join(outcome.failed)} "
                        "(see `pathways describe program NAME`)\n"
                    )
                    return EXIT_FAILED
                return EXIT_OK
            if deadline is not None and time.monotonic() >= deadline:
                if args.until_done:
                    pending = outcome.pending or ("(no programs yet)",)
                    err.write(
                        f"error: timed out after {human_duration(args.timeout)} waiting for "
                        f"{', '.join(pending)} to finish\n"
                    )
                    return EXIT_FAILED
                return EXIT_OK
