"""The sidecar's bound on bytes of incoming values, and its back-pressure.

Each value arriving from outside the host reserves its whole size when its
first piece shows up, and keeps it until the controller releases the call (the
worker holds the value until then). A Put that does not fit waits — while it
waits the gRPC stream is not read, so flow control slows the sender and
nothing is dropped — and gives up after a bounded time with an error naming
the sizes. A value bigger than the whole limit is refused at once. ``waits`` and
``wait_seconds`` count the back-pressure (the sidecar's metrics export them).
"""

from __future__ import annotations

import threading
import time


class BudgetError(Exception):
    """No room for a value; `too_large` if it could never fit."""

    def __init__(self, message: str, too_large: bool) -> None:
        super().__init__(message)
        self.too_large = too_large


class ByteBudget:
    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self._cv = threading.Condition()
        self._used = 0
        self._by_call: dict[str, int] = {}
        self.waits = 0
        """Reservations that had to wait for room (back-pressure), and their total wait."""
        self.wait_seconds = 0.0

    @property
    def used(self) -> int:
        with self._cv:
            return self._used

    def held_by(self, call_id: str) -> int:
        with self._cv:
            return self._by_call.get(call_id, 0)

    def reserve(self, call_id: str, nbytes: int, timeout_s: float, what: str) -> None:
        if nbytes > self.limit:
            raise BudgetError(
                f"{what} needs {nbytes} B, more than the whole store limit of {self.limit} B "
                "(PATHWAYS_SIDECAR_STORE_LIMIT_BYTES)",
                too_large=True,
            )
        started = time.monotonic()
        deadline = started + timeout_s
        with self._cv:
            waited = self._used + nbytes > self.limit
            self.waits += int(waited)
            try:
                while self._used + nbytes > self.limit:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BudgetError(
                            f"{what} needs {nbytes} B; {self.limit - self._used} B free of limit "
                            f"{self.limit} B after waiting {timeout_s:g} s for calls to be released "
                            f"(held by {self._holders()})",
                            too_large=False,
                        )
                    self._cv.wait(left)
            finally:
                if waited:
                    self.wait_seconds += time.monotonic() - started
            self._used += nbytes
            self._by_call[call_id] = self._by_call.get(call_id, 0) + nbytes

    def release(self, call_id: str, nbytes: int) -> None:
        with self._cv:
            held = self._by_call.get(call_id, 0)
            nbytes = min(nbytes, held)
            self._used -= nbytes
            if held - nbytes:
                self._by_call[call_id] = held - nbytes
            else:
                self._by_call.pop(call_id, None)
            self._cv.notify_all()

    def release_call(self, call_id: str) -> int:
        with self._cv:
            freed = self._by_call.pop(call_id, 0)
            self._used -= freed
            self._cv.notify_all()
            return freed

    def _holders(self) -> str:
        held = sorted(self._by_call.items(), key=lambda kv: -kv[1])[:5]
        return ", ".join(f"call {c}: {b} B" for c, b in held) or "no call"
