"""Each partitioner's defining property on real MNIST images (the
session's seeded sample of the real files, ``small_mnist``), seeded reproducibility, the checks
before launch, and the noise-based feature skew on both execution paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_app.config import ConfigError
from fl_app.registry import validate_config
from tasks.catalogue import DATASETS
from tasks.datasets import PartitionError
from tasks.partition_figure import unheld_labels, write_check_splits
from tasks.partitioners import inner_dirichlet_sizes, quantity_sizes
from tasks.partitioning import (
    PartitionSpec,
    check_data,
    federated_dataset,
    load_client_split,
    load_partition,
    load_test,
    partition_label_counts,
    train_rows,
)
from tests.kit import serve_in_process

CLASSES = 10


def spec_of(data_dir, partitioner: str, n: int = 6, **fields) -> PartitionSpec:
    return PartitionSpec(dataset="mnist", num_partitions=n, partitioner=partitioner, data_dir=str(data_dir), **fields)


def label_sequences(spec: PartitionSpec) -> list[np.ndarray]:
    """Every client's labels in the order the partitioner serves them (a fresh cut)."""
    federated_dataset.cache_clear()
    fds = federated_dataset(spec)
    return [np.asarray(fds.load_partition(i, "train").with_format("arrow")["label"]) for i in range(spec.num_partitions)]


def total_variation(counts: np.ndarray) -> np.ndarray:
    """Each client's total-variation distance from the pooled label mix."""
    mixes = counts / counts.sum(axis=1, keepdims=True)
    pooled = counts.sum(axis=0) / counts.sum()
    return 0.5 * np.abs(mixes - pooled).sum(axis=1)


# ------------------------------------------------------------------ pathological (#C = k)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_pathological_gives_every_client_exactly_k_labels(small_mnist, k):
    """NIID-Bench's #C = k: every client holds exactly k distinct labels, client i's first is
    i mod 10, and together the clients hold every example of the labels they use, once."""
    spec = spec_of(small_mnist, "pathological", n=8, classes_per_client=k)
    counts = partition_label_counts(spec)
    assert ((counts > 0).sum(axis=1) == k).all()
    assert all(counts[i, i % CLASSES] > 0 for i in range(spec.num_partitions))
    used = counts.sum(axis=0) > 0
    pooled = np.bincount(np.asarray(federated_dataset(spec).load_split("train")["label"]), minlength=CLASSES)
    assert (counts.sum(axis=0)[used] == pooled[used]).all()


# ------------------------------------------------------------------ quantity skew
def test_quantity_skew_has_dirichlet_sizes_and_iid_labels(small_mnist):
    """NIID-Bench's quantity skew: the sizes are the seeded Dir(alpha) draw (each at least
    min-partition-size, adding up to the split), and every large client's labels are an IID
    sample: its label mix within 0.1 of the pooled one (Dirichlet label skew is far off)."""
    spec = spec_of(small_mnist, "quantity", alpha=0.5, min_partition_size=10)
    counts = partition_label_counts(spec)
    sizes = counts.sum(axis=1)
    assert sizes.tolist() == quantity_sizes(spec, train_rows(spec))
    assert sizes.sum() == train_rows(spec) and sizes.min() >= 10
    assert sizes.std() / sizes.mean() > 0.3  # the sizes really differ
    large = sizes >= 500
    assert large.sum() >= 3 and (total_variation(counts)[large] < 0.1).all()
    skewed = partition_label_counts(spec_of(small_mnist, "dirichlet", alpha=0.5))
    assert total_variation(skewed).mean() > 2 * total_variation(counts)[large].mean()


def test_quantity_sizes_redraw_until_every_client_has_the_minimum():
    spec = PartitionSpec(dataset="mnist", num_partitions=20, partitioner="quantity", alpha=1.0, min_partition_size=50)
    sizes = quantity_sizes(spec, 10_000)
    assert min(sizes) >= 50 and sum(sizes) == 10_000
    with pytest.raises(PartitionError, match="min-partition-size = 600"):
        quantity_sizes(PartitionSpec(dataset="mnist", num_partitions=20, partitioner="quantity", alpha=0.3,
                                     min_partition_size=600), 10_000)


