"""Datasets by name, read through flwr-datasets, partitioned by its partitioners.

Source order: ``data-dir`` (run config) or ``$FL_DATA_DIR`` holding
``<name>/{train,test}.parquet`` in the Hugging Face hub schema; else the hub id. When
neither can be read, one ``DataUnavailableError`` says what was tried.

A SuperNode may instead bring its own data (``--node-config data-path=...``): a parquet file
or image folder in the same schema, read by ``load_local_file``.

Decoded partitions are cached per process (``functools.lru_cache``), so a Ray actor or a
SuperNode decodes each client's images once, not every round.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tasks.models import InputShape


class DataUnavailableError(RuntimeError):
    """Neither the local data directory nor the hub could provide the dataset."""


class PartitionError(ValueError):
    """The requested partitioning cannot be made from the dataset."""


@dataclass(frozen=True)
class DatasetInfo:
    hub_id: str
    image_column: str
    label_column: str
    shape: InputShape
    mean: tuple[float, ...]
    std: tuple[float, ...]


DATASETS: dict[str, DatasetInfo] = {
    "mnist": DatasetInfo("ylecun/mnist", "image", "label", InputShape(1, 28, 10), (0.1307,), (0.3081,)),
    "fashion_mnist": DatasetInfo(
        "zalando-datasets/fashion_mnist", "image", "label", InputShape(1, 28, 10), (0.2860,), (0.3530,)
    ),
    "cifar10": DatasetInfo(
        "uoft-cs/cifar10", "img", "label", InputShape(3, 32, 10),
        (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616),
    ),
    "cifar100": DatasetInfo(
        "uoft-cs/cifar100", "img", "fine_label", InputShape(3, 32, 100),
        (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
    ),
}


@dataclass(frozen=True)
class PartitionSpec:
    """How the training split is cut into client partitions (hashable: a cache key)."""

    dataset: str
    num_partitions: int
    partitioner: str = "dirichlet"
    alpha: float = 0.3
    shards_per_client: int = 2
    min_partition_size: int = 10
    seed: int = 0
    data_dir: str = ""
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0

    @classmethod
    def from_config(cls, cfg: dict, num_partitions: int) -> "PartitionSpec":
        return cls(
            dataset=cfg["dataset"],
            num_partitions=num_partitions,
            partitioner=cfg["partitioner"],
            alpha=cfg["alpha"],
            shards_per_client=cfg["shards-per-client"],
            min_partition_size=cfg["min-partition-size"],
            seed=cfg["seed"],
            data_dir=resolve_data_dir(cfg["data-dir"]),
            synthetic_alpha=cfg["synthetic-alpha"],
            synthetic_beta=cfg["synthetic-beta"],
        )


def resolve_data_dir(configured: str) -> str:
    """The run config's ``data-dir`` if set, else ``$FL_DATA_DIR``, as an absolute path ('' if none)."""
    chosen = configured or os.environ.get("FL_DATA_DIR", "")
    return str(Path(chosen).expanduser().resolve()) if chosen else ""


def input_shape(dataset: str) -> InputShape:
    if dataset == "synthetic":
        from tasks.synthetic import SYNTHETIC_SHAPE

        return SYNTHETIC_SHAPE
    return DATASETS[dataset].shape


def _local_files(name: str, data_dir: str) -> dict[str, str] | None:
    if not data_dir:
        return None
    files = {split: Path(data_dir) / name / f"{split}.parquet" for split in ("train", "test")}
    return {k: str(v) for k, v in files.items()} if all(p.is_file() for p in files.values()) else None


def _make_partitioner(spec: PartitionSpec, label_column: str):
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, ShardPartitioner

    if spec.partitioner == "dirichlet":
        indices = _remembered_indices(spec)
        if indices is not None:
            return _precomputed_partitioner(indices)
        return DirichletPartitioner(
            num_partitions=spec.num_partitions, partition_by=label_column, alpha=spec.alpha,
            min_partition_size=spec.min_partition_size, self_balancing=False, seed=spec.seed,
        )
    if spec.partitioner == "shard":
        return ShardPartitioner(
            num_partitions=spec.num_partitions, partition_by=label_column,
            num_shards_per_partition=spec.shards_per_client, seed=spec.seed,
        )
    if spec.partitioner == "iid":
        return IidPartitioner(num_partitions=spec.num_partitions)
    raise PartitionError(f"unknown partitioner {spec.partitioner!r}; valid choices: dirichlet, shard, iid")


