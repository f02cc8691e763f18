"""Cutting a dataset's training split into client partitions (flwr-datasets partitioners)
and loading a partition or the test split as tensors.

With ``validation-fraction`` > 0 a share of the training split is held out as the
``validation`` split before the rest is partitioned (``HoldOutValidation``): no client trains
on it, and the server scores it instead of the test split (``load_validation_split``), so a
tuning search never looks at the test split.

Local parquet files are decoded once per file into uint8 arrays kept in the cache folder
(``tasks/decoded.py``); every process memory-maps them, and a partition is the partitioner's
index array into them (``_decoded_partition``). Hub data is decoded through ``datasets``; its
decoded partitions are cached per process (``functools.lru_cache``), so a Ray actor or a
SuperNode decodes each client's images once, not every round. A partitioning that passed
``check_data`` is remembered on disk (``tasks/partition_cache.py``).
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np
import torch

from tasks.catalogue import DATASETS
from tasks.datasets import (
    DataUnavailableError,
    HubUnavailableError,
    PartitionError,
    check_columns,
    check_labels,
    local_parquet_files,
    normalise,
    normalise_tensors,
    to_tensors,
)
from tasks.decoded import (
    VALIDATION,
    check_images,
    decoded_labels,
    decoding_enabled,
    split_arrays,
    split_order,
    validation_size,
)
from tasks.feature_noise import with_feature_noise
from tasks.partition_cache import (
    checked_partitioning,
    partitioner_assignment,
    precomputed_partitioner,
    remember_indices,
    remember_partitioning,
    remembered_indices,
)
from tasks.partition_spec import PartitionSpec
from tasks.partitioners import make_partitioner

SIZED = ("quantity", "inner-dirichlet")  # partitioners given client sizes, drawn from the split's row count


def _make_partitioner(spec: PartitionSpec, info):
    """``spec``'s flwr-datasets partitioner (``tasks.partitioners``), or the index assignment a
    passed ``check_data`` kept for it (``remembered_indices``): cutting by labels reads the
    whole label column and, for some partitioners, draws sample by sample."""
    indices = remembered_indices(spec)
    if indices is not None:
        return precomputed_partitioner(indices)
    rows = train_rows(spec) if spec.partitioner in SIZED else 0
    return make_partitioner(spec, info, rows)




class HoldOutValidation:
    """A flwr-datasets preprocessor: after FederatedDataset's seeded shuffle (the run's seed),
    the first ``validation_size`` rows of ``train`` become the ``validation`` split and the
    rest stay ``train``, the split the partitioner cuts. So the validation split is a seeded
    random sample of the training split, disjoint from every client's partition, and never
    touches the test split (a split of another file). flwr-datasets' ``Divider`` does the cut,
    given row counts: with fractions it floors each split apart (a row can be lost) and
    refuses f + (1 - f) when floating point makes it exceed 1."""

    def __init__(self, fraction: float, split: str = VALIDATION):
        self.fraction = fraction
        self.split = split

    def __call__(self, dataset):
        from flwr_datasets.preprocessor import Divider

        rows = len(dataset["train"])
        held = validation_size(rows, self.fraction)
        if held >= rows:
            raise PartitionError(f"{self.split} share {self.fraction} holds out {held} of {rows} training"
                                 " examples: none left to train on; lower validation-fraction")
        return Divider({"train": {self.split: held, "train": rows - held}})(dataset)


class PrepareSplits:
    """The preprocessor of every FederatedDataset, after its seeded shuffle, in this order:

    1. a dataset whose source has no test split (``DatasetInfo.held_out_test``: FEMNIST) gets
       one, its first ``held_out_test`` share of ``train`` (``HoldOutValidation``'s cut), the
       same rows for every partitioning with this seed;
    2. ``validation-fraction`` > 0: the validation split (``HoldOutValidation``);
    3. ``train`` in Arrow format, so a partitioner's ``dataset[label_column]`` reads the column
       in one piece (``datasets`` 4 returns a lazy ``Column`` that NumPy reads row by row: 16 s
       for MNIST's 60,000 labels instead of 1.5 s). The rows and their order are unchanged;
       ``_partition_rows`` hands each partition back in the default format."""

    def __init__(self, held_out_test: float, validation_fraction: float):
        self.held_out_test = held_out_test
        self.validation_fraction = validation_fraction

    def __call__(self, dataset):
        if self.held_out_test > 0:
            dataset = HoldOutValidation(self.held_out_test, "test")(dataset)
        if self.validation_fraction > 0:
            dataset = HoldOutValidation(self.validation_fraction)(dataset)
        dataset["train"] = dataset["train"].with_format("arrow")
        return dataset


def federated_dataset(spec: PartitionSpec):
    """The flwr-datasets FederatedDataset for ``spec``: the data folder's parquet files when a
    folder is set (both splits, else ``DataUnavailableError``), the hub only when none is. One per
    process and version of the files (their sizes and modification times: a file replaced in
    place, under the same path, gets a new one, as the decoded arrays of ``tasks.decoded`` do)."""
    files = local_parquet_files(spec.dataset, spec.data_dir)
    versions = tuple((p, os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in sorted(files.values())) if files else ()
    return _federated_dataset(spec, versions)


@functools.lru_cache(maxsize=4)
def _federated_dataset(spec: PartitionSpec, versions: tuple):
    from flwr_datasets import FederatedDataset

    info = DATASETS[spec.dataset]
    partitioners = {"train": _make_partitioner(spec, info)}
    # shuffle=True with the run seed: the CIFAR-10 parquet rows are grouped by class, and
    # IidPartitioner cuts contiguous blocks.
    common = dict(partitioners=partitioners, shuffle=True, seed=spec.seed,
                  preprocessor=PrepareSplits(info.held_out_test, spec.validation_fraction))
    files = local_parquet_files(spec.dataset, spec.data_dir)
    if files is not None:
        check_columns(files, info, spec.dataset)  # before the datasets library reads them
        try:
            fds = FederatedDataset(dataset="parquet", data_files=files, **common)
            fds.load_split("test")  # reads the files now, so an unreadable one is reported here
        except Exception as exc:  # arrow/datasets raise many types for corrupt files
            raise DataUnavailableError(
                f"cannot read {' / '.join(files.values())} as parquet for dataset "
                f"{spec.dataset!r}: {type(exc).__name__}: {exc}"
            ) from exc
        return fds
    try:
        fds = FederatedDataset(dataset=info.hub_id, **common)
        fds.load_split("test")  # force the download now, so failure is reported here
    except Exception as exc:  # the hub raises many types (ConnectionError, HfHubHTTPError, ...)
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
        raise HubUnavailableError(spec.dataset, info.hub_id, reason) from exc
    return fds


federated_dataset.cache_clear = _federated_dataset.cache_clear  # tests start from a fresh cut
federated_dataset.cache_info = _federated_dataset.cache_info


@functools.lru_cache(maxsize=256)
def load_partition(spec: PartitionSpec, partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``partition_id``'s training data as (x, y) CPU tensors, decoded once per process,
    with the client's feature noise (``noise-sigma``, ``tasks/feature_noise.py``) added."""
    if spec.dataset == "synthetic":
        from tasks.synthetic import synthetic_partition

        _check_partition_id(spec, partition_id)
        return synthetic_partition(spec, partition_id)
    info = DATASETS[spec.dataset]
    decoded = _decoded_partition(spec, partition_id)
    x, y = decoded if decoded is not None else to_tensors(_partition_rows(spec, partition_id), info)
    return with_feature_noise(x, spec, partition_id, info), y


def reads_decoded(spec: PartitionSpec) -> bool:
    """Whether ``spec``'s partitions are read from kept decoded arrays (local parquet files,
    ``FL_DRIFT_DECODED`` not 0), not decoded through ``datasets``."""
    return (spec.dataset != "synthetic" and decoding_enabled()
            and local_parquet_files(spec.dataset, spec.data_dir) is not None)


def _decoded_partition(spec: PartitionSpec, partition_id: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Partition ``partition_id`` of local parquet files from the file's kept decoded arrays
    (``tasks/decoded.py``): the images and labels taken at its rows of the file
    (``_decoded_file_rows``) and normalised as ``to_tensors`` does; the same tensors bit for bit.
    None for hub data (or with ``FL_DRIFT_DECODED=0``, or a partitioner whose indices cannot be
    read): decoded through ``datasets`` then."""
    found = _decoded_file_rows(spec, partition_id)
    return None if found is None else _decoded_rows(spec.dataset, found[0], "train", found[1])


def _decoded_file_rows(spec: PartitionSpec, partition_id: int) -> tuple[str, np.ndarray] | None:
    """(the training split's local parquet file, the rows of it that make partition
    ``partition_id``): the partitioner's indices into the training split, mapped to the file's
    rows (``split_order``). None for hub data (or with ``FL_DRIFT_DECODED=0``, or a partitioner
    whose indices cannot be read); an empty partition refused in one line."""
    if not reads_decoded(spec):
        return None
    files = local_parquet_files(spec.dataset, spec.data_dir)
    _check_partition_id(spec, partition_id)
    positions = _partition_positions(spec, partition_id)
    if positions is None:
        return None
    if len(positions) == 0:
        raise PartitionError(
            f"partition {partition_id} of {spec.num_partitions} ({spec.partitioner}) is empty; "
            "raise min-partition-size, raise alpha or use fewer clients"
        )
    path, order = split_order(spec.dataset, files, spec.seed, spec.validation_fraction, "train")
    return path, order[positions]


def partition_on_split(spec: PartitionSpec, partition_id: int,
                       device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Partition ``partition_id`` gathered from the training file's decoded images held on
    ``device`` (``split_on_device``: copied there once per process) and normalised there: the
    tensors ``load_partition`` gives, bit for bit (the same rows, ``_decoded_file_rows``, and the
    same ``normalise_tensors``), without the host gathering and normalising each partition and
    copying its float32 images over. A partition is then its row indices; a GPU cohort node reads
    any partition of any split size without a cache of partitions. None where ``load_partition``
    must run: hub data, synthetic data, feature noise, a partitioner whose indices cannot be read."""
    found = None if spec.noise_sigma else _decoded_file_rows(spec, partition_id)
    if found is None:
        return None
    path, rows = found
    images, labels = split_on_device(spec.dataset, path, "train", device)
    index = torch.as_tensor(rows, dtype=torch.long).to(device)
    return normalise_tensors(images[index], labels[index], DATASETS[spec.dataset])


@functools.lru_cache(maxsize=2)
def split_on_device(dataset: str, path: str, split: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoded uint8 images and int64 labels of a local parquet file on ``device``, copied
    once per process (CIFAR-10's training images: 150 MB; MNIST's: 47 MB)."""
    images, labels = split_arrays(dataset, path, split)
    return torch.from_numpy(np.ascontiguousarray(images)).to(device), torch.from_numpy(np.asarray(labels)).to(device)


def _decoded_rows(dataset: str, path: str, split: str, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``rows`` (in that order) of the local parquet file ``path`` as normalised tensors,
    from its kept decoded arrays."""
    images, labels = split_arrays(dataset, path, split)
    return normalise(images[rows], labels[rows], DATASETS[dataset])


def _partition_positions(spec: PartitionSpec, partition_id: int) -> np.ndarray | None:
    """The rows of the (prepared) training split that make partition ``partition_id``: the index
    assignment remembered on disk (``remembered_indices``), ``IidPartitioner``'s contiguous
    shard (``Dataset.shard(contiguous=True)``: nothing to remember), else the partitioner's own
    once it has cut (``_partition_rows`` cuts and remembers); None when none can be read."""
    indices = remembered_indices(spec)
    if indices is not None:
        return indices[partition_id]
    if spec.partitioner == "iid":
        div, mod = divmod(train_rows(spec), spec.num_partitions)
        start = div * partition_id + min(partition_id, mod)
        return np.arange(start, start + div + (1 if partition_id < mod else 0))
    _partition_rows(spec, partition_id)  # cuts the split (PartitionError when it cannot)
    fds = federated_dataset(spec)
    assignment = partitioner_assignment(fds.partitioners["train"], fds.load_split("train"))
    if not isinstance(assignment, dict) or partition_id not in assignment:
        return None
    return np.asarray(assignment[partition_id], dtype=np.int64)


@functools.lru_cache(maxsize=256)
def load_client_split(spec: PartitionSpec, partition_id: int, test_fraction: float) -> tuple[tuple, tuple]:
    """((x, y) to train on, (x, y) of the client's local test split): ``test_fraction`` of the
    partition held out by the Hugging Face ``Dataset.train_test_split`` of the flwr-datasets
    partition (seeded by the run's seed, so every method holds out the same examples), the
    training data being the rest, each with the client's feature noise (``noise-sigma``). The
    synthetic dataset's tensors are cut by ``split_tensors``."""
    if spec.dataset == "synthetic":
        return split_tensors(*load_partition(spec, partition_id), test_fraction, spec.seed)
    rows = _partition_rows(spec, partition_id)
    if local_split_sizes(len(rows), test_fraction)[0] < 1:  # check_data refuses it before launch
        raise PartitionError(too_few_for_local_split(partition_id, len(rows), test_fraction)
                             + "; raise min-partition-size or lower client-test-fraction")
    parts = rows.train_test_split(test_size=test_fraction, seed=spec.seed)
    info = DATASETS[spec.dataset]
    (x, y), (x_test, y_test) = to_tensors(parts["train"], info), to_tensors(parts["test"], info)
    return ((with_feature_noise(x, spec, partition_id, info), y),
            (with_feature_noise(x_test, spec, partition_id, info, stream=1), y_test))


def local_split_sizes(rows: int, test_fraction: float) -> tuple[int, int]:
    """(examples trained on, examples held out) of a ``rows``-example partition whose client holds
    ``test_fraction`` of it out as its local test split, as ``load_client_split`` cuts it
    (``Dataset.train_test_split(test_size=test_fraction)``: ceil(test_fraction x rows) held out,
    the rest trained on; it refuses a cut that leaves none to train on)."""
    held = math.ceil(test_fraction * rows) if test_fraction > 0 else 0
    return rows - held, held


def too_few_for_local_split(partition_id: int, rows: int, test_fraction: float, least: int = 1) -> str:
    """'partition 6 has 1 example(s): too few for a local test split (client-test-fraction = 0.5
    holds out 1 and leaves 0 to train on)': the refusal of ``check_local_splits`` and of the
    client (``load_client_split``). ``least``: the fewest examples the client must train on."""
    train, held = local_split_sizes(rows, test_fraction)
    short = f", fewer than the smallest batch the model trains on ({least})" if train and least > 1 else ""
    return (f"partition {partition_id} has {rows} example(s): too few for a local test split (client-test-fraction"
            f" = {test_fraction} holds out {held} and leaves {train} to train on{short})")


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
    """The flwr-datasets partition (a Hugging Face Dataset, in the default format) of a hub or
    local-parquet dataset."""
    _check_partition_id(spec, partition_id)
    try:
        fds = federated_dataset(spec)
        part = fds.load_partition(partition_id, "train").with_format(None)
        remember_indices(spec, fds.partitioners["train"], fds.load_split("train"))  # the next process reads it
    except (DataUnavailableError, PartitionError):
        raise
    except Exception as exc:  # flwr-datasets raises ValueError for impossible partitionings
        raise PartitionError(f"cannot cut {spec.dataset!r} into {spec.num_partitions} {cut(spec)}: {exc}") from exc
    if len(part) == 0:
        raise PartitionError(
            f"partition {partition_id} of {spec.num_partitions} ({spec.partitioner}) is empty; "
            "raise min-partition-size, raise alpha or use fewer clients"
        )
    return part


def cut(spec: PartitionSpec) -> str:
    """``spec``'s partitioning in words: 'dirichlet partitions (alpha=0.3, min-partition-size=10)'."""
    return f"{spec.partitioner} partitions ({settings(spec)})"


def settings(spec: PartitionSpec) -> str:
    """The keys ``spec``'s partitioner reads: 'alpha=0.3, min-partition-size=10'."""
    keys = {k: v for k, v in spec.identity().items() if k not in ("dataset", "num-partitions", "seed", "partitioner")}
    return ", ".join(f"{k}={v}" for k, v in keys.items())


def label_column(ds, column: str) -> np.ndarray:
    """A Hugging Face Dataset's column as a NumPy array, read in one piece (Arrow)."""
    return np.asarray(ds.with_format("arrow")[column])


def partition_label_counts(spec: PartitionSpec) -> np.ndarray:
    """Every client's training labels counted per class: an int array of shape (clients,
    classes), row k = partition k as the clients load it (the same flwr-datasets partitioner
    and seed), read from the label column only (no image is decoded)."""
    if spec.dataset == "synthetic":
        raise PartitionError("the synthetic dataset has no label classes to count; label mixes need an image dataset")
    info = DATASETS[spec.dataset]
    counts = np.zeros((spec.num_partitions, info.shape.classes), dtype=np.int64)
    for pid in range(spec.num_partitions):
        labels = label_column(_partition_rows(spec, pid), info.label_column).astype(np.int64)
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
    files = local_parquet_files(dataset, data_dir)
    if files is not None and decoding_enabled():  # the kept decoded arrays (tasks/decoded.py)
        path, rows = split_order(dataset, files, seed, 0.0, "test")
        return _decoded_rows(dataset, path, "test" if path == files.get("test") else "train", rows)
    source = PartitionSpec(dataset=dataset, num_partitions=1, partitioner="iid", seed=seed, data_dir=data_dir)
    return to_tensors(federated_dataset(source).load_split("test"), DATASETS[dataset])


@functools.lru_cache(maxsize=4)
def load_validation_split(dataset: str, data_dir: str, seed: int, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation split held out of the training split (``HoldOutValidation``), decoded:
    the same rows for every partitioning with this dataset, data, seed and fraction (the
    shuffle is the run seed's), so the server loads it before it knows the partition count."""
    if dataset not in DATASETS:
        raise DataUnavailableError(f"unknown dataset {dataset!r}; valid choices: {', '.join(DATASETS)}")
    files = local_parquet_files(dataset, data_dir)
    if files is not None and decoding_enabled():  # the kept decoded arrays (tasks/decoded.py)
        path, rows = split_order(dataset, files, seed, fraction, VALIDATION)
        return _decoded_rows(dataset, path, "train", rows)
    source = PartitionSpec(dataset=dataset, num_partitions=1, partitioner="iid", seed=seed, data_dir=data_dir,
                           validation_fraction=fraction)
    return to_tensors(federated_dataset(source).load_split(VALIDATION), DATASETS[dataset])


def train_rows(spec: PartitionSpec) -> int:
    """Rows of the training split the partitioner cuts (local files: from the parquet footer,
    nothing decoded), the held-out test split (``DatasetInfo.held_out_test``) and the
    validation split (``validation-fraction``) taken out, as ``PrepareSplits`` cuts them."""
    rows = _all_train_rows(spec)
    return rows - validation_size(rows, spec.validation_fraction)


def _all_train_rows(spec: PartitionSpec) -> int:
    """Rows of the training split less a held-out test split (``PrepareSplits`` step 1)."""
    files = local_parquet_files(spec.dataset, spec.data_dir)
    if files is not None:
        import pyarrow.parquet as pq

        try:
            rows = pq.read_metadata(files["train"]).num_rows
        except Exception as exc:  # ArrowInvalid, OSError, ...
            raise DataUnavailableError(f"cannot read {files['train']} as parquet: {type(exc).__name__}: {exc}") from exc
        return rows - validation_size(rows, DATASETS[spec.dataset].held_out_test)
    source = PartitionSpec(dataset=spec.dataset, num_partitions=1, partitioner="iid", seed=spec.seed,
                           data_dir=spec.data_dir)
    return federated_dataset(source).load_split("train").num_rows


def check_partition_count(spec: PartitionSpec) -> None:
    """Refuse, before any partition is cut or any node is asked, a federation larger than the
    training split can be cut into: each Dirichlet or quantity partition needs
    ``min-partition-size`` samples, each shard partition ``shards-per-client`` shards of at
    least one sample, each other partition one sample; natural partitions are exactly one per
    natural id (``check_natural_count``). (The synthetic dataset is generated per device: no limit.)"""
    if spec.dataset == "synthetic":
        return
    if spec.partitioner == "natural":
        return check_natural_count(spec)
    rows = train_rows(spec)
    unit = {"dirichlet": spec.min_partition_size, "quantity": spec.min_partition_size,
            "shard": spec.shards_per_client}.get(spec.partitioner, 1)
    limit = rows // max(1, unit)
    if spec.num_partitions > limit:
        raise PartitionError(
            f"{spec.num_partitions} partitions requested (one per SuperNode) but {spec.dataset!r} has only {rows}"
            f" training samples: at most {limit} {cut(spec)}; use fewer SuperNodes"
            f" (flwr run: --federation-config num-supernodes=N; run_simulation.py: --clients N)")


def check_natural_count(spec: PartitionSpec) -> None:
    """Natural partitions are one per distinct natural id of the training split (FEMNIST: one
    per writer, never split nor merged), so the federation must have exactly that many clients."""
    column = DATASETS[spec.dataset].natural_id_column
    ids = len(federated_dataset(spec).load_split("train").unique(column))
    if spec.num_partitions != ids:
        raise PartitionError(
            f"{spec.num_partitions} partitions requested (one per SuperNode) but {spec.dataset!r}'s training split"
            f" has {ids} distinct {column!r} values: natural partitions are one per {column}; use {ids} SuperNodes"
            f" (flwr run: --federation-config num-supernodes={ids}; run_simulation.py: --clients {ids})")


def check_data(spec: PartitionSpec, min_size: int = 1, test_fraction: float = 0.0) -> None:
    """Fail fast, before any training, on a missing source, wrong columns, labels outside the
    dataset's classes (local files, ``check_labels``: checked every time, it reads one column),
    a partitioning that leaves a client with fewer than ``min_size`` examples (at least one;
    the runner and the server pass the smallest batch the run's model trains on,
    ``tasks.train.min_batch_of``), naming the client and its size, or, with a local test split
    (``test_fraction``: the run's ``client-test-fraction``), fewer than that left to train on
    (``check_local_splits``); then, for local files, on an image that cannot be decoded
    (``tasks.decoded.check_images``: every image decoded once per file and kept, seconds for
    MNIST the first time, a header read after). Cutting the partitions reads the label column
    (a second or two for MNIST); a partitioning of local files that passed once is remembered on
    disk (``checked_partitioning``), so the server does not redo the runner's check."""
    if spec.dataset == "synthetic":
        return
    files = local_parquet_files(spec.dataset, spec.data_dir)
    if files is not None:
        check_labels(spec.dataset, files)
    sizes = checked_partitioning(spec)
    if sizes is None:
        check_partition_count(spec)
        fds = federated_dataset(spec)
        try:
            sizes = [len(fds.load_partition(i, "train")) for i in range(spec.num_partitions)]
        except Exception as exc:
            raise PartitionError(f"cannot cut {spec.dataset!r} into {spec.num_partitions} {cut(spec)}: {exc}") from exc
        check_sizes(spec, sizes, 1)
        if files is not None and decoding_enabled():
            check_split_order(spec, fds, files)
        remember_partitioning(spec, sizes, fds.partitioners["train"], fds.load_split("train"))
    check_sizes(spec, sizes, min_size)
    check_local_splits(spec, sizes, test_fraction, min_size)
    if files is not None:  # last: the first check of a file decodes all of it
        check_images(spec.dataset, files)


def check_split_order(spec: PartitionSpec, fds, files: dict[str, str]) -> None:
    """The decoded path's map from the training split's rows to the file's (``split_order``)
    must be the one flwr-datasets made: the labels read along it equal the split's label column
    (read in Arrow, milliseconds), else ``DataUnavailableError``: a ``datasets`` or NumPy whose
    shuffle differs would give clients other rows than decoding through ``datasets``. Checked
    once per partitioning (with the partition sizes, which the cache key pins to those versions)."""
    info = DATASETS[spec.dataset]
    path, order = split_order(spec.dataset, files, spec.seed, spec.validation_fraction, "train")
    want = label_column(fds.load_split("train"), info.label_column)
    if not np.array_equal(decoded_labels(spec.dataset, path)[order], want):
        raise DataUnavailableError(
            f"{path}: the rows of the shuffled training split (seed {spec.seed}) are not where tasks/decoded.py"
            " expects them (a datasets or NumPy version that shuffles otherwise); set FL_DRIFT_DECODED=0 to"
            " decode through datasets")


def check_local_splits(spec: PartitionSpec, sizes: list[int], test_fraction: float, min_size: int = 1) -> None:
    """With ``test_fraction`` > 0 each client holds that share of its partition out as its local
    test split (``load_client_split``) and trains on the rest, which must hold at least
    ``min_size`` examples (and one): ``PartitionError`` naming the smallest such partition, its
    size and the keys, from the partition sizes alone (nothing read)."""
    if test_fraction <= 0:
        return
    least = max(1, min_size)
    small = [i for i, n in enumerate(sizes) if local_split_sizes(n, test_fraction)[0] < least]
    if not small:
        return
    worst = min(small, key=lambda i: sizes[i])
    raise PartitionError(
        f"{too_few_for_local_split(worst, sizes[worst], test_fraction, least)}: {len(small)} of"
        f" {spec.num_partitions} {spec.partitioner} partitions too small ({settings(spec)}); raise"
        " min-partition-size, lower client-test-fraction or use fewer clients")


def check_sizes(spec: PartitionSpec, sizes: list[int], min_size: int) -> None:
    """``PartitionError`` naming the smallest client when any has fewer than ``min_size`` (at
    least one) examples: 'client 3 has 0 example(s): 2 of 10 iid partitions are empty ...'."""
    least = max(1, min_size)
    small = [i for i, n in enumerate(sizes) if n < least]
    if not small:
        return
    worst = min(small, key=lambda i: sizes[i])
    what = "are empty" if least == 1 else f"have fewer examples than the smallest batch the model trains on ({least})"
    raise PartitionError(
        f"client {worst} (partition {worst}) has {sizes[worst]} example(s): {len(small)} of {spec.num_partitions}"
        f" {spec.partitioner} partitions {what} ({settings(spec)}); raise min-partition-size, alpha or"
        " classes-per-client, or use fewer clients")
