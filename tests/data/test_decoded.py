"""Local parquet data read from the kept decoded arrays (tasks/decoded.py: each file decoded once
into a uint8 array, its labels beside it, both memory-mapped; a partition an index array into
them) gives exactly the tensors of decoding through ``datasets`` (``FL_DRIFT_DECODED=0``): the
same rows in the same order, the same normalisation, bit for bit, for partitions of several
partitioners, the test split and the validation split. Small samples of the real files
(``mnist_sample``; a CIFAR-10 sample written here), so each check takes about a second."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks import partitioning
from tasks.decoded import split_order
from tasks.partitioning import PartitionSpec, federated_dataset, load_partition, load_test, load_validation_split


def forget(monkeypatch, decoded: bool) -> None:
    """A fresh process's view: no partitioning built, no test split loaded, and the path chosen."""
    federated_dataset.cache_clear()
    partitioning.load_test_split.cache_clear()
    partitioning.load_validation_split.cache_clear()
    monkeypatch.setenv("FL_DRIFT_DECODED", "1" if decoded else "0")


def both_paths(monkeypatch, tmp_path_factory, load, decoded_first: bool = False):
    """(``load()`` from the decoded arrays, ``load()`` through ``datasets``: the reference), in
    that order with ``decoded_first`` (the decoded path then cuts the split itself). The
    reference starts from an empty cache folder: the partitioner's own cut, nothing remembered."""
    out = {}
    for decoded in ((True, False) if decoded_first else (False, True)):
        forget(monkeypatch, decoded)
        with monkeypatch.context() as m:
            if decoded:  # nothing decoded through datasets on this path
                m.setattr(partitioning, "to_tensors", lambda *a: pytest.fail("decoded through datasets"))
            else:
                m.setenv("FL_DRIFT_CACHE", str(tmp_path_factory.mktemp("fresh-cache")))
            out[decoded] = load()
    federated_dataset.cache_clear()
    return out[True], out[False]


def assert_identical(got, want) -> None:
    (x, y), (want_x, want_y) = got, want
    assert x.dtype == want_x.dtype == torch.float32 and y.dtype == want_y.dtype == torch.long
    assert x.shape == want_x.shape and x.is_contiguous()
    assert torch.equal(x, want_x) and torch.equal(y, want_y)


SPLITS = [("dirichlet", {"alpha": 0.3}), ("iid", {}), ("shard", {"shards-per-client": 2}),
          ("pathological", {"classes-per-client": 2}), ("quantity", {"alpha": 1.0}),
          ("dirichlet", {"alpha": 0.5, "validation-fraction": 0.1})]


def spec_of(data, partitioner: str, keys: dict, dataset: str = "mnist", clients: int = 10) -> PartitionSpec:
    from fl_app.registry import validate_config

    cfg = validate_config({"dataset": dataset, "data-dir": str(data), "seed": 4, "partitioner": partitioner,
                           "min-partition-size": 5, **keys})
    return PartitionSpec.from_config(cfg, clients)


@pytest.mark.parametrize("partitioner,keys", SPLITS, ids=[f"{p}{'-val' if 'validation-fraction' in k else ''}"
                                                          for p, k in SPLITS])
def test_decoded_partitions_equal_decoding_through_datasets(monkeypatch, tmp_path_factory, mnist_sample,
                                                             partitioner, keys):
    spec = spec_of(mnist_sample(2000, 300), partitioner, keys)
    for partition in (0, 3, 9):  # partition 0 cut by the decoded path, 3 and 9 from the kept assignment
        assert_identical(*both_paths(monkeypatch, tmp_path_factory, lambda p=partition: load_partition(spec, p),
                                     decoded_first=True))


@pytest.mark.parametrize("partitioner,keys", [("dirichlet", {"alpha": 0.3}), ("shard", {"shards-per-client": 2})])
def test_later_processes_read_the_remembered_assignment(monkeypatch, tmp_path, mnist_sample, partitioner, keys):
    """A later process reads the index assignment the first one kept, and gets the rows the
    partitioner's own cut gave, through ``datasets`` and from the decoded arrays alike (a shard
    partitioner cuts a label-sorted copy: its indices are kept as rows of the unsorted split)."""
    spec = spec_of(mnist_sample(2000, 300), partitioner, keys)
    monkeypatch.setenv("FL_DRIFT_CACHE", str(tmp_path))
    forget(monkeypatch, decoded=False)
    want = [load_partition(spec, p) for p in (1, 7)]  # the partitioner's own cut
    assert list((tmp_path / "partitions").glob("*.npz"))  # the cut kept its assignment
    for decoded in (False, True):
        forget(monkeypatch, decoded)
        with monkeypatch.context() as m:
            m.setattr(partitioning, "_partition_rows" if decoded else "make_partitioner",
                      lambda *a: pytest.fail("cut again"))
            for p, w in zip((1, 7), want):
                assert_identical(load_partition(spec, p), w)
    assert len(np.unique(want[0][1].numpy())) <= 4 or partitioner != "shard"  # 2 shards: few labels


def test_decoded_test_and_validation_splits_equal_decoding_through_datasets(monkeypatch, tmp_path_factory,
                                                                          mnist_sample):
    data = mnist_sample(2000, 300)
    spec = spec_of(data, "iid", {})
    assert_identical(*both_paths(monkeypatch, tmp_path_factory, lambda: load_test(spec)))
    assert_identical(*both_paths(monkeypatch, tmp_path_factory,
                                 lambda: load_validation_split("mnist", str(data), 4, 0.1)))


