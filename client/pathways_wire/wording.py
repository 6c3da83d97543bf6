"""How messages count things: ``1 host``, ``2 hosts``, ``1/1 host``.

Shared by the CLI, the client library and the operator (its pure core too), so it
imports nothing.
"""

from __future__ import annotations


def plural(count: int, noun: str, many: str = "") -> str:
    """``count`` and ``noun``, in the plural unless ``count`` is 1 (``many`` for irregular plurals)."""
    return f"{count} {noun_for(count, noun, many)}"


def noun_for(count: int, noun: str, many: str = "") -> str:
    """``noun`` as it follows ``count``: ``host`` for 1, ``hosts`` otherwise."""
    return noun if count == 1 else many or f"{noun}s"


def fraction(done: int, total: int, noun: str, many: str = "") -> str:
    """``3/4 hosts``, ``1/1 host``: the noun agrees with the total."""
    return f"{done}/{total} {noun_for(total, noun, many)}"
