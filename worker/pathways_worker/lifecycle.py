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
import ctypes
import logging
import os
import shutil
import signal
import sys
import threading

from pathways_wire.process_tree import exit_after, watch_parent

PARENT_GONE_GRACE_S = 10.0

KEEP_FREED_BYTES = 256 << 20
"""Free heap a host process keeps for its next buffers (`keep_freed_memory`): more than the
outputs a host holds while they run and wait to be reported (`host_state`'s
`DISPATCH_AHEAD_BYTES` and `FINISH_BATCH_BYTES`, 80 MiB), less than a large compile's
passing peak, which is given back."""
LARGEST_HEAP_BUFFER = 32 << 20
"""The largest buffer taken from the heap rather than mapped alone: glibc's own cap."""
_M_TRIM_THRESHOLD = -1  # glibc malloc.h
_M_MMAP_THRESHOLD = -3

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


def keep_freed_memory() -> bool:
    """Let glibc keep freed buffers for the next ones, rather than hand them back to the
    kernel; whether it took the settings.

    A host's values are megabytes each and die young: a chain of 512x512 matmuls
    makes a 1 MiB output per computation and frees one a few computations later.
    glibc maps each such buffer alone (until its adaptive threshold has risen past
    it) and gives back any free top of its heaps past twice that threshold, so the
    next buffer is fresh pages again, faulted in and zeroed by the kernel. A host
    keeps its outputs alive a little longer than plain JAX does (while they run, in
    the batch the finisher reports), which was enough for a worker to fault about
    120 pages per computation of that chain (plain JAX: about 3) and lose 10-20% of
    its speed. So buffers up to `LARGEST_HEAP_BUFFER` come from the heap, and a free
    top of a heap is given back only past `KEEP_FREED_BYTES`: a host's memory stays near
    its high-water mark, as under a caching allocator. Settings the environment gives glibc
    (`GLIBC_TUNABLES` naming malloc, any `MALLOC_*`) are kept; anything but glibc is left
    as it is.
    """
    if "malloc" in os.environ.get("GLIBC_TUNABLES", "") or any(name.startswith("MALLOC_") for name in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, LARGEST_HEAP_BUFFER)) and bool(
        mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES)
    )


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
