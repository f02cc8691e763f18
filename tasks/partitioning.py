"""Cutting a dataset's training split into client partitions (flwr-datasets partitioners)
and loading a partition or the test split as tensors.

With ``validation-fraction`` > 0 a share of the training split is held out as the
``validation`` split before the rest is partitioned (``HoldOutValidation``): no client trains
on it, and the server scores it instead of the test split (``load_validation_split``), so a
tuning search never looks at the test split.

Decoded partitions are cached per process (``functools.lru_cache``), so a Ray actor or a
SuperNode decodes each client's images once, not every round. A partitioning that passed
``check_data`` is remembered on disk (``tasks/partition_cache.py``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from tasks.catalogue import DATASETS
from tasks.datasets import (
    DataUnavailableError,
    HubUnavailableError,
    PartitionError,
    check_columns,
    local_parquet_files,
    to_tensors,
)
from tasks.partition_cache import (
    checked_partitioning,
    precomputed_partitioner,
    remember_indices,
    remember_partitioning,
    remembered_indices,
)
from tasks.partition_spec import PartitionSpec


def _make_partitioner(spec: PartitionSpec, label_column: str):
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        ShardPartitioner,
    )

    if spec.partitioner == "dirichlet":
        indices = remembered_indices(spec)
        if indices is not None:
            return precomputed_partitioner(indices)
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


VALIDATION = "validation"  # the split held out of the training split (validation-fraction)


def validation_size(rows: int, fraction: float) -> int:
    """Examples of a ``rows``-row training split held out as the validation split:
    floor(fraction x rows), at least one when ``fraction`` > 0, none at 0."""
    return max(1, int(fraction * rows)) if fraction > 0 else 0


class HoldOutValidation:
    """A flwr-datasets preprocessor: after FederatedDataset's seeded shuffle (the run's seed),
    the first ``validation_size`` rows of ``train`` become the ``validation`` split and the
    rest stay ``train``, the split the partitioner cuts. So the validation split is a seeded
    random sample of the training split, disjoint from every client's partition, and never
    touches the test split (a split of another file). flwr-datasets' ``Divider`` does the cut,
    given row counts: with fractions it floors each split apart (a row can be lost) and
    refuses f + (1 - f) when floating point makes it exceed 1."""

    def __init__(self, fraction: float):
        self.fraction = fraction

    def __call__(self, dataset):
        from flwr_datasets.preprocessor import Divider

        rows = len(dataset["train"])
        held = validation_size(rows, self.fraction)
        if held >= rows:
            raise PartitionError(f"validation-fraction = {self.fraction} holds out {held} of {rows} training"
                                 " examples: none left to train on; lower it")
        return Divider({"train": {VALIDATION: held, "train": rows - held}})(dataset)


@functools.lru_cache(maxsize=4)
def federated_dataset(spec: PartitionSpec):
    """The flwr-datasets FederatedDataset for ``spec``: the data folder's parquet files when a
    folder is set (both splits, else ``DataUnavailableError``), the hub only when none is."""
    from flwr_datasets import FederatedDataset

    info = DATASETS[spec.dataset]
    partitioners = {"train": _make_partitioner(spec, info.label_column)}
    # shuffle=True with the run seed: the CIFAR-10 parquet rows are grouped by class, and
    # IidPartitioner cuts contiguous blocks.
    common = dict(partitioners=partitioners, shuffle=True, seed=spec.seed)
    if spec.validation_fraction > 0:
        common["preprocessor"] = HoldOutValidation(spec.validation_fraction)
    files = local_parquet_files(spec.dataset, spec.data_dir)
    if files is not None:
        try:
            fds = FederatedDataset(dataset="parquet", data_files=files, **common)
            fds.load_split("test")  # reads the files now, so an unreadable one is reported here
        except Exception as exc:  # arrow/datasets raise many types for corrupt files
            raise DataUnavailableError(
                f"cannot read {files['train']} / {files['test']} as parquet for dataset "
                f"{spec.dataset!r}: {type(exc).__name__}: {exc}"
            ) from exc
        check_columns(fds, info, files["train"])
        return fds
    try:
        fds = FederatedDataset(dataset=info.hub_id, **common)
        fds.load_split("test")  # force the download now, so failure is reported here
    except Exception as exc:  # the hub raises many types (ConnectionError, HfHubHTTPError, ...)
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
        raise HubUnavailableError(spec.dataset, info.hub_id, reason) from exc
    return fds


@functools.lru_cache(maxsize=256)
def load_partition(spec: PartitionSpec, partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``partition_id``'s training data as (x, y) CPU tensors, decoded once per process."""
    if spec.dataset == "synthetic":
        from tasks.synthetic import synthetic_partition

        _check_partition_id(spec, partition_id)
        return synthetic_partition(spec, partition_id)
    return to_tensors(_partition_rows(spec, partition_id), DATASETS[spec.dataset])


@functools.lru_cache(maxsize=256)
def load_client_split(spec: PartitionSpec, partition_id: int, test_fraction: float) -> tuple[tuple, tuple]:
    """((x, y) to train on, (x, y) of the client's local test split): ``test_fraction`` of the
    partition held out by the Hugging Face ``Dataset.train_test_split`` of the flwr-datasets
    partition (seeded by the run's seed, so every method holds out the same examples), the
    training data being the rest. The synthetic dataset's tensors are cut by ``split_tensors``."""
    if spec.dataset == "synthetic":
        return split_tensors(*load_partition(spec, partition_id), test_fraction, spec.seed)
    rows = _partition_rows(spec, partition_id)
    if len(rows) < 2:
        raise PartitionError(f"partition {partition_id} has {len(rows)} example(s): too few for a local test "
                             f"split (client-test-fraction = {test_fraction}); raise min-partition-size")
    parts = rows.train_test_split(test_size=test_fraction, seed=spec.seed)
    info = DATASETS[spec.dataset]
    return to_tensors(parts["train"], info), to_tensors(parts["test"], info)


