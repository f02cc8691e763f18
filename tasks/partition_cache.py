"""What fl-drift remembers on disk about a partitioning of local files, so later processes
skip work: the partition sizes of a partitioning ``check_data`` passed, and a partitioner's
index assignment (each client process would otherwise redo the cut, which reads the label
column and, for Dirichlet-style partitioners, draws example by example).

Best effort: any read or write problem only costs the next process the recomputation.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from tasks.datasets import local_parquet_files
from tasks.partition_spec import PartitionSpec

# Bumped when what is remembered changes meaning: 2 = a ShardPartitioner's indices are kept as
# rows of the split it was given, not of its label-sorted copy (``partitioner_assignment``).
ASSIGNMENT_FORMAT = 2


def cache_dir() -> Path:
    """Where fl-drift keeps small derived facts between processes: ``$FL_DRIFT_CACHE``, else
    ``~/.cache/fl-drift``."""
    return Path(os.environ.get("FL_DRIFT_CACHE") or Path.home() / ".cache" / "fl-drift").expanduser()


def _partitioning_key(spec: PartitionSpec) -> str | None:
    """A digest of everything a partitioning depends on, or None when it cannot be pinned
    (hub data: the hub's copy may change). Local files count by path, size and mtime."""
    files = local_parquet_files(spec.dataset, spec.data_dir)
    if files is None:
        return None
    stats = {split: (path, os.stat(path).st_size, os.stat(path).st_mtime_ns) for split, path in files.items()}
    fields = {k: v for k, v in dataclasses.asdict(spec).items() if k != "data_dir"}
    pinned = {"spec": fields, "files": stats, "numpy": np.__version__, "assignment": ASSIGNMENT_FORMAT,
              **_library_versions()}
    return hashlib.sha1(json.dumps(pinned, sort_keys=True).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def _library_versions() -> dict[str, str]:
    """The versions a partitioning depends on, read once per process (``importlib.metadata``
    parses each package's metadata: about 3 ms a call, once per partition loaded before)."""
    from importlib.metadata import version

    return {"flwr-datasets": version("flwr-datasets"), "datasets": version("datasets")}


def checked_partitioning(spec: PartitionSpec) -> list[int] | None:
    """Partition sizes of a partitioning that ``check_data`` already passed, else None."""
    try:
        key = _partitioning_key(spec)
        if key is None:
            return None
        sizes = json.loads((cache_dir() / "partitions" / f"{key}.json").read_text())["sizes"]
    except (OSError, ValueError, KeyError):
        return None
    return sizes if len(sizes) == spec.num_partitions and min(sizes) > 0 else None


def remember_partitioning(spec: PartitionSpec, sizes: list[int], partitioner, split=None) -> None:
    """Best effort (a read-only home only costs the next check its second). The partitioner's
    index assignment is kept too (``remembered_indices``)."""
    try:
        key = _partitioning_key(spec)
        if key is None:
            return
        remember_indices(spec, partitioner, split)
        folder = cache_dir() / "partitions"
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"sizes": sizes}))
        os.replace(tmp, folder / f"{key}.json")  # atomic: a reader never sees half a file
    except OSError:
        pass


def remember_indices(spec: PartitionSpec, partitioner, split=None) -> None:
    """Keep a partitioner's index assignment once it is cut (best effort); ``split``: the
    dataset the partitioner was given (``partitioner_assignment``)."""
    try:
        key = _partitioning_key(spec)
        if key is None:
            return
        folder = cache_dir() / "partitions"
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / f"{key}.npz").exists():
            return
        assignment = partitioner_assignment(partitioner, split)
        if not isinstance(assignment, dict) or sorted(assignment) != list(range(spec.num_partitions)):
            return
        parts = [np.asarray(assignment[i], dtype=np.int64) for i in range(spec.num_partitions)]
        tmp = folder / f"{key}.{os.getpid()}.tmp.npz"
        np.savez(tmp, indices=np.concatenate(parts), sizes=np.array([len(p) for p in parts]))
        os.replace(tmp, folder / f"{key}.npz")  # atomic
    except OSError:
        pass


