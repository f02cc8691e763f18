"""Datasets by name, read through flwr-datasets, partitioned by its partitioners.

Source order: ``data-dir`` (run config) or ``$FL_DATA_DIR`` holding
``<name>/{train,test}.parquet`` in the Hugging Face hub schema; else the hub id. When
neither can be read, one ``DataUnavailableError`` says what was tried.

Decoded partitions are cached per process (``functools.lru_cache``), so a Ray actor or a
SuperNode decodes each client's images once, not every round.
"""

from __future__ import annotations

import functools
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
        fds = FederatedDataset(dataset="parquet", data_files=files, **common)
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
    if images.ndim == 3:  # greyscale: N x H x W
        images = images[:, None]
    else:  # colour: N x H x W x C
        images = images.transpose(0, 3, 1, 2)
    x = torch.from_numpy(images).float().div_(255.0)
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    x = (x - mean) / std
    y = torch.as_tensor(np.asarray(ds[info.label_column]), dtype=torch.long)
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
        part = federated_dataset(spec).load_partition(partition_id, "train")
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


@functools.lru_cache(maxsize=4)
def load_test(spec: PartitionSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The test split (centralized evaluation), decoded once per process."""
    if spec.dataset == "synthetic":
        from tasks.synthetic import synthetic_test

        return synthetic_test(spec)
    return _to_tensors(federated_dataset(spec).load_split("test"), DATASETS[spec.dataset])