@functools.lru_cache(maxsize=4)
def federated_dataset(spec: PartitionSpec):
    """The flwr-datasets FederatedDataset for ``spec`` (local parquet first, then the hub)."""
    from flwr_datasets import FederatedDataset

    info = DATASETS[spec.dataset]
    partitioners = {"train": _make_partitioner(spec, info.label_column)}
    # shuffle=True with the run seed: the CIFAR-10 parquet rows are grouped by class, and
    # IidPartitioner cuts contiguous blocks.
    common = dict(partitioners=partitioners, shuffle=True, seed=spec.seed)
    files = _local_files(spec.dataset, spec.data_dir)
    if files is not None:
        try:
            fds = FederatedDataset(dataset="parquet", data_files=files, **common)
            fds.load_split("test")  # reads the files now, so an unreadable one is reported here
        except Exception as exc:  # arrow/datasets raise many types for corrupt files
            raise DataUnavailableError(
                f"cannot read {files['train']} / {files['test']} as parquet for dataset "
                f"{spec.dataset!r}: {type(exc).__name__}: {exc}"
            ) from exc
        _check_columns(fds, info, files["train"])
        return fds
    tried_local = (
        f"data-dir {spec.data_dir!r} has no {spec.dataset}/train.parquet and {spec.dataset}/test.parquet"
        if spec.data_dir
        else "no data-dir set (run-config 'data-dir' or env FL_DATA_DIR)"
    )
    try:
        fds = FederatedDataset(dataset=info.hub_id, **common)
        fds.load_split("test")  # force the download now, so failure is reported here
    except Exception as exc:  # the hub raises many types (ConnectionError, HfHubHTTPError, ...)
        raise DataUnavailableError(
            f"cannot load dataset {spec.dataset!r}: {tried_local}; and the Hugging Face hub id "
            f"{info.hub_id!r} failed ({type(exc).__name__}: {exc}). Point data-dir or FL_DATA_DIR"
            f" at a folder holding {spec.dataset}/train.parquet and {spec.dataset}/test.parquet."
        ) from exc
    return fds


def _check_columns(fds, info: DatasetInfo, where: str) -> None:
    cols = set(fds.load_split("test").column_names)
    missing = {info.image_column, info.label_column} - cols
    if missing:
        raise DataUnavailableError(
            f"{where}: missing column(s) {sorted(missing)} (found {sorted(cols)}); the "
            f"{info.hub_id} schema has {info.image_column!r} and {info.label_column!r}"
        )


