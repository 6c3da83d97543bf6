"""When the operator may read a program's Secret to check a token it has not seen.

An operator that restarted knows no program token until it reads the programs'
Secrets, so a driver's report or call names its program, and the operator checks the
presented token against that program's Secret (`DriverPods.program_of`). Every such
check is a GET on the API server, asked for by whoever reaches the operator's port with
any token and any name: unbounded, a caller could make the operator hammer the API
server. So a read is allowed only

* for a program whose token the operator does not know yet (once it has read a program's
  Secret it knows the token, and a wrong one is refused without a read);
* not within `MISS_HOLD_S` of a read that found no Secret for that program (a driver
  exists only once its Secret does, so no driver waits on one missing);
* within a token bucket of `RATE_PER_S` reads a second, `BURST` at once, over all
  programs: a flood of invented names costs the API server no more than that.

A refused check is answered as an unknown token; drivers retry those (a restarted
operator's first reports), so a legitimate driver waits at most a moment.

Pure: the caller passes the clock's reading.
"""

from __future__ import annotations

import math

RATE_PER_S = 20.0
BURST = 40
MISS_HOLD_S = 5.0
MAX_MISSES = 4096
"""Programs whose missing Secret is remembered at most; the oldest are forgotten first."""


class ReadBackGate:
    """Decides whether a program's Secret may be read now (`allow`), told what the reads found."""

    def __init__(
        self, rate_per_s: float = RATE_PER_S, burst: int = BURST, miss_hold_s: float = MISS_HOLD_S,
        max_misses: int = MAX_MISSES,
    ) -> None:
        if rate_per_s <= 0 or burst < 1 or miss_hold_s < 0 or max_misses < 1:
            raise ValueError("a read-back gate needs a positive rate, a burst of at least 1, "
                             "a hold of 0 s or more and room for at least one miss")
        self._rate = rate_per_s
        self._burst = float(burst)
        self._hold = miss_hold_s
        self._max_misses = max_misses
        self._tokens = float(burst)
        self._last = -math.inf
        """When the bucket was last refilled: never yet, so the first look finds it full."""
        self._misses: dict[str, float] = {}
        """Program key -> when a read found no Secret for it, oldest first."""

    def allow(self, program: str, now: float) -> bool:
        """Whether `program`'s Secret may be read at `now`; an allowed read is counted."""
        missed = self._misses.get(program)
        if missed is not None:
            if now - missed < self._hold:
                return False
            del self._misses[program]
        if now > self._last:  # a clock that steps back refills nothing
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
            self._last = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def missed(self, program: str, now: float) -> None:
        """A read found no Secret of `program` (or one it does not own)."""
        self._misses.pop(program, None)
        self._misses[program] = now
        while len(self._misses) > self._max_misses:
            del self._misses[next(iter(self._misses))]

    def found(self, program: str) -> None:
        """A read found `program`'s Secret: its token is known from now on."""
        self._misses.pop(program, None)
