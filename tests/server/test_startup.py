"""Start-up work that overlaps: the server's test-split prefetch and the clients' warm-up."""

from __future__ import annotations

import threading

import pytest
import torch
from flwr.app import Context, RecordDict

import fl_app.node.node_client as node
from clients import fedavg
from fl_app.common.background import in_background
from fl_app.node.drift_client import DriftClient
from fl_app.registry import validate_config
from tasks.partitioning import PartitionSpec, federated_dataset, load_test, load_test_split


def test_in_background_returns_the_value_and_raises_the_error():
    started = threading.Event()

    def work(x):
        started.set()
        return x * 2

    assert in_background(work, 21).result(timeout=10) == 42 and started.is_set()

    def fail():
        raise ValueError("bad value 7")

    with pytest.raises(ValueError, match="bad value 7"):
        in_background(fail).result(timeout=10)


def test_test_split_does_not_depend_on_the_partitioning(shared_data):
    a = PartitionSpec(dataset="mnist", num_partitions=100, alpha=0.3, data_dir=str(shared_data))
    b = PartitionSpec(dataset="mnist", num_partitions=7, partitioner="iid", data_dir=str(shared_data))
    xa, ya = load_test(a)
    xb, yb = load_test(b)
    assert xa is xb and ya is yb  # one decode per process, whatever the partitioning
    xs, ys = load_test_split("mnist", str(shared_data), 0)
    assert xs is xa and xs.shape == (10000, 1, 28, 28)


def client(cfg: dict, partition_id: int, num_partitions: int) -> node.NodeClient:
    node_config = {"partition-id": partition_id, "num-partitions": num_partitions}
    ctx = Context(run_id=0, node_id=partition_id, node_config=node_config, state=RecordDict(), run_config={})
    return node.NodeClient(DriftClient(fedavg.UPDATE, cfg, ctx, partition_id, num_partitions))


def test_no_warm_up_outside_a_simulation_actor(monkeypatch):
    monkeypatch.setattr(node, "_WARM_UP", None)
    monkeypatch.setattr(node, "in_ray_worker", lambda: False)  # a deployed ClientApp process
    cfg = validate_config({"dataset": "synthetic", "model": "mlp", "checkpoint-every": 0})
    client(cfg, 0, 4).get_properties({})
    assert node._WARM_UP is None


def test_partition_query_warms_up_the_process_once(small_mnist, monkeypatch):
    monkeypatch.setattr(node, "_WARM_UP", None)
    monkeypatch.setattr(node, "in_ray_worker", lambda: True)  # as in a Ray actor of the simulation
    monkeypatch.setattr(node, "ray_node_id", lambda: "node-a")  # no Ray imported in this process
    cfg = validate_config({"dataset": "mnist", "model": "cnn-small", "data-dir": str(small_mnist),
                           "alpha": 0.7, "seed": 5, "checkpoint-every": 0})
    spec = PartitionSpec.from_config(cfg, 13)
    federated_dataset.cache_clear()
    first = client(cfg, 3, 13)
    assert first.get_properties({}) == {"partition-id": 3, "num-partitions": 13}
    started = node._WARM_UP
    assert started is not None
    client(cfg, 4, 13).get_properties({})
    assert node._WARM_UP is started  # once per process, not per node
    node.wait_for_warm_up()
    assert started.exception() is None
    misses = federated_dataset.cache_info().misses
    federated_dataset(spec)
    assert federated_dataset.cache_info().misses == misses  # the warm-up built the partitioning
    _, n, metrics = first.fit(first.get_parameters({}), {"server-round": 1})
    assert n == len(federated_dataset(spec).load_partition(3, "train")) and metrics["fit_seconds"] > 0


def test_a_failed_warm_up_does_not_fail_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(node, "_WARM_UP", None)
    monkeypatch.setattr(node, "in_ray_worker", lambda: True)
    monkeypatch.setattr(node, "ray_node_id", lambda: "node-a")  # no Ray imported in this process

    def broken(spec, partition_id):
        raise RuntimeError("warm-up broke")

    monkeypatch.setattr(node, "warm_up", broken)
    cfg = validate_config({"dataset": "synthetic", "model": "mlp", "batch-size": 8, "checkpoint-every": 0})
    c = client(cfg, 0, 4)
    c.get_properties({})
    node.wait_for_warm_up()
    with pytest.raises(RuntimeError, match="warm-up broke"):
        node._WARM_UP.result()
    weights, n, metrics = c.fit(c.get_parameters({}), {"server-round": 1})
    assert n > 0 and metrics["num_steps"] > 0 and all(torch.isfinite(torch.as_tensor(w)).all() for w in weights)


# ------------------------------------------- a checked partitioning is remembered on disk
def _tiny_mnist(folder, rows=20):
    from tests.kit_runs import tiny_parquet

    return tiny_parquet(folder, rows=rows)