def _to_tensors(ds, info: DatasetInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode images once into a normalised float32 NCHW tensor."""
    images = np.stack([np.asarray(im, dtype=np.uint8) for im in ds[info.image_column]])
    return _normalise(images, np.asarray(ds[info.label_column]), info)


def _normalise(images: np.ndarray, labels: np.ndarray, info: DatasetInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 N x H x W (grey) or N x H x W x C images -> the dataset's normalised NCHW float32."""
    if images.ndim == 3:  # greyscale: N x H x W
        images = images[:, None]
    else:  # colour: N x H x W x C
        images = images.transpose(0, 3, 1, 2)
    x = torch.from_numpy(images).float().div_(255.0)
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    x = (x - mean) / std
    y = torch.as_tensor(labels, dtype=torch.long)
    return x.contiguous(), y


@functools.lru_cache(maxsize=256)
def load_partition(spec: PartitionSpec, partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``partition_id``'s training data as (x, y) CPU tensors, decoded once per process."""
    if not 0 <= partition_id < spec.num_partitions:
        raise PartitionError(
            f"partition-id {partition_id} is out of range for num-partitions {spec.num_partitions}"
        )
    if spec.dataset == "synthetic":
        from tasks.synthetic import synthetic_partition

        return synthetic_partition(spec, partition_id)
    try:
        fds = federated_dataset(spec)
        part = fds.load_partition(partition_id, "train")
        _remember_indices(spec, fds.partitioners["train"])  # the next process on this node reads it
    except DataUnavailableError:
        raise
    except Exception as exc:  # flwr-datasets raises ValueError for impossible partitionings
        raise PartitionError(
            f"cannot cut {spec.dataset!r} into {spec.num_partitions} {spec.partitioner} partitions "
            f"(alpha={spec.alpha}, shards-per-client={spec.shards_per_client}, "
            f"min-partition-size={spec.min_partition_size}): {exc}"
        ) from exc
    if len(part) == 0:
        raise PartitionError(
            f"partition {partition_id} of {spec.num_partitions} ({spec.partitioner}) is empty; "
            "raise min-partition-size, raise alpha or use fewer clients"
        )
    return _to_tensors(part, DATASETS[spec.dataset])


def load_test(spec: PartitionSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The test split (centralized evaluation), decoded once per process."""
    if spec.dataset == "synthetic":
        from tasks.synthetic import synthetic_test

        return synthetic_test(spec)  # pools every device's share: depends on the partitioning
    return load_test_split(spec.dataset, spec.data_dir, spec.seed)


@functools.lru_cache(maxsize=4)
def load_test_split(dataset: str, data_dir: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A real dataset's decoded test split. It does not depend on the partitioning, so the
    server can decode it before it has learnt the partition count (while Ray starts)."""
    if dataset not in DATASETS:
        raise DataUnavailableError(f"unknown dataset {dataset!r}; valid choices: {', '.join(DATASETS)}")
    source = PartitionSpec(dataset=dataset, num_partitions=1, partitioner="iid", seed=seed, data_dir=data_dir)
    return _to_tensors(federated_dataset(source).load_split("test"), DATASETS[dataset])


def check_data(spec: PartitionSpec) -> None:
    """Fail fast, before any training, on a missing source, wrong columns, or a partitioning
    that leaves a client without data. Nothing is decoded, but cutting the partitions takes
    about a second (Dirichlet); a partitioning of local files that passed once is remembered
    on disk (``checked_partitioning``), so the server does not redo the runner's check."""
    if spec.dataset == "synthetic":
        return
    if checked_partitioning(spec) is not None:
        return
    fds = federated_dataset(spec)
    train_size = fds.load_split("train").num_rows
    if spec.num_partitions > train_size:
        raise PartitionError(
            f"{spec.num_partitions} partitions requested but {spec.dataset!r} has only {train_size} training samples"
        )
    try:
        sizes = [len(fds.load_partition(i, "train")) for i in range(spec.num_partitions)]
    except Exception as exc:
        raise PartitionError(
            f"cannot cut {spec.dataset!r} into {spec.num_partitions} {spec.partitioner} partitions "
            f"(alpha={spec.alpha}, shards-per-client={spec.shards_per_client}, "
            f"min-partition-size={spec.min_partition_size}): {exc}"
        ) from exc
    empty = [i for i, n in enumerate(sizes) if n == 0]
    if empty:
        raise PartitionError(
            f"{len(empty)} of {spec.num_partitions} {spec.partitioner} partitions are empty (e.g. partition "
            f"{empty[0]}); raise min-partition-size or alpha, or use fewer clients"
        )
    _remember_partitioning(spec, sizes, fds.partitioners["train"])


def cache_dir() -> Path:
    """Where fl-drift keeps small derived facts between processes: ``$FL_DRIFT_CACHE``, else
    ``~/.cache/fl-drift``."""
    return Path(os.environ.get("FL_DRIFT_CACHE") or Path.home() / ".cache" / "fl-drift").expanduser()


def _partitioning_key(spec: PartitionSpec) -> str | None:
    """A digest of everything a partitioning depends on, or None when it cannot be pinned
    (hub data: the hub's copy may change). Local files count by path, size and mtime."""
    files = _local_files(spec.dataset, spec.data_dir)
    if files is None:
        return None
    from importlib.metadata import version

    stats = {split: (path, os.stat(path).st_size, os.stat(path).st_mtime_ns) for split, path in files.items()}
    fields = {k: v for k, v in dataclasses.asdict(spec).items() if k != "data_dir"}
    pinned = {"spec": fields, "files": stats, "numpy": np.__version__,
              "flwr-datasets": version("flwr-datasets"), "datasets": version("datasets")}
    return hashlib.sha1(json.dumps(pinned, sort_keys=True).encode()).hexdigest()


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


def _remember_partitioning(spec: PartitionSpec, sizes: list[int], partitioner) -> None:
    """Best effort (a read-only home only costs the next check its second). A Dirichlet
    partitioner's index assignment is kept too (``_remembered_indices``)."""
    try:
        key = _partitioning_key(spec)
        if key is None:
            return
        _remember_indices(spec, partitioner)
        folder = cache_dir() / "partitions"
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"sizes": sizes}))
        os.replace(tmp, folder / f"{key}.json")  # atomic: a reader never sees half a file
    except OSError:
        pass


