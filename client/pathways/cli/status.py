"""``pathways status``: the slices and programs tables, once or (``-w``) whenever they change."""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from typing import IO

from pathways.cli.connection import connect, utc_now
from pathways.cli.durations import human_duration
from pathways.cli.errors import EXIT_FAILED, EXIT_OK
from pathways.cli.render import dump_documents, status_text
from pathways.kube import ProgramView, SliceView


def cmd_status(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    kube = connect(args)
    namespace = None if args.all_namespaces else kube.namespace
    deadline = time.monotonic() + args.timeout if args.timeout else None
    last: tuple[tuple[str, str], ...] | None = None
    while True:
        raw_slices, raw_programs = kube.list_slices(namespace), kube.list_programs(namespace)
        snapshot = tuple(
            (str(o["metadata"].get("uid")), str(o["metadata"].get("resourceVersion")))
            for o in (*raw_slices, *raw_programs)
        )
        programs = [ProgramView.from_object(o) for o in raw_programs]
        if snapshot != last:
            if args.output in ("yaml", "json"):
                if args.watch:
                    dump_documents([*raw_slices, *raw_programs], args.output, out)
                else:
                    items = [*raw_slices, *raw_programs]
                    dump_documents([{"apiVersion": "v1", "kind": "List", "items": items}], args.output, out)
            else:
                if last is not None:
                    out.write(f"\n--- {datetime.now().strftime('%H:%M:%S')} ---\n")
                slices = [SliceView.from_object(o) for o in raw_slices]
                wide = args.output == "wide"
                out.write(status_text(slices, programs, utc_now(), namespace=namespace, wide=wide) + "\n")
            out.flush()
            last = snapshot
        if not args.watch:
            return EXIT_OK
        if args.until_done and programs and all(p.done for p in programs):
            failed = [p.name for p in programs if p.phase == "Failed"]
            if failed:
                err.write(f"error: programs failed: {', '.join(failed)} (see `pathways describe program NAME`)\n")
                return EXIT_FAILED
            return EXIT_OK
        if deadline is not None and time.monotonic() >= deadline:
            if args.until_done:
                pending = [p.name for p in programs if not p.done] or ["(no programs yet)"]
                err.write(
                    f"error: timed out after {human_duration(args.timeout)} waiting for "
                    f"{', '.join(pending)} to finish\n"
                )
                return EXIT_FAILED
            return EXIT_OK
        pause = args.interval if deadline is None else min(args.interval, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)
