"""Sending several messages' worth of commands as one message: a link that can be
corked holds what it is given until it is uncorked as many times, then writes it all
in order as one frame (as TCP_CORK holds a socket's segments).

`Together` corks some links for the length of a ``with`` block. It is a plain class,
not a generator's context: a call passes through one on its way to its hosts, where a
generator-based context cost several microseconds."""

from __future__ import annotations

from typing import Protocol


class Corkable(Protocol):
    def cork(self) -> None: ...

    def uncork(self) -> None: ...


class Together:
    """Corks each of `links` on entering the block, uncorks them on leaving it."""

    __slots__ = ("_links",)

    def __init__(self, links: tuple[Corkable, ...]) -> None:
        self._links = links

    def __enter__(self) -> None:
        for link in self._links:
            link.cork()

    def __exit__(self, *exc: object) -> None:
        for link in self._links:
            link.uncork()