def split_tensors(x: torch.Tensor, y: torch.Tensor, test_fraction: float, seed: int) -> tuple[tuple, tuple]:
    """((x, y) train, (x, y) test): a seeded random ceil(test_fraction * n) examples held out
    (at least one, and at least one left to train on), for data that is already tensors."""
    n = len(y)
    if n < 2:
        raise PartitionError(f"{n} example(s): too few for a local test split (client-test-fraction = "
                             f"{test_fraction})")
    n_test = min(max(1, math.ceil(test_fraction * n)), n - 1)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def _check_partition_id(spec: PartitionSpec, partition_id: int) -> None:
    if not 0 <= partition_id < spec.num_partitions:
        raise PartitionError(
            f"partition-id {partition_id} is out of range for num-partitions {spec.num_partitions}"
        )


def _partition_rows(spec: PartitionSpec, partition_id: int):
    """The flwr-datasets partition (a Hugging Face Dataset) of a hub or local-parquet dataset."""
    _check_partition_id(spec, partition_id)
    try:
        fds = federated_dataset(spec)
        part = fds.load_partition(partition_id, "train")
        remember_indices(spec, fds.partitioners["train"])  # the next process on this node reads it
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
    return part


def partition_label_counts(spec: PartitionSpec) -> np.ndarray:
    """Every client's training labels counted per class: an int array of shape (clients,
    classes), row k = partition k as the clients load it (the same flwr-datasets partitioner
    and seed), read from the label column only (no image is decoded)."""
    if spec.dataset == "synthetic":
        raise PartitionError("the synthetic dataset has no label classes to count; label mixes need an image dataset")
    info = DATASETS[spec.dataset]
    counts = np.zeros((spec.num_partitions, info.shape.classes), dtype=np.int64)
    for pid in range(spec.num_partitions):
        labels = np.asarray(_partition_rows(spec, pid)[info.label_column], dtype=np.int64)
        counts[pid] = np.bincount(labels, minlength=info.shape.classes)
    return counts


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
    return to_tensors(federated_dataset(source).load_split("test"), DATASETS[dataset])


@functools.lru_cache(maxsize=4)
def load_validation_split(dataset: str, data_dir: str, seed: int, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation split held out of the training split (``HoldOutValidation``), decoded:
    the same rows for every partitioning with this dataset, data, seed and fraction (the
    shuffle is the run seed's), so the server loads it before it knows the partition count."""
    if dataset not in DATASETS:
        raise DataUnavailableError(f"unknown dataset {dataset!r}; valid choices: {', '.join(DATASETS)}")
    source = PartitionSpec(dataset=dataset, num_partitions=1, partitioner="iid", seed=seed, data_dir=data_dir,
                           validation_fraction=fraction)
    return to_tensors(federated_dataset(source).load_split(VALIDATION), DATASETS[dataset])


def train_rows(spec: PartitionSpec) -> int:
    """Rows of the training split the partitioner cuts (local files: from the parquet footer,
    nothing decoded), the validation split (``validation-fraction``) taken out."""
    rows = _all_train_rows(spec)
    return rows - validation_size(rows, spec.validation_fraction)


def _all_train_rows(spec: PartitionSpec) -> int:
    files = local_parquet_files(spec.dataset, spec.data_dir)
    if files is not None:
        import pyarrow.parquet as pq

        try:
            return pq.read_metadata(files["train"]).num_rows
        except Exception as exc:  # ArrowInvalid, OSError, ...
            raise DataUnavailableError(f"cannot read {files['train']} as parquet: {type(exc).__name__}: {exc}") from exc
    source = PartitionSpec(dataset=spec.dataset, num_partitions=1, partitioner="iid", seed=spec.seed,
                           data_dir=spec.data_dir)
    return federated_dataset(source).load_split("train").num_rows


def check_partition_count(spec: PartitionSpec) -> None:
    """Refuse, before any partition is cut or any node is asked, a federation larger than the
    training split can be cut into: each Dirichlet partition needs ``min-partition-size``
    samples, each shard partition ``shards-per-client`` shards of at least one sample, each IID
    partition one sample. (The synthetic dataset is generated per device: no limit.)"""
    if spec.dataset == "synthetic":
        return
    rows = train_rows(spec)
    unit = {"dirichlet": spec.min_partition_size, "shard": spec.shards_per_client}.get(spec.partitioner, 1)
    limit = rows // max(1, unit)
    if spec.num_partitions > limit:
        raise PartitionError(
            f"{spec.num_partitions} partitions requested (one per SuperNode) but {spec.dataset!r} has only {rows}"
            f" training samples: at most {limit} {spec.partitioner} partitions (min-partition-size"
            f" {spec.min_partition_size}, shards-per-client {spec.shards_per_client}); use fewer SuperNodes"
            f" (flwr run: --federation-config num-supernodes=N; run_simulation.py: --clients N)")


def check_data(spec: PartitionSpec) -> None:
    """Fail fast, before any training, on a missing source, wrong columns, or a partitioning
    that leaves a client without data. Nothing is decoded, but cutting the partitions takes
    about a second (Dirichlet); a partitioning of local files that passed once is remembered
    on disk (``checked_partitioning``), so the server does not redo the runner's check."""
    if spec.dataset == "synthetic":
        return
    if checked_partitioning(spec) is not None:
        return
    check_partition_count(spec)
    fds = federated_dataset(spec)
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
    remember_partitioning(spec, sizes, fds.partitioners["train"])
