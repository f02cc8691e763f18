"""Find processes a test started, by the private FLWR_HOME in their environment."""

from __future__ import annotations

import os
from pathlib import Path


def processes_with_env(name: str, value: str) -> list[int]:
    """PIDs whose environment has ``name=value`` (Ray workers and SuperExecs inherit it)."""
    needle = f"{name}={value}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found.append(int(proc.name))
    return found