def test_checked_partitioning_is_remembered_and_skips_the_cut(tmp_path, monkeypatch):
    import tasks.partition_cache as cache
    import tasks.partitioning as data

    _tiny_mnist(tmp_path / "d")
    spec = PartitionSpec(dataset="mnist", num_partitions=4, partitioner="iid", data_dir=str(tmp_path / "d"))
    assert cache.checked_partitioning(spec) is None
    data.check_data(spec)
    assert cache.checked_partitioning(spec) == [5, 5, 5, 5]

    def no_cut(spec):
        raise AssertionError("the partitioning was cut again")

    monkeypatch.setattr(data, "federated_dataset", no_cut)
    data.check_data(spec)  # a hit: nothing is read or cut
    other = PartitionSpec(dataset="mnist", num_partitions=2, partitioner="iid", data_dir=str(tmp_path / "d"))
    with pytest.raises(AssertionError, match="cut again"):  # another spec is a miss
        data.check_data(other)


def test_changed_files_or_a_bad_cache_entry_are_a_miss(tmp_path):
    import tasks.partition_cache as cache
    import tasks.partitioning as data

    _tiny_mnist(tmp_path / "d")
    spec = PartitionSpec(dataset="mnist", num_partitions=2, partitioner="iid", data_dir=str(tmp_path / "d"))
    data.check_data(spec)
    assert cache.checked_partitioning(spec) == [10, 10]
    entry = cache.cache_dir() / "partitions" / f"{cache._partitioning_key(spec)}.json"
    entry.write_text("{not json")
    assert cache.checked_partitioning(spec) is None  # unreadable: recomputed, then rewritten
    data.check_data(spec)
    assert cache.checked_partitioning(spec) == [10, 10]
    import shutil

    shutil.rmtree(tmp_path / "d")
    _tiny_mnist(tmp_path / "d", rows=30)  # same path, other content
    assert cache.checked_partitioning(spec) is None


def test_a_failed_check_is_not_remembered(tmp_path):
    import tasks.partition_cache as cache
    import tasks.partitioning as data
    from tasks.datasets import PartitionError

    _tiny_mnist(tmp_path / "d")
    spec = PartitionSpec(dataset="mnist", num_partitions=10, alpha=0.1, min_partition_size=0,
                         data_dir=str(tmp_path / "d"))
    with pytest.raises(PartitionError, match="partitions are empty"):
        data.check_data(spec)
    assert cache.checked_partitioning(spec) is None
    with pytest.raises(PartitionError, match="partitions are empty"):
        data.check_data(spec)


def test_remembered_dirichlet_assignment_gives_the_same_partitions(small_mnist, tmp_path, monkeypatch):
    """A client process reads the Dirichlet assignment check_data kept instead of cutting
    again; its partitions are exactly those of a fresh cut."""
    import tasks.partition_cache as cache
    import tasks.partitioning as data

    monkeypatch.setenv("FL_DRIFT_CACHE", str(tmp_path / "cache"))
    spec = PartitionSpec(dataset="mnist", num_partitions=30, alpha=0.3, seed=5, data_dir=str(small_mnist))
    for fn in (data.federated_dataset, data.load_partition):
        fn.cache_clear()
    assert cache.remembered_indices(spec) is None
    fresh = data.federated_dataset(spec)
    assert type(fresh.partitioners["train"]).__name__ == "DirichletPartitioner"
    want = [data.load_partition(spec, pid) for pid in (0, 7, 29)]
    data.check_data(spec)  # cuts (the lru-cached dataset) and remembers the assignment
    assert cache.remembered_indices(spec) is not None
    for fn in (data.federated_dataset, data.load_partition):
        fn.cache_clear()
    served = data.federated_dataset(spec)
    assert type(served.partitioners["train"]).__name__ == "PrecomputedPartitioner"
    for pid, (x, y) in zip((0, 7, 29), want):
        x2, y2 = data.load_partition(spec, pid)
        assert torch.equal(x, x2) and torch.equal(y, y2)
    other = PartitionSpec(dataset="mnist", num_partitions=30, alpha=0.3, seed=6, data_dir=str(small_mnist))
    assert cache.remembered_indices(other) is None  # another seed is another cut
    for fn in (data.federated_dataset, data.load_partition):
        fn.cache_clear()


def test_a_client_process_remembers_its_own_cut(small_mnist, tmp_path, monkeypatch):
    """A node that cut the partitioning itself (no server check on its machine) keeps the
    assignment, so its next process (a deployed SuperNode's next message) reads it."""
    import tasks.partition_cache as cache
    import tasks.partitioning as data

    monkeypatch.setenv("FL_DRIFT_CACHE", str(tmp_path / "cache"))
    spec = PartitionSpec(dataset="mnist", num_partitions=20, alpha=0.5, seed=3, data_dir=str(small_mnist))
    for fn in (data.federated_dataset, data.load_partition):
        fn.cache_clear()
    x, y = data.load_partition(spec, 4)
    assert cache.remembered_indices(spec) is not None
    assert cache.checked_partitioning(spec) is None  # the check itself has not run
    for fn in (data.federated_dataset, data.load_partition):
        fn.cache_clear()
    x2, y2 = data.load_partition(spec, 4)
    assert type(data.federated_dataset(spec).partitioners["train"]).__name__ == "PrecomputedPartitioner"
    assert torch.equal(x, x2) and torch.equal(y, y2)
    for fn in (data.federated_dataset, data.load_partition):
        fn.cache_clear()