def _remember_indices(spec: PartitionSpec, partitioner) -> None:
    """Keep a Dirichlet partitioner's index assignment once it is cut (best effort)."""
    try:
        key = _partitioning_key(spec)
        if key is None or spec.partitioner != "dirichlet":
            return
        folder = cache_dir() / "partitions"
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / f"{key}.npz").exists():
            return
        # flwr-datasets' DirichletPartitioner keeps its assignment in this attribute (1.x);
        # if a later version renames it, only the index cache is skipped.
        assignment = getattr(partitioner, "_partition_id_to_indices", None)
        if not isinstance(assignment, dict) or sorted(assignment) != list(range(spec.num_partitions)):
            return
        parts = [np.asarray(assignment[i], dtype=np.int64) for i in range(spec.num_partitions)]
        tmp = folder / f"{key}.{os.getpid()}.tmp.npz"
        np.savez(tmp, indices=np.concatenate(parts), sizes=np.array([len(p) for p in parts]))
        os.replace(tmp, folder / f"{key}.npz")  # atomic
    except OSError:
        pass


def _remembered_indices(spec: PartitionSpec) -> list[np.ndarray] | None:
    """The Dirichlet index assignment a passed ``check_data`` kept, else None. Each client
    process would otherwise redo the cut (about a second for MNIST and 100 clients; in a
    deployment that is every message, as each runs in a fresh process)."""
    try:
        key = _partitioning_key(spec)
        if key is None:
            return None
        with np.load(cache_dir() / "partitions" / f"{key}.npz") as saved:
            flat, sizes = saved["indices"], saved["sizes"]
    except (OSError, ValueError, KeyError):
        return None
    if len(sizes) != spec.num_partitions or int(sizes.sum()) != len(flat):
        return None
    return np.split(flat, np.cumsum(sizes)[:-1])


def _precomputed_partitioner(indices: list[np.ndarray]):
    """A flwr-datasets ``Partitioner`` serving a remembered assignment: partition i is
    ``dataset.select(indices[i])``, as DirichletPartitioner serves it once computed."""
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


