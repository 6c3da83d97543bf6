"""``pathways run prog.py``: the program on the embedded local runtime, no cluster."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import IO, Any

from pathways.cli.errors import EXIT_OK, CliError
from pathways.cli.program_file import load_program_file, users_code
from pathways_wire.errors import PathwaysError
from pathways_wire.wording import plural


def cmd_run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    import jax
    import numpy as np

    import pathways as pw

    loaded = load_program_file(Path(args.file))
    err.write(f"running '{loaded.function.name}' on the embedded local runtime ({plural(args.steps, 'step')})\n")
    try:
        outputs: Any = None
        step_args = loaded.args
        for step in range(args.steps):
            started = time.monotonic()
            if outputs is not None:
                step_args = loaded.next_args(step_args, outputs)
            with users_code(loaded.path, "calling `program`"):
                outputs = loaded.function(*step_args)
            jax.block_until_ready(outputs)
            err.write(f"step {step + 1}/{args.steps} done in {time.monotonic() - started:.2f} s\n")
        values = pw.fetch(outputs)  # while the hosts that hold them still run
    except PathwaysError as e:
        raise CliError(f"{args.file}: {e}") from None
    finally:
        pw.shutdown()
    if args.output == "json":
        out.write(json.dumps(jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), values)) + "\n")
    else:
        out.write(repr(jax.tree_util.tree_map(np.asarray, values)) + "\n")
    return EXIT_OK
