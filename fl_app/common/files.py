"""Files written so that a reader never sees half of one (temp file, then rename): the
checkpoint, the clients' state mirrors and the run's record files all go through here.

A write that fails (a full disk, a signal) removes its temp file and leaves the old file as it
was: no ``checkpoint.npz.tmp`` or 0-byte table is left behind (``replacing``). A process killed
mid-write (``kill -9``) leaves its temp file, which nothing reads (every reader names its files
exactly, or matches ``round-<r>.npz$``) and the next write of that file replaces.

A client that cannot write the state it keeps between rounds (``StateNotKept``) stops the run:
counted as one failed client, its round would be aggregated without it and the run would go on,
no longer the run its config and seed give, while a resume could not restore that client."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

STATE_NOT_KEPT = "client state not kept"  # how a StateNotKept failure's text begins, wherever it is reported


class StateNotKept(RuntimeError):
    """A client's kept state could not be written (its mirror, its cohort node's journal): the
    run stops. Its text begins with ``STATE_NOT_KEPT``, which reaches the server in the failure
    (Flower hands a ClientApp's error on as text), where ``fl_app.server.server`` stops on it."""



@contextlib.contextmanager
def replacing(path: Path, mode: str = "w", newline: str | None = None) -> Iterator[IO]:
    """A temp file beside ``path`` to write into; when the block ends normally it is flushed,
    fsynced and renamed over ``path`` (a reader sees the old file or the whole new one); when the
    block or the rename fails, the temp file is removed and the error propagates (an ``OSError``
    of a write, which names no file, with ``path`` as its ``filename``)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, mode, newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a failed write names no file: name the one meant
            exc.filename = str(path)
        raise


def atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write ``arrays`` to ``path`` so a reader sees the old file or the whole new one, never a
    part (``replacing``): a crash mid-write cannot corrupt a checkpoint or a state file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temp file and a rename: the old text or the new."""
    with replacing(path) as f:
        f.write(text)
    return path