# ------------------------------------------------------------------ node-local data
class LocalDataError(DataUnavailableError):
    """A SuperNode's own ``data-path`` is missing or does not hold the run's dataset schema."""


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def load_local_file(path: str, dataset: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A node's own training data (``--node-config data-path=...``) as normalised (x, y) tensors.

    ``path`` is either a parquet file with the Hugging Face schema of ``dataset`` (e.g. MNIST:
    ``image`` {bytes, path} and ``label``; CIFAR-10: ``img`` and ``label``) or an image folder
    ``<path>/<label>/<image>`` whose sub-folder names are the integer labels. Images must have
    the dataset's size and channels; they get the same normalisation as the named dataset.
    Decoded once per process (cached by path and modification time). Every problem raises
    ``LocalDataError`` naming the path.
    """
    if dataset not in DATASETS:
        raise LocalDataError(
            f"data-path {path!r}: node-local data needs an image dataset "
            f"({', '.join(DATASETS)}), not {dataset!r}"
        )
    resolved = Path(path).expanduser()
    try:
        resolved = resolved.resolve(strict=True)
        stat = resolved.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
    except OSError as exc:
        raise LocalDataError(f"data-path {path!r} does not exist or cannot be read ({exc})") from exc
    return _load_local_cached(str(resolved), dataset, stamp)


@functools.lru_cache(maxsize=8)
def _load_local_cached(path: str, dataset: str, _stamp: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    info = DATASETS[dataset]
    p = Path(path)
    if p.is_dir():
        images, labels = _read_image_folder(p, info)
    elif p.is_file():
        images, labels = _read_parquet(p, info)
    else:
        raise LocalDataError(f"data-path {path!r} is neither a parquet file nor an image folder")
    if len(labels) == 0:
        raise LocalDataError(f"data-path {path!r} holds no examples")
    bad = (labels < 0) | (labels >= info.shape.classes)
    if bad.any():
        raise LocalDataError(
            f"data-path {path!r}: label {int(labels[bad][0])} is outside 0..{info.shape.classes - 1}"
            f" of dataset {dataset!r}"
        )
    return _normalise(images, labels, info)


def _decode(data: bytes | str, info: DatasetInfo, where: str) -> np.ndarray:
    """One encoded image (bytes or a file path) -> uint8 H x W (grey) or H x W x C array."""
    from PIL import Image

    channels, size = info.shape.channels, info.shape.size
    try:
        with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as im:
            array = np.asarray(im.convert("L" if channels == 1 else "RGB"), dtype=np.uint8)
    except Exception as exc:  # PIL raises UnidentifiedImageError, OSError, ...
        raise LocalDataError(f"{where}: cannot decode image ({type(exc).__name__}: {exc})") from exc
    if array.shape[:2] != (size, size):
        raise LocalDataError(
            f"{where}: image is {array.shape[1]}x{array.shape[0]}, the dataset needs {size}x{size}"
        )
    return array


def _read_parquet(path: Path, info: DatasetInfo) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # ArrowInvalid, OSError, ...
        raise LocalDataError(
            f"data-path {str(path)!r} is not a readable parquet file ({type(exc).__name__}: {exc})"
        ) from exc
    missing = {info.image_column, info.label_column} - set(table.column_names)
    if missing:
        raise LocalDataError(
            f"data-path {str(path)!r}: missing column(s) {sorted(missing)} (found "
            f"{sorted(table.column_names)}); the {info.hub_id} schema has "
            f"{info.image_column!r} and {info.label_column!r}"
        )
    images = []
    for i, cell in enumerate(table.column(info.image_column).to_pylist()):
        where = f"data-path {str(path)!r} row {i}"
        if isinstance(cell, dict):  # the Hugging Face Image feature: {bytes, path}
            data = cell.get("bytes") or (str(path.parent / cell["path"]) if cell.get("path") else None)
        else:
            data = cell
        if not isinstance(data, (bytes, str)):
            raise LocalDataError(f"{where}: column {info.image_column!r} holds no image bytes or path")
        images.append(_decode(data, info, where))
    labels = np.asarray(table.column(info.label_column).to_pylist())
    if not np.issubdtype(labels.dtype, np.integer):
        raise LocalDataError(f"data-path {str(path)!r}: column {info.label_column!r} must hold integers")
    return (np.stack(images) if images else np.zeros((0,), np.uint8)), labels


def _read_image_folder(path: Path, info: DatasetInfo) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for sub in sorted(path.iterdir()):
        if not sub.is_dir():
            continue
        if not sub.name.isdigit():
            raise LocalDataError(
                f"data-path {str(path)!r}: sub-folder {sub.name!r} is not an integer label; an image"
                " folder holds <label>/<image> with label 0, 1, ..."
            )
        for file in sorted(sub.iterdir()):
            if file.suffix.lower() in IMAGE_SUFFIXES:
                images.append(_decode(str(file), info, f"data-path image {str(file)!r}"))
                labels.append(int(sub.name))
    if not images:
        raise LocalDataError(
            f"data-path {str(path)!r}: no images found; an image folder holds <label>/<image>"
            f" files ({', '.join(IMAGE_SUFFIXES)})"
        )
    return np.stack(images), np.asarray(labels, dtype=np.int64)
