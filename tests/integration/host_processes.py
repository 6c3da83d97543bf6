"""The embedded runtime's host processes, found by the address they serve (for fault tests)."""

from __future__ import annotations

from pathlib import Path


def worker_pids(address_ip: str) -> list[int]:
    """Pids of the worker processes serving on `address_ip` (the embedded hosts' own IPs)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pathways_worker.worker" in cmd and any(
            arg.startswith(address_ip.encode() + b":") for arg in cmd
        ):
            pids.append(int(entry.name))
    return pids