# ------------------------------------------------------------------ inner Dirichlet (FedDyn)
def test_inner_dirichlet_keeps_the_sizes_and_skews_the_labels(small_mnist):
    """The FedDyn split: equal sizes (size-sigma 0), or lognormal ones, each client's labels
    drawn from its Dir(alpha) prior: far from the pooled mix at alpha 0.1."""
    spec = spec_of(small_mnist, "inner-dirichlet", alpha=0.1)
    counts = partition_label_counts(spec)
    rows = train_rows(spec)
    assert counts.sum(axis=1).tolist() == [rows // 6] * 6
    assert total_variation(counts).mean() > 0.4
    unequal = partition_label_counts(spec_of(small_mnist, "inner-dirichlet", alpha=0.1, size_sigma=0.5)).sum(axis=1)
    assert unequal.std() > 0.1 * unequal.mean() and unequal.sum() <= rows


@pytest.mark.parametrize("sigma", [0.3, 0.5, 1.0])
def test_inner_dirichlet_sizes_are_the_lognormal_draw(sigma):
    """Where every client gets at least one example, the sizes are the lognormal draw's floor:
    the same list the earlier code (which raised each size to at least 1) gave."""
    spec = PartitionSpec(dataset="mnist", num_partitions=20, partitioner="inner-dirichlet", size_sigma=sigma, seed=3)
    shares = np.random.default_rng(3).lognormal(mean=np.log(60_000 / 20), sigma=sigma, size=20)
    assert inner_dirichlet_sizes(spec, 60_000) == (shares / shares.sum() * (60_000 - 20)).astype(int).tolist()


def test_a_degenerate_inner_dirichlet_size_draw_is_refused_naming_the_key():
    """size-sigma 5 over 100 clients drew a client 6e-6 examples, silently raised to 1 (and
    size-sigma 1e6 overflowed to NaN, every client 1 example, 10 in all: `--check` passed)."""
    spec = PartitionSpec(dataset="mnist", num_partitions=100, partitioner="inner-dirichlet", size_sigma=5.0)
    with pytest.raises(PartitionError, match=r"run-config key 'size-sigma' = 5 is invalid for 100 inner-dirichlet"
                                             r" clients of 60000 examples: .* gives a client [0-9.e-]+ examples"):
        inner_dirichlet_sizes(spec, 60_000)


@pytest.mark.parametrize("sigma", [1e6, -0.1, float("inf"), float("nan")])
def test_size_sigma_outside_its_range_is_refused(sigma):
    with pytest.raises(ConfigError, match=r"'size-sigma' = .* is invalid: must be (a finite number )?0 to 5"):
        validate_config({"partitioner": "inner-dirichlet", "size-sigma": sigma})


def test_labels_no_client_holds_are_said_in_one_line():
    spec = PartitionSpec(dataset="mnist", num_partitions=3, partitioner="pathological", classes_per_client=1)
    counts = np.zeros((3, CLASSES), dtype=int)
    counts[0, 0], counts[1, 1], counts[2, 7] = 5, 6, 7
    line = unheld_labels(spec, counts)
    assert line.startswith("7 of 10 labels are held by no client (mnist, 3 clients, pathological partitions")
    assert line.endswith(": 2, 3, 4, 5, 6, 8, 9; no client trains on them") and "\n" not in line
    counts[:, 2:] = 1
    assert unheld_labels(spec, counts) is None


def test_check_warns_of_labels_no_client_holds(small_mnist, tmp_path):
    """`pathological` with k = 1 and 4 clients left labels 4-9 to no client, said only in
    flwr-datasets' multi-line warning."""
    import warnings

    spec = spec_of(small_mnist, "pathological", n=4, classes_per_client=1)
    cfg = {"dataset": "mnist", "partitioner": "pathological", "classes-per-client": 1, "data-dir": str(small_mnist)}
    with warnings.catch_warnings(record=True) as caught:
        federated_dataset.cache_clear()
        lines = write_check_splits([validate_config(cfg)], tmp_path, spec.num_partitions)
    assert lines[-1] == "warning: 6 of 10 labels are held by no client (mnist, 4 clients, pathological partitions" \
                        " (classes-per-client=1), seed 0): 4, 5, 6, 7, 8, 9; no client trains on them"
    assert not [w for w in caught if "will NOT be used" in str(w.message)]  # the library's text is not shown too


# ------------------------------------------------------------------ seeded reproducibility
@pytest.mark.parametrize("partitioner", ["pathological", "quantity", "inner-dirichlet"])
def test_the_same_seed_cuts_the_same_partitions(small_mnist, partitioner, monkeypatch, tmp_path):
    """A fresh cut with the same seed serves every client the same examples in the same order;
    another seed cuts others. (No remembered assignment: a private cache folder each time.)"""
    monkeypatch.setenv("FL_DRIFT_CACHE", str(tmp_path / "a"))
    first = label_sequences(spec_of(small_mnist, partitioner, seed=4))
    monkeypatch.setenv("FL_DRIFT_CACHE", str(tmp_path / "b"))
    again = label_sequences(spec_of(small_mnist, partitioner, seed=4))
    other = label_sequences(spec_of(small_mnist, partitioner, seed=5))
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(len(a) == len(b) and np.array_equal(a, b) for a, b in zip(first, other))


# ------------------------------------------------------------------ checks, cache, fingerprint
def test_a_client_below_one_batch_is_refused_naming_it(small_mnist):
    """check_data names the smallest client and its size when it has fewer examples than the
    smallest batch the run's model trains on; the same split passes where one example is enough."""
    spec = spec_of(small_mnist, "quantity", n=10, alpha=0.3, min_partition_size=1)
    sizes = partition_label_counts(spec).sum(axis=1)
    smallest = int(np.argmin(sizes))
    assert sizes[smallest] < 500
    with pytest.raises(PartitionError, match=rf"client {smallest} \(partition {smallest}\) has {sizes[smallest]}"
                                             r" example\(s\).*smallest batch the model trains on \(500\)"):
        check_data(spec, min_size=500)
    check_data(spec, min_size=1)


def test_the_new_partitioners_are_remembered_and_served_alike(small_mnist, tmp_path, monkeypatch):
    """A passed check keeps the assignment; a new process serves the very same partitions from it."""
    import tasks.partition_cache as cache

    monkeypatch.setenv("FL_DRIFT_CACHE", str(tmp_path / "cache"))
    for partitioner in ("pathological", "inner-dirichlet", "quantity"):
        spec = spec_of(small_mnist, partitioner, seed=2)
        load_partition.cache_clear()
        federated_dataset.cache_clear()
        check_data(spec)
        assert cache.checked_partitioning(spec) is not None and cache.remembered_indices(spec) is not None
        want = load_partition(spec, 3)
        load_partition.cache_clear()
        federated_dataset.cache_clear()
        assert type(federated_dataset(spec).partitioners["train"]).__name__ == "PrecomputedPartitioner"
        got = load_partition(spec, 3)
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_fingerprint_tells_the_new_partitionings_apart():
    from fl_app.server.provenance import data_fingerprint

    base = {"dataset": "synthetic", "model": "logreg"}
    digests = set()
    for keys in ({"partitioner": "pathological", "classes-per-client": 2},
                 {"partitioner": "pathological", "classes-per-client": 3},
                 {"partitioner": "quantity", "alpha": 0.5}, {"partitioner": "inner-dirichlet", "alpha": 0.5},
                 {"partitioner": "inner-dirichlet", "alpha": 0.5, "size-sigma": 0.3}):
        spec = PartitionSpec.from_config(validate_config({**base, **keys, "dataset": "mnist", "model": "cnn"}), 4)
        digests.add(str(spec.identity()))
    assert len(digests) == 5
    cfg = validate_config({"dataset": "mnist", "model": "cnn", "partitioner": "iid", "noise-sigma": 0.2})
    assert data_fingerprint(cfg, 4)["partition"]["noise-sigma"] == 0.2


def test_config_refuses_partitioner_keys_that_do_not_fit():
    assert {"pathological", "quantity", "inner-dirichlet", "natural"} <= set(
        validate_config.__globals__["spec"]()["partitioner"].choices)
    with pytest.raises(ConfigError, match="'natural' does not fit dataset 'mnist'.*valid datasets: femnist"):
        validate_config({"partitioner": "natural"})
    with pytest.raises(ConfigError, match="'classes-per-client' = 11 is invalid: 'mnist' has 10 classes"):
        validate_config({"partitioner": "pathological", "classes-per-client": 11})
    with pytest.raises(ConfigError, match="'noise-sigma' = 0.5 needs an image dataset"):
        validate_config({"dataset": "synthetic", "model": "logreg", "noise-sigma": 0.5})


# ------------------------------------------------------------------ noise-based feature skew
def test_noise_variance_grows_with_the_client_index(small_mnist):
    """Client i of N (partition i - 1) gets noise of variance sigma * i / N in pixel units,
    measured on its inputs against the same partition without noise; the test split is untouched."""
    clean = spec_of(small_mnist, "iid", n=4)
    noisy = spec_of(small_mnist, "iid", n=4, noise_sigma=0.4)
    std = DATASETS["mnist"].std[0]
    for pid in range(4):
        (x0, y0), (x, y) = load_partition(clean, pid), load_partition(noisy, pid)
        assert torch.equal(y0, y)
        measured = ((x - x0) * std).var().item()
        assert measured == pytest.approx(0.4 * (pid + 1) / 4, rel=0.02)
    assert all(torch.equal(a, b) for a, b in zip(load_test(clean), load_test(noisy)))


def test_noise_is_seeded_and_reaches_the_local_split(small_mnist):
    noisy = spec_of(small_mnist, "iid", n=4, noise_sigma=0.4)
    first = load_partition(noisy, 1)[0].clone()
    load_partition.cache_clear()
    assert torch.equal(load_partition(noisy, 1)[0], first)
    reseeded = spec_of(small_mnist, "iid", n=4, noise_sigma=0.4, seed=1)
    clean_reseeded = spec_of(small_mnist, "iid", n=4, seed=1)
    assert not torch.equal(load_partition(reseeded, 1)[0] - load_partition(clean_reseeded, 1)[0],
                           first - load_partition(spec_of(small_mnist, "iid", n=4), 1)[0])
    (xtr, _), (xte, _) = load_client_split(noisy, 3, 0.5)
    (ctr, _), (cte, _) = load_client_split(spec_of(small_mnist, "iid", n=4), 3, 0.5)
    std = DATASETS["mnist"].std[0]
    for a, b in ((xtr, ctr), (xte, cte)):
        assert ((a - b) * std).var().item() == pytest.approx(0.4, rel=0.05)


def test_cohort_and_per_client_see_the_same_noisy_inputs(small_mnist):
    """A virtual client prepared by a cohort node (``cohort_client.prepare``) and the per-client
    node of the same partition train on the same inputs, noise and all."""
    from clients import fedavg
    from fl_app.node.client_state import ClientStateStore
    from fl_app.node.cohort_client import prepare
    from fl_app.node.drift_client import DriftClient
    from protocol.cohort import NUM_PARTITIONS
    from tasks.models import get_weights
    from tests.kit import fake_context

    cfg = validate_config({"data-dir": str(small_mnist), "partitioner": "iid", "noise-sigma": 0.3,
                           "model": "cnn-small"})
    for pid in (0, 3):
        alone = DriftClient(fedavg.UPDATE, cfg, fake_context(cfg), pid, 4)
        failed: dict = {}
        (member,) = prepare(fedavg.UPDATE, cfg, [(pid, get_weights(alone.model), {NUM_PARTITIONS: 4})],
                            ClientStateStore(), failed)
        assert not failed
        assert torch.equal(member.job.x, alone.data[0]) and torch.equal(member.job.y, alone.data[1])
        clean = load_partition(PartitionSpec.from_config({**cfg, "noise-sigma": 0.0}, 4), pid)[0]
        assert not torch.equal(alone.data[0].cpu(), clean)


# ------------------------------------------------------------------ the picture of a split
def test_split_files_draw_and_count_every_client(small_mnist, tmp_path):
    """partitions.png is a picture; client_label_counts.csv has its header, then client k's
    counts per class, the split's own; a file without the header (written before it) reads alike."""
    from PIL import Image

    from tasks.partition_figure import read_label_counts, write_split_files

    spec = spec_of(small_mnist, "pathological", n=5, classes_per_client=2)
    counts = write_split_files(tmp_path, spec)
    assert counts.tolist() == partition_label_counts(spec).tolist()
    with Image.open(tmp_path / "partitions.png") as image:
        assert image.format == "PNG" and image.size[0] > 300
    lines = (tmp_path / "client_label_counts.csv").read_text().splitlines()
    assert lines[0] == "client," + ",".join(f"class_{c}" for c in range(CLASSES))
    assert lines[3].split(",")[0] == "2" and read_label_counts(tmp_path / "client_label_counts.csv").tolist() == \
        counts.tolist()
    np.savetxt(tmp_path / "old.csv", counts, fmt="%d", delimiter=",")
    assert read_label_counts(tmp_path / "old.csv").tolist() == counts.tolist()


@pytest.mark.parametrize("clients", [4, 20, 30, 100])
def test_the_split_picture_is_whole_and_readable(clients):
    """The split's picture is whole: the title (wrapped to fit, not cut at the left) lies inside
    the figure, the clients' ticks are integers (every client up to 20), and every size label
    lies inside the axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from tasks.partition_figure import split_figure

    counts = np.random.default_rng(0).integers(0, 2000, (clients, 10))
    counts[clients // 2] = 5000  # the tallest bar, in the middle
    title = ("mnist, 100 clients of 1,234 to 16,840 examples, dirichlet partitions (alpha=0.3,"
             " min-partition-size=10, noise-sigma=0.1), seed 0")
    fig = split_figure(counts, title)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    figure_box = fig.bbox
    title_box = fig._suptitle.get_window_extent(renderer)
    assert figure_box.x0 <= title_box.x0 and title_box.x1 <= figure_box.x1 and title_box.y1 <= figure_box.y1
    assert fig._suptitle.get_text().replace("\n", " ") == title
    [ax] = fig.axes
    ticks = [t for t in ax.get_xticks() if -0.5 <= t <= clients - 0.5]
    assert all(float(t).is_integer() for t in ticks) and len(ticks) >= 3
    labels = [tick.get_text() for tick in ax.get_xticklabels() if tick.get_text()]
    assert all(label.lstrip("−-").isdigit() for label in labels), labels
    if clients <= 20:
        assert ticks == list(range(clients))
    axes_box = ax.get_window_extent(renderer)
    for text in ax.texts:  # the size labels
        box = text.get_window_extent(renderer)
        assert box.y1 <= axes_box.y1, (text.get_text(), box, axes_box)


def test_check_draws_the_split_without_training(small_mnist, tmp_path, capsys, monkeypatch):
    """--check writes partitions.png (one per distinct split) and trains nothing; the pictures go
    into a new folder of the temporary directory: no --out folder, no results/compare-<time>."""
    import tempfile

    import run_simulation

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    args = ["--check", "--strategy", "fedavg", "--dataset", "mnist", "--data-dir", str(small_mnist), "--clients", "4",
            "--rounds", "2", "--set", "model=cnn-small", "--set", "partitioner=pathological"]
    assert run_simulation.main([*args, "--out", str(out)]) == 0
    assert not out.exists()
    [drawn] = (tmp_path / "tmp").glob("fl-drift-check-*")
    assert (drawn / "partitions.png").is_file() and (drawn / "client_label_counts.csv").is_file()
    assert f"split: {drawn / 'partitions.png'} (mnist, seed 0, pathological partitions (classes-per-client=2)" in \
        capsys.readouterr().out
    assert run_simulation.main([*args, "--seeds", "0", "1"]) == 0  # two seeds: two splits; no --out
    assert not (tmp_path / "results").exists() and not out.exists()
    [second] = set((tmp_path / "tmp").glob("fl-drift-check-*")) - {drawn}
    assert (second / "partitions-1.png").is_file() and (second / "partitions-2.png").is_file()


def test_a_run_writes_the_split_picture_unless_told_not_to(tmp_path):
    """The server writes its run's picture and label counts (``split-picture`` true, the
    default); false leaves the picture out and still writes the counts. The tests' runs set it
    false (``without_picture`` in conftest.py): this is the run that draws."""
    from PIL import Image

    from tasks.partition_figure import read_label_counts

    cfg = {"strategy": "fedavg", "dataset": "synthetic", "model": "logreg", "num-server-rounds": 1,
           "fraction-fit": 1.0, "tracking": "none", "results-dir": str(tmp_path)}
    for name, picture in (("drawn", True), ("counted", False)):
        serve_in_process({**cfg, "run-name": name, "split-picture": picture}, 3)
        counts = read_label_counts(tmp_path / name / "client_label_counts.csv")
        assert counts.shape == (3, 10) and counts.sum() > 0
        assert (tmp_path / name / "partitions.png").is_file() == picture
    with Image.open(tmp_path / "drawn" / "partitions.png") as image:
        assert image.format == "PNG"


def test_list_keys_and_partitioners_show_the_new_partitioners(capsys):
    import run_simulation

    assert run_simulation.main(["--list", "keys"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.strip().startswith("partitioner "))
    for name in ("pathological", "quantity", "inner-dirichlet", "natural"):
        assert name in line
    assert run_simulation.main(["--list", "partitioners"]) == 0
    listed = capsys.readouterr().out
    assert "NIID-Bench: quantity-based label imbalance #C = k" in listed and "quantity skew" in listed


# ------------------------------------------------------------------ 2 rounds through Flower's simulation
RUNS = {
    "pathological": {"partitioner": "pathological", "classes-per-client": 2},
    "quantity": {"partitioner": "quantity", "alpha": 1.0},
    "inner-dirichlet": {"partitioner": "inner-dirichlet", "alpha": 0.5},
    "noise": {"partitioner": "iid", "noise-sigma": 0.3},
}


@pytest.mark.slow  # 20-30 s each idle: every partitioner through Flower (their properties run by default)
@pytest.mark.parametrize("name", RUNS)
def test_each_partitioner_trains_two_rounds_through_flower(simulated, small_mnist, name):
    """2 rounds of FedAvg on 4 clients through ``flwr run``'s simulation; the server wrote the
    split's picture and its counts, which are the split's own."""
    from runner.results.report import read_metrics
    from tasks.partition_figure import read_label_counts

    cfg = {"strategy": "fedavg", "dataset": "mnist", "model": "cnn-small", "num-server-rounds": 2,
           "fraction-fit": 0.5, "data-dir": str(small_mnist), "split-picture": True, **RUNS[name]}
    run = simulated(f"partitions-{name}", cfg, 4)
    assert run.rc == 0, "\n".join(run.lines[-30:])
    rows = read_metrics(run.run_dir)
    assert len(rows) == 2 and all(r["num_clients"] == 2 and r["num_failures"] == 0 for r in rows)
    assert (run.run_dir / "partitions.png").is_file()
    spec = PartitionSpec.from_config(validate_config(cfg), 4)
    assert read_label_counts(run.run_dir / "client_label_counts.csv").tolist() == \
        partition_label_counts(spec).tolist()