def test_decoded_cifar10_equals_decoding_through_datasets(monkeypatch, tmp_path_factory, shared_data, tmp_path):
    """Colour images (N x H x W x 3 kept, NCHW out), on a 600 / 100-row sample of CIFAR-10."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not (shared_data / "cifar10" / "train.parquet").exists():
        pytest.skip(f"no cifar10 in {shared_data}")
    (tmp_path / "cifar10").mkdir()
    for split, rows in (("train", 600), ("test", 100)):
        source = pq.ParquetFile(shared_data / "cifar10" / f"{split}.parquet")
        pq.write_table(pa.Table.from_batches([next(source.iter_batches(batch_size=rows))]), tmp_path / "cifar10" / f"{split}.parquet")
    spec = spec_of(tmp_path, "dirichlet", {"alpha": 0.5}, dataset="cifar10", clients=5)
    for partition in (0, 4):
        got, want = both_paths(monkeypatch, tmp_path_factory, lambda p=partition: load_partition(spec, p))
        assert got[0].shape[1] == 3
        assert_identical(got, want)
    assert_identical(*both_paths(monkeypatch, tmp_path_factory, lambda: load_test(spec)))


def test_split_order_is_the_shuffled_splits_rows(mnist_sample):
    """Row i of each split FederatedDataset presents is row ``order[i]`` of the file: the labels
    read along the order equal the split's label column."""
    import pyarrow.parquet as pq

    data = mnist_sample(2000, 300)
    spec = spec_of(data, "iid", {"validation-fraction": 0.2})
    fds = federated_dataset(spec)
    files = {s: str(data / "mnist" / f"{s}.parquet") for s in ("train", "test")}
    for split in ("train", "test", "validation"):
        path, order = split_order("mnist", files, spec.seed, 0.2, split)
        labels = pq.read_table(path, columns=["label"]).column(0).to_numpy()
        assert np.array_equal(labels[order], np.asarray(fds.load_split(split).with_format("arrow")["label"]))


@pytest.mark.parametrize("partitioner,keys", [("shard", {"shards-per-client": 2}), ("dirichlet", {"alpha": 0.3}),
                                              ("pathological", {"classes-per-client": 2})])
def test_kept_assignment_names_rows_of_the_split_the_partitioner_was_given(monkeypatch, tmp_path, mnist_sample,
                                                                          partitioner, keys):
    """What ``partition_cache`` keeps are rows of the prepared training split: selected from it
    they are each partition the partitioner served, in order (``ShardPartitioner`` indexes a
    label-sorted copy: kept as is, its clients would later get rows of every label)."""
    from tasks.partition_cache import partitioner_assignment

    monkeypatch.setenv("FL_DRIFT_CACHE", str(tmp_path))  # nothing remembered: the partitioner cuts
    federated_dataset.cache_clear()
    fds = federated_dataset(spec_of(mnist_sample(2000, 300), partitioner, keys, clients=10))
    served = {p: np.asarray(fds.load_partition(p, "train").with_format("arrow")["label"]) for p in (0, 5)}
    split = fds.load_split("train")
    kept = partitioner_assignment(fds.partitioners["train"], split)
    labels = np.asarray(split.with_format("arrow")["label"])
    for p, want in served.items():
        assert np.array_equal(labels[np.asarray(kept[p])], want)


@pytest.mark.parametrize("partitioner,keys", [("dirichlet", {"alpha": 0.3}), ("iid", {}),
                                              ("dirichlet", {"alpha": 0.5, "validation-fraction": 0.1})])
def test_a_partition_gathered_from_the_split_on_the_device_equals_load_partition(monkeypatch, mnist_sample,
                                                                                 partitioner, keys):
    """What a GPU node reads (``partition_on_split``: the training file's uint8 images held on
    the device, a partition gathered and normalised there) is ``load_partition``'s tensors bit
    for bit; here the device is the CPU (the same function, the same elementwise float32 ops)."""
    spec = spec_of(mnist_sample(2000, 300), partitioner, keys)
    forget(monkeypatch, decoded=True)
    for partition in (0, 3, 9):
        assert_identical(partitioning.partition_on_split(spec, partition, torch.device("cpu")),
                         load_partition(spec, partition))
    noisy = spec_of(mnist_sample(2000, 300), partitioner, {**keys, "noise-sigma": 0.1})
    assert partitioning.partition_on_split(noisy, 0, torch.device("cpu")) is None  # the host adds its noise


def test_a_cifar10_partition_gathered_on_the_device_equals_load_partition(monkeypatch, shared_data, tmp_path):
    """Colour images: N x H x W x 3 held, NCHW out, as ``load_partition``'s."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not (shared_data / "cifar10" / "train.parquet").exists():
        pytest.skip(f"no cifar10 in {shared_data}")
    (tmp_path / "cifar10").mkdir()
    for split, rows in (("train", 600), ("test", 100)):
        source = pq.ParquetFile(shared_data / "cifar10" / f"{split}.parquet")
        pq.write_table(pa.Table.from_batches([next(source.iter_batches(batch_size=rows))]),
                       tmp_path / "cifar10" / f"{split}.parquet")
    spec = spec_of(tmp_path, "dirichlet", {"alpha": 0.5}, dataset="cifar10", clients=5)
    forget(monkeypatch, decoded=True)
    for partition in (0, 4):
        got = partitioning.partition_on_split(spec, partition, torch.device("cpu"))
        assert got[0].shape[1] == 3
        assert_identical(got, load_partition(spec, partition))
