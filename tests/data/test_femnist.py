"""FEMNIST through the same flwr-datasets path as the hub's ``flwrlabs/femnist``, on a small
GENERATED parquet file with the hub's schema (these machines cannot reach the hub): image
(28 x 28 grey PNG), writer_id (str), hsf_id (int), character (62 classes); one training split,
10% of it held out as the test split. Natural-id partitions: one client per writer, never split."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tasks.catalogue import DATASETS
from tasks.datasets import DataUnavailableError, PartitionError
from tasks.partitioning import (
    PartitionSpec,
    check_data,
    federated_dataset,
    label_column,
    load_partition,
    load_test,
    train_rows,
)

WRITER_ROWS = {"f0000_14": 40, "f0001_41": 55, "f0002_03": 30, "f0003_27": 45, "f0004_10": 50}


def write_femnist(folder, writer_rows: dict[str, int] = WRITER_ROWS, seed: int = 0) -> None:
    """``folder/femnist/train.parquet`` in the hub's schema: random ink on white per row."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(seed)
    images, writers, hsf, characters = [], [], [], []
    for writer, rows in writer_rows.items():
        for _ in range(rows):
            pixels = np.where(rng.random((28, 28)) < 0.2, rng.integers(0, 120, (28, 28)), 255).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
            images.append({"bytes": buffer.getvalue(), "path": None})
            writers.append(writer)
            hsf.append(int(writer[1:5]) % 8)
            characters.append(int(rng.integers(0, 62)))
    table = pa.table({"image": images, "writer_id": writers, "hsf_id": pa.array(hsf, pa.int64()),
                      "character": pa.array(characters, pa.int64())})
    (folder / "femnist").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "femnist" / "train.parquet")


@pytest.fixture(scope="module")
def femnist_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("femnist-data")
    write_femnist(folder)
    return folder


def spec_of(folder, n: int = len(WRITER_ROWS), **fields) -> PartitionSpec:
    return PartitionSpec(dataset="femnist", num_partitions=n, partitioner="natural", data_dir=str(folder), **fields)


def test_femnist_loads_with_a_held_out_test_split(femnist_dir):
    """Only train.parquet is needed; 10% of it (seeded) is the test split, the rest is cut."""
    spec = spec_of(femnist_dir)
    total = sum(WRITER_ROWS.values())
    held = int(0.1 * total)
    x_test, y_test = load_test(spec)
    assert x_test.shape == (held, 1, 28, 28) and int(y_test.max()) < 62
    assert train_rows(spec) == total - held
    check_data(spec)
    sizes = [len(load_partition(spec, i)[1]) for i in range(spec.num_partitions)]
    assert sum(sizes) == total - held
    train = np.concatenate([load_partition(spec, i)[0].flatten(1).numpy() for i in range(spec.num_partitions)])
    both = np.concatenate([train, x_test.flatten(1).numpy()])
    assert len(np.unique(both, axis=0)) == total  # every generated image once: train and test are disjoint


def test_natural_ids_never_split_a_writer(femnist_dir):
    """Client k holds every training row of the k-th writer (sorted ids) and no other writer's."""
    spec = spec_of(femnist_dir)
    fds = federated_dataset(spec)
    all_writers = label_column(fds.load_split("train"), "writer_id")
    writers, counts = np.unique(all_writers, return_counts=True)
    for k, (writer, count) in enumerate(zip(writers, counts)):
        mine = label_column(fds.load_partition(k, "train"), "writer_id")
        assert set(mine.tolist()) == {writer} and len(mine) == count


def test_natural_partitions_need_one_client_per_writer(femnist_dir):
    with pytest.raises(PartitionError, match=r"4 partitions requested .* has 5 distinct 'writer_id' values.*"
                                             r"run_simulation.py: --clients 5"):
        check_data(spec_of(femnist_dir, n=4))


@pytest.mark.slow  # 23 s idle: datasets' offline hub lookup
def test_femnist_without_data_names_the_hub_id(tmp_path, monkeypatch):
    """With no data folder the hub id is tried (offline here: refused, naming it and the file to bring)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    federated_dataset.cache_clear()
    with pytest.raises(DataUnavailableError, match="flwrlabs/femnist"):
        federated_dataset(PartitionSpec(dataset="femnist", num_partitions=5, partitioner="natural"))
    with pytest.raises(DataUnavailableError, match=r"femnist/train.parquet \(or set neither"):
        federated_dataset(spec_of(tmp_path))
    assert DATASETS["femnist"].splits() == ("train",)


def test_femnist_fingerprint_names_the_held_out_test_split(femnist_dir):
    from fl_app.registry import validate_config
    from fl_app.server.provenance import data_fingerprint

    cfg = validate_config({"dataset": "femnist", "partitioner": "natural", "data-dir": str(femnist_dir)})
    found = data_fingerprint(cfg, len(WRITER_ROWS))
    assert found["test"] == {"source": "held out of train", "share": 0.1}
    assert found["train"]["source"] == "local parquet"


@pytest.mark.slow
def test_natural_femnist_trains_two_rounds_through_flower(simulated, femnist_dir):
    """2 rounds of FedAvg through ``flwr run``'s simulation, one client per writer of the generated
    FEMNIST; the server's picture shows the writers' splits."""
    from runner.results.report import read_metrics

    cfg = {"strategy": "fedavg", "dataset": "femnist", "partitioner": "natural", "model": "cnn-small",
           "num-server-rounds": 2, "fraction-fit": 0.4, "min-fit-clients": 2, "data-dir": str(femnist_dir),
           "split-picture": True}
    run = simulated("partitions-natural-femnist", cfg, len(WRITER_ROWS))
    assert run.rc == 0, "\n".join(run.lines[-30:])
    rows = read_metrics(run.run_dir)
    assert len(rows) == 2 and all(r["num_clients"] == 2 and r["num_failures"] == 0 for r in rows)
    assert (run.run_dir / "partitions.png").is_file()
