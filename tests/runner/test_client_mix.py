"""The clients' accuracy on their own label mixes (runner/results/clientmix.py): the per-class
test accuracies weighted by each client's training label counts, its spread over clients, the
counts cut again from the data the clients trained on, and the results table's column."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

import scripts.make_results as mr
from fl_app.registry import validate_config
from runner.results.clientmix import (
    LABEL_COUNTS_FILE,
    MIX_COLUMNS,
    PER_CLASS_FILE,
    client_mix_columns,
    label_mix_accuracies,
    run_label_counts,
)
from runner.results.report import client_cells
from tasks.partition_spec import PartitionSpec
from tasks.partitioning import load_partition, partition_label_counts
from tasks.train import accuracy_spread
from tests.kit_runs import TOY, row, section, write_run


def test_label_mix_accuracy_by_hand():
    # client 0: (2 * 1.0 + 2 * 0.5) / 4 = 0.75 (class 2 is not in the test split: left out);
    # client 1: 0.5; client 2 holds only the unscored class: NaN.
    per_class = np.array([1.0, 0.5, math.nan])
    counts = np.array([[2, 2, 1], [0, 4, 0], [0, 0, 3]])
    acc = label_mix_accuracies(per_class, counts)
    assert acc[:2] == pytest.approx([0.75, 0.5]) and math.isnan(acc[2])
    mean, std, worst, n = accuracy_spread(acc)  # the NaN client is left out
    assert (mean, std, worst, n) == pytest.approx((0.625, 0.125, 0.5, 2))


def test_accuracy_spread_by_hand():
    # 12 clients: worst 10% = the ceil(1.2) = 2 lowest (0.1, 0.2): 0.15; population std.
    accs = [0.1, 0.2] + [0.9] * 10
    assert accuracy_spread(accs) == pytest.approx(((0.3 + 9.0) / 12, np.std(accs), 0.15, 12))
    assert accuracy_spread([0.5, 0.7])[2] == 0.5  # at least one client
    assert math.isnan(accuracy_spread([])[0]) and accuracy_spread([])[3] == 0


def test_label_counts_are_the_labels_the_clients_train_on(small_mnist):
    """On the session's MNIST sample (6,000 training images): the same check as on the full
    60,000, in about a third of the time (8 s -> 2.4 s)."""
    spec = PartitionSpec(dataset="mnist", num_partitions=5, partitioner="dirichlet", alpha=0.5,
                         min_partition_size=10, seed=3, data_dir=str(small_mnist))
    counts = partition_label_counts(spec)
    assert counts.shape == (5, 10) and counts.sum() == 6_000
    for pid in range(5):
        _, y = load_partition(spec, pid)
        assert counts[pid].tolist() == np.bincount(y.numpy(), minlength=10).tolist()


def write_mix_run(runs, method: str, seed: int, accs: list[float], per_class: list[float], counts) -> None:
    write_run(runs, method, seed, accs)
    d = runs / f"{method}-seed{seed}"
    with (d / PER_CLASS_FILE).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round"] + [f"class_{c}" for c in range(len(per_class))])
        w.writerow([1] + [0.0] * len(per_class))  # an earlier round: not the one that counts
        w.writerow([len(accs)] + per_class)
    if counts is not None:
        np.savetxt(d / LABEL_COUNTS_FILE, np.asarray(counts), fmt="%d", delimiter=",")


def test_columns_read_the_last_round_and_average_the_seeds(tmp_path):
    # seed 0: clients 0.75 and 0.5 -> mean 0.625, std 0.125, worst 0.5;
    # seed 1: clients 1.0 and 0.5 -> mean 0.75, std 0.25, worst 0.5. Means over the seeds.
    runs = tmp_path / "runs"
    write_mix_run(runs, "fedavg", 0, [0.6], [1.0, 0.5], [[2, 2], [0, 4]])
    write_mix_run(runs, "fedavg", 1, [0.6], [1.0, 0.5], [[3, 0], [0, 1]])
    cols = client_mix_columns([runs / "fedavg-seed0", runs / "fedavg-seed1"])
    assert cols == pytest.approx({"final_client_mix_mean": 0.6875, "final_client_mix_std": 0.1875,
                                  "final_client_mix_worst10": 0.5, "final_client_mix_seeds": 2})


def test_a_view_from_fewer_seeds_than_the_row_says_so(tmp_path):
    """A row of 2 seeds, one run made before the label-mix view existed: the cell is that one
    seed's spread and says '(1/2 seeds)' instead of passing for the row's mean."""
    runs = tmp_path / "runs"
    write_mix_run(runs, "fedavg", 0, [0.6], [1.0, 0.5], [[2, 2], [0, 4]])
    write_mix_run(runs, "fedavg", 1, [0.6], [1.0, 0.5], [[3, 0], [0, 1]])
    (runs / "fedavg-seed1" / PER_CLASS_FILE).unlink()
    row = {"seeds": 2, **client_mix_columns([runs / "fedavg-seed0", runs / "fedavg-seed1"])}
    assert client_cells(row, MIX_COLUMNS) == "0.6250 / 0.1250 / 0.5000 (1/2 seeds)"
    assert client_cells({**row, "seeds": 1}, MIX_COLUMNS) == "0.6250 / 0.1250 / 0.5000"


def test_without_counts_or_data_the_column_stays_empty(tmp_path):
    runs = tmp_path / "runs"
    write_mix_run(runs, "fedavg", 0, [0.6], [1.0, 0.5], None)  # no counts kept, summary without a data spec
    d = runs / "fedavg-seed0"
    assert run_label_counts(d) is None and run_label_counts(d, compute=True) is None
    cols = client_mix_columns([d], compute=True)
    assert cols.pop("final_client_mix_seeds") == 0 and all(math.isnan(v) for v in cols.values())


def test_collect_keeps_per_class_and_counts_and_the_table_shows_the_mix(tmp_path, shared_data, monkeypatch):
    """--collect cuts the run's partitions again (its config and client count), keeps the counts
    beside per_class_accuracy.csv, and the table's label-mix column equals the hand formula on
    them; regenerating from the store then needs no data."""
    monkeypatch.setenv("FL_DATA_DIR", str(shared_data))
    exps, source, store = tmp_path / "experiments", tmp_path / "results", tmp_path / "store"
    exps.mkdir()
    (exps / "toy.toml").write_text(TOY)
    runs = source / "toy" / "runs"
    per_class = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 1.0]
    write_mix_run(runs, "fedavg", 0, [0.2, 0.5, 0.6], per_class, None)
    summary = json.loads((runs / "fedavg-seed0" / "summary.json").read_text())
    summary.update(num_clients=10, config=validate_config({**summary["config"], "num-server-rounds": 3}))
    (runs / "fedavg-seed0" / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "docs" / "results.md"
    assert mr.main(["--experiments", str(exps), "--results", str(store), "--collect", str(source),
                    "--out", str(out)]) == 0
    kept = store / "toy" / "fedavg-seed0"
    assert sorted(p.name for p in kept.iterdir()) == [LABEL_COUNTS_FILE, "metrics.csv", PER_CLASS_FILE,
                                                     "summary.json"]
    cfg = summary["config"]
    spec = PartitionSpec.from_config({**cfg, "data-dir": str(shared_data)}, 10)
    counts = partition_label_counts(spec)
    lines = (kept / LABEL_COUNTS_FILE).read_text().splitlines()  # the documented header, then a row per client
    assert lines[0] == "client," + ",".join(f"class_{c}" for c in range(counts.shape[1]))
    assert [[int(v) for v in line.split(",")] for line in lines[1:]] == [[k, *row] for k, row in
                                                                         enumerate(counts.tolist())]
    by_hand = [sum(n * a for n, a in zip(client, per_class)) / sum(client) for client in counts.tolist()]
    mean, std, worst, _ = accuracy_spread(by_hand)
    monkeypatch.setenv("FL_DATA_DIR", str(tmp_path / "no-data"))  # the store alone is enough now
    text = mr.make_results(exps, store, out)
    sec = section(text, "toy")
    assert "client accuracy, label mixes (final): mean / std / worst 10%" in sec
    assert row(sec, "fedavg")[-1] == f"{mean:.4f} / {std:.4f} / {worst:.4f}"
