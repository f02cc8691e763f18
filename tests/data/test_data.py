"""Data: partition determinism, source fallback and its error, synthetic data."""


import numpy as np
import pytest
import torch

from tasks.datasets import DataUnavailableError, PartitionError
from tasks.partitioning import PartitionSpec, load_partition, load_test
from tasks.synthetic import synthetic_partition


def spec(data_dir, **kw):
    base = dict(dataset="mnist", num_partitions=20, partitioner="dirichlet", alpha=0.3,
                min_partition_size=10, seed=0, data_dir=str(data_dir))
    return PartitionSpec(**{**base, **kw})


def labels(s, pid):
    return load_partition(s, pid)[1].numpy()


def test_dirichlet_partitions_are_deterministic_and_seeded(shared_data):
    a = spec(shared_data)
    # equal but distinct spec objects: a second FederatedDataset is built from scratch
    b = spec(str(shared_data) + "/")
    assert a != b
    for pid in (0, 7):
        np.testing.assert_array_equal(labels(a, pid), labels(b, pid))
    c = spec(shared_data, seed=1)
    assert not np.array_equal(labels(a, 0), labels(c, 0))


def test_partition_shapes_normalised_and_non_iid(shared_data):
    s = spec(shared_data, alpha=0.1)
    x, y = load_partition(s, 3)
    assert x.shape[1:] == (1, 28, 28) and x.dtype == torch.float32 and len(x) == len(y) >= 10
    assert abs(float(x.mean())) < 2.0
    counts = np.bincount(y.numpy(), minlength=10) / len(y)
    assert counts.max() > 0.3  # alpha = 0.1 concentrates labels


def test_shard_and_iid_partitioners(shared_data):
    shard = spec(shared_data, partitioner="shard", shards_per_client=2, num_partitions=10)
    y = labels(shard, 0)
    assert len(np.unique(y)) <= 4  # 2 shards of a label-sorted set cover few classes
    iid = spec(shared_data, partitioner="iid", num_partitions=10)
    assert len(np.unique(labels(iid, 0))) == 10 and len(labels(iid, 0)) == 6000


def test_test_split_is_full(shared_data):
    x, y = load_test(spec(shared_data))
    assert x.shape == (10000, 1, 28, 28) and y.shape == (10000,)


def test_missing_source_error_says_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataUnavailableError) as err:
        load_partition(spec(tmp_path / "nowhere", dataset="fashion_mnist"), 0)
    msg = str(err.value)
    assert "nowhere" in msg and "fashion_mnist/train.parquet" in msg
    assert "zalando-datasets/fashion_mnist" in msg and "FL_DATA_DIR" in msg


def test_env_var_is_the_fallback_for_data_dir(shared_data, monkeypatch):
    from tasks.datasets import resolve_data_dir

    monkeypatch.setenv("FL_DATA_DIR", str(shared_data))
    assert resolve_data_dir("") == str(shared_data.resolve())
    assert resolve_data_dir("/elsewhere") == "/elsewhere"


def test_partition_id_out_of_range(shared_data):
    with pytest.raises(PartitionError, match="out of range"):
        load_partition(spec(shared_data, num_partitions=4), 4)


def test_synthetic_is_deterministic_and_heterogeneous():
    s = PartitionSpec(dataset="synthetic", num_partitions=5, seed=3, synthetic_alpha=1.0, synthetic_beta=1.0)
    x0, y0 = synthetic_partition(s, 0)
    x0b, y0b = synthetic_partition(s, 0)
    assert torch.equal(x0, x0b) and torch.equal(y0, y0b)
    x1, _ = synthetic_partition(s, 1)
    assert x0.shape[1] == 60 and not torch.allclose(x0.mean(0), x1.mean(0), atol=0.1)
    xt, yt = load_test(s)
    assert len(xt) > 0 and yt.max() < 10
