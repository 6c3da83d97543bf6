"""How both host processes start and stop: logging set up once, and a clean
exit on SIGTERM (Kubernetes, the local launcher) or SIGINT.

A host started by the embedded controller also exits when that controller is
gone, however it ended (`pathways_wire.process_tree.watch_parent`): it stops as on
SIGTERM, and since no launcher is left to clean up after it, removes its
shared-memory directory itself. If stopping hangs (a worker blocked joining its
JAX job), it is cut short after `PARENT_GONE_GRACE_S`.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import sys
import threading

from pathways_wire.process_tree import exit_after, watch_parent

PARENT_GONE_GRACE_S = 10.0

_stop = threading.Event()


def configure_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("PATHWAYS_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def single_threaded_blas() -> None:
    """Keep numpy's OpenBLAS to the calling thread; call it before numpy is first imported.

    A host never calls numpy's BLAS (its computations run in XLA), yet OpenBLAS
    starts a thread per core when numpy is imported, and they spin before they
    sleep: about 0.1 s of CPU per process. The hosts of a gang start together
    on the same cores, so that CPU comes out of the gang's start-up. A value
    set in the environment is kept.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def exit_with_parent(shm_dir: str) -> None:
    """When started with a parent link, exit when the parent goes, leaving no `shm_dir`."""

    def remove_shm() -> None:
        shutil.rmtree(shm_dir, ignore_errors=True)

    def parent_gone() -> None:
        atexit.register(remove_shm)
        exit_after(PARENT_GONE_GRACE_S, remove_shm)
        _stop.set()
        if threading.current_thread() is not threading.main_thread():
            # Until wait_for_signal installs its handler, SIGTERM's default ends start-up.
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                remove_shm()
                os.kill(os.getpid(), signal.SIGTERM)

    watch_parent(parent_gone)


def wait_for_signal() -> None:
    """Blocks until SIGTERM or SIGINT (or the parent is gone, see `exit_with_parent`)."""

    def on_signal(signum: int, _frame: object) -> None:
        _stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not _stop.wait(3600):
        pass
