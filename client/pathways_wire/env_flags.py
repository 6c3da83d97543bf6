"""Command-line flags whose defaults come from environment variables.

A pod configures its containers through the environment, a person through flags: the
flag wins, else the variable, else the built-in default. One rule for every process
(the host processes, the operator): a variable's text is parsed exactly as the flag's
would be, only when the flag is not given, and a value that does not parse stops the
process with a usage error naming both the variable and the flag, e.g.::

    argument --host-index: PATHWAYS_HOST_INDEX='two' is not valid (invalid int value):
    fix PATHWAYS_HOST_INDEX or pass --host-index

Plain Python (argparse only): the environment is passed in, so hosts can use this
before JAX loads and tests need no process environment.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

N = TypeVar("N", int, float)


class _FromEnvironment(str):
    """A flag's default text read from environment variable ``variable``."""

    variable: str


def _from_environment(text: str, variable: str) -> _FromEnvironment:
    tagged = _FromEnvironment(text)
    tagged.variable = variable
    return tagged


def _invalid(raw: _FromEnvironment, flag: str, why: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(
        f"{raw.variable}={str(raw)!r} is not valid ({why}): fix {raw.variable} or pass {flag}"
    )


def env_option(
    parser: argparse.ArgumentParser,
    *flags: str,
    variable: str,
    env: Mapping[str, str],
    default: Any,
    type: Callable[[str], Any] = str,
    choices: Collection[str] | None = None,
    help: str | None = None,
) -> argparse.Action:
    """Adds ``flags`` to ``parser`` with ``env[variable]`` as the default.

    An unset or blank variable leaves ``default`` (not parsed, as argparse leaves a
    non-string default). ``choices`` are checked for the variable's text too, which
    argparse does not do for defaults.
    """
    flag = flags[-1]
    name = getattr(type, "__name__", "value")

    def parse(raw: str) -> Any:
        if not isinstance(raw, _FromEnvironment):
            return type(raw)
        try:
            value = type(raw)
        except argparse.ArgumentTypeError as err:
            raise _invalid(raw, flag, str(err)) from None
        except (TypeError, ValueError):
            raise _invalid(raw, flag, f"invalid {name} value") from None
        if choices is not None and value not in choices:
            raise _invalid(raw, flag, f"choose from {', '.join(map(repr, choices))}")
        return value

    parse.__name__ = name  # argparse names the type in its own errors: "invalid int value"
    text = env.get(variable, "")
    start = _from_environment(text, variable) if text.strip() else default
    return parser.add_argument(*flags, type=parse, default=start, choices=choices, help=help)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def switch_on(env: Mapping[str, str], variable: str) -> bool:
    """Whether the on/off switch `variable` is on in `env` (default: on, any case, spaces
    ignored); ValueError naming the variable and its value for anything else."""
    value = env.get(variable, "on").strip().lower()
    if value not in ("on", "off"):
        raise ValueError(f"{variable}={env[variable]!r} is neither on nor off; set it to on (the default) or off")
    return value == "on"


def env_number(env: Mapping[str, str], variable: str, default: N, *, minimum: N | None = None,
               positive: bool = False) -> N:
    """`env[variable]` as a number of `default`'s type (`default` when unset or blank), at
    least `minimum`, or above 0 with `positive`; ValueError naming the variable, its value
    and what it may be for anything else (a library's knobs, read as it is imported)."""
    text = env.get(variable, "")
    if not text.strip():
        return default
    kind = type(default)
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(
            f"{variable}={text!r} is not {'a whole number' if kind is int else 'a number'}; "
            f"set it to one, or unset it for the default {default}"
        ) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{variable}={text!r} is not a finite number; unset it for the default {default}")
    if positive and not value > 0:
        raise ValueError(f"{variable}={text!r} must be above 0; unset it for the default {default}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{variable}={text!r} must be at least {minimum}; unset it for the default {default}")
    return value
