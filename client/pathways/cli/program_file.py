"""Programs from files: a ``prog.py`` that defines ``program`` and ``example_args()``, and
optionally ``feeds``: ``{returned position: argument position}``, the returned values that
become the next step's arguments (a training step's new parameters), so a program run
for several steps trains instead of repeating its first step.

``compile``, ``submit`` and ``run`` all start here: the file is imported with its
directory first on ``sys.path`` (so its siblings import), checked against the
convention, and for the cluster commands traced into a ConfigMap and a PathwaysProgram.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pathways.cli.errors import CliError
from pathways_wire.errors import PathwaysError
from pathways_wire.wording import plural


@dataclass(frozen=True)
class ProgramFile:
    """A ``prog.py``: its ``program`` and the arguments ``example_args()`` returns."""

    path: Path
    function: Any
    args: tuple[Any, ...]
    feeds: dict[int, int]

    def next_args(self, args: tuple[Any, ...], returned: Any) -> tuple[Any, ...]:
        """The arguments of the step after one that took ``args`` and returned ``returned``."""
        values = returned if isinstance(returned, (tuple, list)) else (returned,)
        following = list(args)
        for out_pos, arg_pos in self.feeds.items():
            following[arg_pos] = values[out_pos]
        return tuple(following)


PROGRAM_FILE_HELP = (
    "define a module-level `program` (a function decorated with @pw.program) and "
    "`example_args()` returning its arguments as a tuple"
)
FEEDS_HELP = (
    "`feeds` maps a returned value's position to the argument position it becomes at the next "
    "step, e.g. feeds = {0: 0}"
)


def load_program_file(path: Path) -> ProgramFile:
    """Imports ``path`` (its directory first on sys.path, so its siblings import) and checks it."""
    from pathways.tracing import ProgramFunction

    if not path.is_file():
        raise CliError(f"{path}: no such file")
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(f"pathways_program_file_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise CliError(f"{path}: not a Python file Python can import")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        with users_code(path, "importing it"):
            spec.loader.exec_module(module)
    except PathwaysError as err:
        raise CliError(f"{path}: {err}") from None
    function = getattr(module, "program", None)
    if not isinstance(function, ProgramFunction):
        found = f"`program` is a {type(function).__name__}" if function is not None else "it has no `program`"
        raise CliError(f"{path}: {found}; {PROGRAM_FILE_HELP}")
    example_args = getattr(module, "example_args", None)
    if not callable(example_args):
        raise CliError(f"{path}: it has no `example_args()`; {PROGRAM_FILE_HELP}")
    try:
        with users_code(path, "example_args()"):
            args = example_args()
    except PathwaysError as err:
        raise CliError(f"{path}: example_args(): {err}") from None
    args = args if isinstance(args, tuple) else (args,)
    feeds = getattr(module, "feeds", None) or {}
    pairs_ok = isinstance(feeds, dict) and all(
        isinstance(k, int) and isinstance(v, int) and not isinstance(k, bool) and not isinstance(v, bool)
        for k, v in feeds.items()
    )
    if not pairs_ok:
        raise CliError(f"{path}: `feeds` is {feeds!r}; {FEEDS_HELP}")
    return ProgramFile(path, function, args, feeds)


@contextmanager
def users_code(path: Path, doing: str) -> Iterator[None]:
    """Runs the user's own code (`doing`, as the error says it): an exception it raises, but
    a `PathwaysError`, which stays itself, becomes `user_code_failed`'s error."""
    try:
        yield
    except PathwaysError:
        raise
    except Exception as err:
        raise user_code_failed(path, doing, err) from None


def user_code_failed(path: Path, doing: str, err: Exception) -> CliError:
    """The error for an exception the user's own code raised: its traceback from the
    first frame outside this package and Python's import machinery (the user's code, and
    what it called), not the command's frames before it; a syntax error as Python shows it.
    An exception with no frame of the user's keeps its whole traceback."""
    tb = err.__traceback__
    while tb is not None and _not_users(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if tb is None and not isinstance(err, SyntaxError):
        tb = err.__traceback__
    shown = "".join(traceback.format_exception(type(err), err, tb)).rstrip()
    return CliError(f"{path}: {doing} raised {type(err).__name__}:\n{shown}")


_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)


def _not_users(filename: str) -> bool:
    return filename.startswith("<frozen ") or str(Path(filename).resolve()).startswith(_PACKAGE_DIR)


def compile_program_file(
    path: Path, name: str | None, namespace: str | None, steps: int
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The ConfigMap and PathwaysProgram for ``path``, and a one-line summary."""
    from pathways_wire.compiled_program import resource_name

    loaded = load_program_file(path)
    try:
        with users_code(path, "tracing `program`"):
            compiled = loaded.function.compiled(loaded.args, loaded.feeds)
        program_name = resource_name(name or compiled.program.name)
        cm_name = resource_name(program_name, "-compiled")
        config_map = compiled.to_config_map(cm_name, namespace)
    except PathwaysError as err:
        raise CliError(f"{path}: {err}") from None
    program = compiled.to_program(program_name, cm_name, namespace, steps)
    size = sum(len(v) * 3 // 4 for v in config_map["binaryData"].values())
    p = compiled.program
    summary = (
        f"program '{p.name}': {plural(len(p.computations), 'computation')} on "
        f"{plural(len(p.slices), 'slice')}, {plural(len(p.inputs), 'input')}, {size / 1024:.1f} KiB compiled"
        + (f", {plural(len(compiled.feeds), 'input')} fed from the step before" if compiled.feeds else "")
    )
    return config_map, program, summary
