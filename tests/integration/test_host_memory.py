"""A host process keeps the buffers it frees for the next ones (`lifecycle.keep_freed_memory`).

Each check runs in a fresh interpreter, since glibc's settings are the process's own:
it makes 1 MiB buffers (their sizes a little apart, as a host's outputs are) while the
last `window` of them stay alive, as a host keeps its outputs while they run, and counts
the pages the kernel faulted in for them after a first pass has grown the heap.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ALLOCATE = (
    "import collections, resource, sys\n"
    "import numpy as np\n"
    "from pathways_worker.lifecycle import keep_freed_memory\n"
    "took = keep_freed_memory()\n"
    "def faults_per_buffer(window, n=200):\n"
    "    kept = collections.deque(maxlen=window)\n"
    "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
    "    for i in range(n):\n"
    "        kept.append(np.ones((1 << 17) + (i % 7) * 64))\n"
    "    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n\n"
    "window = int(sys.argv[1])\n"
    "faults_per_buffer(window)\n"
    "print(took, max(faults_per_buffer(window) for _ in range(3)))\n"
)
PAGES_PER_BUFFER = (1 << 20) // os.sysconf("SC_PAGE_SIZE")


def _run(window: int, env: dict[str, str] | None = None) -> tuple[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", ALLOCATE, str(window)], capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    took, faults = done.stdout.split()
    return took, float(faults)


@pytest.mark.parametrize("window", [1, 16, 48])
def test_a_host_process_reuses_freed_buffers_rather_than_faulting_in_fresh_pages(window: int) -> None:
    took, faults = _run(window)
    assert took == "True", "glibc did not take the settings"
    # fresh pages would be one fault per page: 256 per 1 MiB buffer
    assert faults < PAGES_PER_BUFFER / 32, f"{faults:.0f} pages faulted in per 1 MiB buffer, keeping {window}"


def test_a_host_process_keeps_the_malloc_settings_its_environment_gives() -> None:
    took, _ = _run(1, {"MALLOC_ARENA_MAX": "2"})
    assert took == "False"
    took, _ = _run(1, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"})
    assert took == "False"
