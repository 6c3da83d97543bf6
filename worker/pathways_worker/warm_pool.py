"""Which shared-memory files to keep warm, so writing a value skips fresh pages.

Writing into a new tmpfs file costs a page fault and a zeroed page per 4 KiB,
which on these machines halves the speed of the copy. A file whose pages were
allocated beforehand (off the transfer's path) takes the bytes at memcpy speed.
A process that moves values keeps a few such files, of the sizes it moved
lately, and hands one out instead of a fresh file.

A file that is done with is warm too: one whose bytes the sidecar sent on, or
one the worker read a value from once that value is dropped. It is left as a
*spare* instead of freeing its pages, and the next writer of that size renames
it to its own, so a stream of moves of one size makes no fresh pages at all.

This is the pool's plan, pure: it is told what was asked for and what was
made, and says which sizes to make next, which files are no longer wanted,
and whether a sent file is kept as a spare. `shared_memory.WarmFiles` carries
it out on a thread of its own.
"""

from __future__ import annotations

from collections import Counter, deque

MIN_WARM_BYTES = 64 << 10
"""Smaller files are cheap to make fresh; they are never kept warm. A fresh file's pages
cost a fault and a zeroing each, about 2 µs a 4 KiB page on these machines: a 160 KiB
value's file took about 80 µs of system time to make, where a spare takes a rename. A
client puts each input above `pathways.runtime.INLINE_BYTES` (64 KiB) through a file;
values up to `transfer.INLINE_MOVE_BYTES` (32 KiB) between hosts take none."""
SPARES_PER_SIZE = 32
"""Spares of one size kept at most (all sizes together stay within the byte limit). A
client's calls in flight, up to 32, each hold its inputs' files, and they come free a
batch at a time, as the worker reports its grants in batches of up to 32: a training loop
that puts a batch per step frees a dozen of them at once, and the next dozen steps' puts
need as many. With 2 kept, the rest were removed and their successors made fresh, and
the sidecar spent about a fifth of its CPU making files (bench experiment 8's (a))."""


def keep_spare(nbytes: int, spares_of_size: int, spare_bytes: int, limit_bytes: int) -> bool:
    """Whether a file of `nbytes` that is done with (sent on, or read by a value
    now dropped) stays as a spare, given how many spares of its size there are
    and how many bytes all spares hold."""
    return (
        nbytes >= MIN_WARM_BYTES
        and spares_of_size < SPARES_PER_SIZE
        and spare_bytes + nbytes <= limit_bytes
    )


class WarmPlan:
    def __init__(self, limit_bytes: int, depth: int = 2, sizes: int = 4) -> None:
        """At most `limit_bytes` warm (made or being made), `depth` files of each
        of the `sizes` sizes asked for most recently."""
        self.limit = limit_bytes
        self.depth = depth
        self._recent: deque[int] = deque(maxlen=sizes)
        self._warm: Counter[int] = Counter()
        self._making: Counter[int] = Counter()

    @property
    def held(self) -> int:
        """Bytes in warm files and in files being made."""
        return sum(n * c for n, c in (self._warm + self._making).items())

    def take(self, nbytes: int, spare: bool = False) -> bool:
        """A file of `nbytes` is wanted now; True if a warm one is handed out
        (`spare`: the writer found a spare, so no warm file is spent)."""
        if nbytes < MIN_WARM_BYTES or nbytes > self.limit:
            return False
        if nbytes in self._recent:
            self._recent.remove(nbytes)
        self._recent.appendleft(nbytes)
        if not spare and self._warm[nbytes] > 0:
            self._warm[nbytes] -= 1
            return True
        return False

    def next_to_make(self) -> int | None:
        """The size of the next file to warm (counted as being made), or None."""
        for nbytes in self._recent:
            if self._warm[nbytes] + self._making[nbytes] < self.depth and self.held + nbytes <= self.limit:
                self._making[nbytes] += 1
                return nbytes
        return None

    def made(self, nbytes: int, ok: bool = True) -> None:
        """A file begun by `next_to_make` is ready (or could not be made)."""
        self._making[nbytes] -= 1
        if ok:
            self._warm[nbytes] += 1

    def unwanted(self) -> list[int]:
        """Sizes of warm files to discard: no longer among the recent sizes."""
        out = [n for n, c in self._warm.items() if c > 0 and n not in self._recent for _ in range(c)]
        for n in out:
            self._warm[n] -= 1
        return out
