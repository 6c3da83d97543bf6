"""The embedded cluster's islands and devices per host, checked before any process starts.

The client (``pw.connect(islands=..., devices_per_host=...)`` and the environment) and the
local controller (its ``--islands`` flag) read the same text the same way: a bad name, size,
duplicate or devices-per-host value is a ValueError naming it and saying what to give.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

DEFAULT_ISLANDS = {"island-a": 16, "island-b": 16}
DEFAULT_DEVICES_PER_HOST = 4
ENV_ISLANDS = "PATHWAYS_LOCAL_ISLANDS"
ENV_DEVICES_PER_HOST = "PATHWAYS_DEVICES_PER_HOST"

_ISLAND_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_NAME_RULE = (
    "use 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or "
    "digit (it becomes a Kubernetes label value), e.g. 'island-a'"
)
_ENTRY_RULE = "each entry is NAME:DEVICES, e.g. island-a:16,island-b:16"


def parse_devices_per_host(value: object, source: str) -> int:
    """Devices per host from an argument or environment text; at least 1."""
    number = int(value.strip()) if isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(
            f"{source}={value!r}: devices per host must be a whole number of at least 1, "
            f"e.g. {DEFAULT_DEVICES_PER_HOST}"
        )
    return number


def parse_islands(text: str, source: str) -> dict[str, int]:
    """``NAME:DEVICES,NAME:DEVICES`` as a mapping, each name once (not yet checked against a host size)."""
    islands: dict[str, int] = {}
    entries = text.split(",")
    for position, item in enumerate(entries, 1):
        name, sep, count = (part.strip() for part in item.partition(":"))
        if not item.strip():
            raise ValueError(f"{source}={text!r}: entry {position} is empty; {_ENTRY_RULE}")
        if not sep:
            raise ValueError(f"{source}={text!r}: entry {item.strip()!r} has no ':DEVICES'; {_ENTRY_RULE}")
        _check_name(name, source)
        if name in islands:
            raise ValueError(
                f"{source}={text!r}: island {name!r} is given twice ({islands[name]} and "
                f"{count} devices): give each island once"
            )
        if not count.lstrip("-").isdigit():
            raise ValueError(
                f"{source}={text!r}: island {name!r} has {count!r} devices: give a whole "
                "number of at least 1"
            )
        islands[name] = int(count)
    return islands


def _check_name(name: object, source: str) -> None:
    if not isinstance(name, str) or not _ISLAND_NAME.fullmatch(name):
        raise ValueError(f"{source}: island name {name!r} is not allowed: {_NAME_RULE}")


def check_islands(islands: Mapping[str, object], per_host: int, source: str) -> dict[str, int]:
    """The islands, each a whole number of hosts of ``per_host`` devices, or a ValueError naming the entry."""
    if not islands:
        raise ValueError(
            f"{source} names no island: give at least one NAME: DEVICES entry, e.g. "
            "{'island-a': 16}, or leave it out for the defaults (island-a and island-b, "
            "16 devices each)"
        )
    checked: dict[str, int] = {}
    for name, count in islands.items():
        _check_name(name, source)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(
                f"{source}: island {name!r} has {count!r} devices: give a whole number of "
                f"at least 1, a multiple of {per_host} devices per host"
            )
        if count % per_host:
            raise ValueError(
                f"{source}: island {name!r} has {count} devices, not a multiple of {per_host} "
                f"devices per host: give a multiple of {per_host}, or a devices per host "
                f"that divides {count}"
            )
        checked[name] = count
    return checked


def local_config(
    islands: Mapping[str, object] | None,
    devices_per_host: object | None,
    env: Mapping[str, str],
) -> tuple[dict[str, int], int]:
    """The embedded cluster's islands and devices per host: arguments, else the environment, else defaults."""
    if devices_per_host is not None:
        per_host = parse_devices_per_host(devices_per_host, "pw.connect(devices_per_host=...)")
    elif env.get(ENV_DEVICES_PER_HOST, "").strip():
        per_host = parse_devices_per_host(env[ENV_DEVICES_PER_HOST], ENV_DEVICES_PER_HOST)
    else:
        per_host = DEFAULT_DEVICES_PER_HOST
    if islands is not None:
        if not isinstance(islands, Mapping):
            raise ValueError(
                f"pw.connect(islands={islands!r}): give a mapping of island name to devices, "
                "e.g. {'island-a': 16}"
            )
        return check_islands(islands, per_host, f"pw.connect(islands={dict(islands)!r})"), per_host
    text = env.get(ENV_ISLANDS, "")
    if not text.strip():
        return dict(DEFAULT_ISLANDS), per_host
    parsed = parse_islands(text, ENV_ISLANDS)
    return check_islands(parsed, per_host, f"{ENV_ISLANDS}={text!r}"), per_host


def islands_arg(islands: Mapping[str, int]) -> str:
    return ",".join(f"{name}:{count}" for name, count in islands.items())
