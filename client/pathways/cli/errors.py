"""Exit statuses the ``pathways`` command promises scripts, and the error that carries one."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A command cannot go on: its message (what to do next) goes to stderr, and the
    command exits with ``code``."""

    code: int = EXIT_FAILED