def partitioner_assignment(partitioner, split=None) -> dict | None:
    """partition id -> row indices of ``split`` (the dataset the partitioner was given: the
    prepared training split) of a partitioner that has cut it, else None.

    flwr-datasets (0.6) exposes it publicly only for the size partitioners
    (``partition_id_to_indices``); the Dirichlet, pathological, inner-Dirichlet, shard and
    natural-id partitioners keep it in ``_partition_id_to_indices``, read here only: if a later
    version renames it, only the index cache is skipped. Called once the partitioner has cut.

    ``ShardPartitioner`` cuts a copy of ``split`` sorted by label (``Dataset.sort``: Arrow's
    stable ``sort_indices``), and its indices are rows of that copy: they are mapped back to rows
    of ``split`` (the same rows, in the same order, ``split.select`` serves); None without
    ``split``. (Kept unmapped, as before ``ASSIGNMENT_FORMAT`` 2, every later process served each
    shard client rows of all labels.)"""
    if isinstance(getattr(type(partitioner), "partition_id_to_indices", None), property):
        return partitioner.partition_id_to_indices
    assignment = getattr(partitioner, "_partition_id_to_indices", None)
    from flwr_datasets.partitioner import ShardPartitioner

    if not isinstance(partitioner, ShardPartitioner) or not isinstance(assignment, dict):
        return assignment
    column = getattr(partitioner, "_partition_by", None)
    if split is None or column is None:
        return None
    order = _sorted_rows(split, column)
    return {pid: order[np.asarray(rows, dtype=np.int64)] for pid, rows in assignment.items()}


def _sorted_rows(split, column: str) -> np.ndarray:
    """Row i of ``split.sort(column)`` is row ``order[i]`` of ``split`` (``datasets``' sort:
    ``pyarrow.compute.sort_indices``, stable, ascending, nulls at the end)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = pa.table({column: split.with_format("arrow")[column]})  # the label column alone, in split's order
    order = pc.sort_indices(table, sort_keys=[(column, "ascending")])  # nulls at the end, as datasets' default
    return order.to_numpy().astype(np.int64)


def remembered_indices(spec: PartitionSpec) -> list[np.ndarray] | None:
    """The index assignment a passed ``check_data`` (or a client's first cut) kept, else None.
    Each client process would otherwise redo the cut (seconds for MNIST; in a deployment that
    is every message, as each runs in a fresh process)."""
    try:
        key = _partitioning_key(spec)
        if key is None:
            return None
        path = cache_dir() / "partitions" / f"{key}.npz"
        if str(path) not in _READ:  # read once per process (a file is never rewritten under its key)
            with np.load(path) as saved:
                _READ[str(path)] = (saved["indices"], saved["sizes"])
        flat, sizes = _READ[str(path)]
    except (OSError, ValueError, KeyError):
        return None
    if len(sizes) != spec.num_partitions or int(sizes.sum()) != len(flat):
        return None
    return np.split(flat, np.cumsum(sizes)[:-1])


_READ: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # remembered assignments read by this process


def precomputed_partitioner(indices: list[np.ndarray]):
    """A flwr-datasets ``Partitioner`` serving a remembered assignment: partition i is
    ``dataset.select(indices[i])``, as flwr-datasets' partitioners serve it once computed."""
    from flwr_datasets.partitioner import Partitioner

    class PrecomputedPartitioner(Partitioner):
        def __init__(self) -> None:
            super().__init__()
            self._indices = indices

        @property
        def num_partitions(self) -> int:
            return len(self._indices)

        def load_partition(self, partition_id: int):
            return self.dataset.select(self._indices[partition_id])

    return PrecomputedPartitioner()
