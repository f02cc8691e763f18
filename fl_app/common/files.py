"""Files written so that a reader never sees half of one (temp file, then rename): the
checkpoint, the clients' state mirrors and the run's record files all go through here."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write ``arrays`` to ``path`` so a reader sees the old file or the whole new one, never a
    part (temp file, fsync, rename): a crash mid-write cannot corrupt a checkpoint or a state file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temp file and a rename: the old text or the new."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
