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
        last_done = time.monotonic()
        for step in range(args.steps):
            previous = outputs
            if previous is not None:
                step_args = loaded.next_args(step_args, previous)
            with users_code(loaded.path, "calling `program`"):
                outputs = loaded.function(*step_args)
            if previous is not None:  # step `step` is on its way: now wait for the one before
                last_done = _step_done(previous, step, args.steps, last_done, err)
        _step_done(outputs, args.steps, args.steps, last_done, err)
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


def _step_done(outputs: Any, number: int, steps: int, since: float, err: IO[str]) -> float:
    """Waits for step `number`'s outputs and says so, with the time since the step before
    it ended: each step is called before the one before it is waited for, so the hosts
    never wait for the client between two steps."""
    import jax

    jax.block_until_ready(outputs)
    now = time.monotonic()
    err.write(f"step {number}/{steps} done in {now - since:.2f} s\n")
    return now
