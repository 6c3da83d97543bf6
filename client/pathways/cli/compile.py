"""``pathways compile prog.py``: the ConfigMap and PathwaysProgram manifest, written without a cluster."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import IO

from pathways.cli.errors import EXIT_OK, CliError
from pathways.cli.program_file import compile_program_file
from pathways.cli.render import to_yaml


def cmd_compile(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    config_map, program, summary = compile_program_file(Path(args.file), args.name, args.namespace, args.steps)
    text = to_yaml([config_map, program])
    if args.output == "-":
        out.write(text)
    else:
        try:
            Path(args.output).write_text(text)
        except OSError as e:
            raise CliError(f"-o {args.output}: cannot write the manifest there ({e.strerror}); "
                           "give a file path in a directory that exists and can be written") from None
        err.write(
            f"{summary}\nwrote {args.output}: ConfigMap {config_map['metadata']['name']} and "
            f"PathwaysProgram {program['metadata']['name']}; apply with `kubectl apply --server-side -f {args.output}`\n"
            "(server-side: a client-side apply copies the ConfigMap into an annotation limited to 256 KiB)\n"
        )
    return EXIT_OK
