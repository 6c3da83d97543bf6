"""How both host processes start and stop: logging set up once, and a clean
exit on SIGTERM (Kubernetes, the local launcher) or SIGINT."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading


def configure_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("PATHWAYS_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def wait_for_signal() -> None:
    """Blocks until SIGTERM or SIGINT."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(3600):
        pass
