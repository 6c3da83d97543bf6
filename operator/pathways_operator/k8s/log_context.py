"""Every operator log line says which object it is about.

A reconcile runs in a worker thread on behalf of one VirtualSlice or PathwaysProgram;
whatever it logs, from whichever module (``slices``, ``programs``, ``drivers``, the
controller it calls), is about that object. :func:`about` marks the current thread or
task as working on ``kind:namespace/name`` for the duration, and :class:`ObjectFilter`
puts it into every record as ``%(object)s`` (``-`` for lines about no object, such as
the controller's gRPC threads). kopf's per-object logger already names the object in
its own lines; this covers the reconcilers, the daemons' loops and their threads.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator

FORMAT = "%(asctime)s %(levelname)s %(name)s [%(object)s]: %(message)s"

_current: contextvars.ContextVar[str] = contextvars.ContextVar("pathways_log_object", default="-")


@contextlib.contextmanager
def about(key: str) -> Iterator[None]:
    """Log lines of this thread (or asyncio task) are about ``key`` until the block ends."""
    token = _current.set(key)
    try:
        yield
    finally:
        _current.reset(token)


def set_for_task(key: str) -> None:
    """Marks the running asyncio task as about ``key`` for the rest of its life (each
    task runs in its own copy of the context, so no other task sees it)."""
    _current.set(key)


class ObjectFilter(logging.Filter):
    """Adds ``record.object``: the object the logging thread or task works on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "object"):
            record.object = _current.get()
        return True


def configure(level: str) -> None:
    """Root logging with the object on every line (a handler filter, so records of every
    logger, propagated or not filtered by their own, get it)."""
    logging.basicConfig(level=level, format=FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(ObjectFilter())
