"""A client's ``context.state`` arrays mirrored on disk, per round, so a resumed run (or a
simulation with ``client-state = "disk"``) gives each client back the state it had."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from fl_app.common.files import atomic_savez


def visible_run_dir(config: dict) -> str | None:
    """The server's run folder named in a fit instruction (``run-dir``), when this process sees
    it (simulation, or a deployment on a shared filesystem), else None: a client mirrors its
    state only there, and never creates the server's path elsewhere."""
    run_dir = str(config.get("run-dir", ""))
    return run_dir if run_dir and Path(run_dir).is_dir() else None


def state_mirrored(config: dict) -> bool:
    """Whether the clients' state is mirrored on disk this round: the server checkpoints
    (``checkpoint-every`` > 0) and its run folder is visible here (``visible_run_dir``)."""
    return bool(config.get("checkpoint-every")) and visible_run_dir(config) is not None


class ClientStateMirror:
    """One client's ``context.state`` arrays on disk, per round, for resuming."""

    PATTERN = re.compile(r"round-(\d+)\.npz$")

    def __init__(self, run_dir: str, client: str):
        self.dir = Path(run_dir) / "client-state" / client

    def _files(self) -> list[tuple[int, Path]]:
        if not self.dir.exists():
            return []
        found = [(int(m.group(1)), p) for p in self.dir.iterdir() if (m := self.PATTERN.search(p.name))]
        return sorted(found)

    def save(self, server_round: int, state: dict[str, list[np.ndarray]], keep_from: int) -> None:
        """Write this round's state; drop files no resume can need (older than the newest
        file at or before ``keep_from``, the last checkpointed round)."""
        arrays = {}
        for name, values in state.items():
            arrays.update({f"{name}\x1f{i}": np.asarray(a) for i, a in enumerate(values)})
        atomic_savez(self.dir / f"round-{server_round}.npz", arrays)
        files = self._files()
        keep = [r for r, _ in files if r <= keep_from]
        floor = max(keep) if keep else None
        for r, p in files:
            if floor is not None and r < floor:
                p.unlink(missing_ok=True)

    def load(self, up_to_round: int) -> dict[str, list[np.ndarray]] | None:
        """The newest saved state from a round <= ``up_to_round``."""
        candidates = [(r, p) for r, p in self._files() if r <= up_to_round]
        if not candidates:
            return None
        state: dict[str, dict[int, np.ndarray]] = {}
        with np.load(candidates[-1][1]) as data:
            for key in data.files:
                name, i = key.rsplit("\x1f", 1)
                state.setdefault(name, {})[int(i)] = data[key]
        return {name: [d[i] for i in sorted(d)] for name, d in state.items()}


PARTITION = "partition-"  # a partition's mirror is client-state/partition-<p>


def partition_mirror(run_dir: str, partition: int) -> ClientStateMirror:
    """The mirror of the client of partition ``partition`` (a data-path node's is named otherwise)."""
    return ClientStateMirror(run_dir, f"{PARTITION}{partition}")


def mirrored_partitions(run_dir: str) -> list[int]:
    """The partitions whose clients have a mirror in ``run_dir``."""
    folder = Path(run_dir) / "client-state"
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    return sorted(int(n[len(PARTITION):]) for n in names if n.startswith(PARTITION) and n[len(PARTITION):].isdigit())
