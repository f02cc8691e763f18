"""NIID-Bench's settings as its code runs them: the balanced label-Dirichlet of its
``partition_data`` (``dirichlet-balance``), the code's reading of the feature noise
(``noise-reading = "code"``) and its simple CNN (``simple-cnn``)."""

from __future__ import annotations

import numpy as np
import pytest

from fl_app.registry import validate_config
from tasks.partitioners import balanced_dirichlet_indices
from tasks.partitioning import PartitionSpec, partition_label_counts


class ScriptedDraws:
    """A stand-in for ``np.random.Generator`` whose Dirichlet draws are given and whose
    shuffles keep the order, so a split can be worked out by hand."""

    def __init__(self, shares: list[list[float]]):
        self.shares = [np.array(s) for s in shares]

    def dirichlet(self, alpha):
        return self.shares.pop(0)

    def shuffle(self, x):
        pass


def grown_after_cap(counts: np.ndarray, cap: float) -> list[tuple[int, int, int]]:
    """(client, label, count) where a client got examples of a label although it already held
    ``cap`` or more of the earlier labels (labels are handed out in increasing order), less the
    one example the code's rounding can leave to the last client: the shares of the open clients,
    renormalised, sum to 1 - 1e-16, so floor(cumsum x count) puts the last cut one short and
    a closed last client gets the label's last example (NIID-Bench's ``astype(int)`` does the
    same; 30 times in 100 MNIST draws)."""
    before = np.cumsum(counts, axis=1) - counts
    last = counts.shape[0] - 1
    return [(c, k, counts[c, k]) for c, k in zip(*np.nonzero((counts > 0) & (before >= cap)))
            if not (c == last and counts[c, k] == 1)]


# ------------------------------------------------------------------ dirichlet-balance
def test_balanced_dirichlet_matches_a_split_worked_out_by_hand():
    """30 examples, labels 0, 1, 2 (10 each, rows 0-9, 10-19, 20-29), 3 clients: N/n = 10.
    label 0, shares (1, 0, 0): cuts floor([1, 1] x 10) = [10, 10] -> client 0 rows 0-9 (10 = N/n);
    label 1, shares (0.6, 0.2, 0.2): client 0 holds 10 >= N/n, so (0, 0.2, 0.2) / 0.4 =
      (0, 0.5, 0.5), cuts [0, 5] -> client 1 rows 10-14, client 2 rows 15-19 (flwr-datasets'
      self_balancing stops a client only above N/n, '>', and would give client 0 six of them);
    label 2, shares (0.1, 0.3, 0.6): (0, 0.3, 0.6) / 0.9, cuts floor([0, 3.33]) = [0, 3] ->
      client 1 rows 20-22, client 2 rows 23-29.
    min-partition-size 9: client 1's 8 are too few, so the whole draw is redone; the second
    draw, label 0 (0.2, 0.3, 0.5) -> cuts [2, 5]; label 1 (0.5, 0.25, 0.25) (all below 10) ->
    cuts floor([5, 7.5]) = [5, 7]; label 2 (0.25, 0.5, 0.25): clients 0, 1, 2 hold 2 + 5 = 7,
    3 + 2 = 5 and 5 + 3 = 8, all open, cuts floor([2.5, 7.5]) = [2, 7]: sizes 9, 10, 11."""
    labels = np.repeat([0, 1, 2], 10)
    first = [[1.0, 0.0, 0.0], [0.6, 0.2, 0.2], [0.1, 0.3, 0.6]]
    parts = balanced_dirichlet_indices(labels, 3, 0.5, 1, ScriptedDraws(first))
    assert [p.tolist() for p in parts] == [list(range(10)), [10, 11, 12, 13, 14, 20, 21, 22],
                                           [15, 16, 17, 18, 19, *range(23, 30)]]
    second = [[0.2, 0.3, 0.5], [0.5, 0.25, 0.25], [0.25, 0.5, 0.25]]
    parts = balanced_dirichlet_indices(labels, 3, 0.5, 9, ScriptedDraws(first + second))
    assert [p.tolist() for p in parts] == [[0, 1, 10, 11, 12, 13, 14, 20, 21],
                                           [2, 3, 4, 15, 16, 22, 23, 24, 25, 26],
                                           [5, 6, 7, 8, 9, 17, 18, 19, 27, 28, 29]]


@pytest.fixture
def mnist_labels(shared_data) -> np.ndarray:
    import pyarrow.parquet as pq

    return pq.read_table(shared_data / "mnist" / "train.parquet", columns=["label"]).column(0).to_numpy()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_balanced_dirichlet_on_mnist_stays_near_n_over_clients(mnist_labels, seed):
    """MNIST's 60,000 labels, 10 clients, alpha 0.5 (NIID-Bench's Dir(0.5)): every example
    once, no client given a label after it held N/n = 6,000, and sizes in the band of the rule's
    draws (seeds 0, 1, 2: 3,447-7,878, 2,041-8,175, 4,316-7,312; over 300 seeds the smallest
    client is 2.0k-4.4k and the largest 7.3k-9.7k, 5th to 95th percentile; NIID-Bench's one
    draw was 2,792-8,707; the unbalanced split's largest is 8.2k-13.3k)."""
    parts = balanced_dirichlet_indices(mnist_labels, 10, 0.5, 10, np.random.default_rng(seed))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(mnist_labels)))
    counts = np.stack([np.bincount(mnist_labels[p], minlength=10) for p in parts])
    assert grown_after_cap(counts, 6000) == []
    sizes = counts.sum(axis=1)
    assert 2000 <= sizes.min() and sizes.max() <= 8800, sizes


def test_dirichlet_balance_through_flwr_datasets(small_mnist):
    """The key reaches the partitioner: the cut served to clients (6,000 examples, 6 clients)
    never grows a client past N/n = 1,000 with a later label, is seeded, names the key in its
    identity (left out when off, so kept runs keep theirs) and differs from the unbalanced cut."""
    cfg = validate_config({"data-dir": str(small_mnist), "partitioner": "dirichlet", "alpha": 0.5,
                           "dirichlet-balance": True})
    spec = PartitionSpec.from_config(cfg, 6)
    counts = partition_label_counts(spec)
    assert counts.sum() == 6000 and grown_after_cap(counts, 1000) == []
    assert spec.identity()["dirichlet-balance"] is True
    off = PartitionSpec.from_config({**cfg, "dirichlet-balance": False}, 6)
    assert "dirichlet-balance" not in off.identity()
    assert not np.array_equal(partition_label_counts(off), counts)


# ------------------------------------------------------------------ noise-reading
@pytest.mark.parametrize("reading,stds", [("paper", [(0.1 * (i + 1)) ** 0.5 for i in range(4)]),
                                          ("code", [0.0, 0.4 / 3, 0.8 / 3, 0.4])])
def test_noise_std_per_client_under_both_readings(reading, stds):
    """sigma 0.4, 4 clients: the paper's variance 0.4 (i + 1) / 4 (std sqrt(0.1 (i + 1))); the
    code's std 0.4 i / 3, partition 0 clean and the last one 0.4."""
    from tasks.feature_noise import noise_std, noise_variance

    spec = PartitionSpec(dataset="mnist", num_partitions=4, noise_sigma=0.4, noise_reading=reading)
    assert [noise_std(0.4, reading, i, 4) for i in range(4)] == pytest.approx(stds)
    assert [noise_variance(spec, i) for i in range(4)] == pytest.approx([noise_std(0.4, reading, i, 4) ** 2
                                                                         for i in range(4)])


def code_noise_cfg(data_dir, **keys) -> dict:
    return validate_config({"data-dir": str(data_dir), "partitioner": "iid", "noise-sigma": 0.4,
                            "noise-reading": "code", "model": "cnn-small", **keys})


def test_code_noise_is_drawn_per_batch_with_the_codes_std(small_mnist):
    """Under the code's reading the partition's tensors are clean (the paper's reading noises
    them once), and each client's augmentation adds noise of pixel std 0.4 p / 3 to every batch,
    a fresh draw each time (two batches of the same images differ), seeded by (seed, partition,
    round); partition 0 gets no noise op at all."""
    import torch

    from tasks.augment import Augment
    from tasks.catalogue import DATASETS
    from tasks.partitioning import load_partition

    cfg = code_noise_cfg(small_mnist)
    clean = PartitionSpec.from_config({**cfg, "noise-sigma": 0.0}, 4)
    code = PartitionSpec.from_config(cfg, 4)
    assert code.identity()["noise-reading"] == "code"
    assert torch.equal(load_partition(code, 2)[0], load_partition(clean, 2)[0])
    std = DATASETS["mnist"].std[0]
    x = torch.zeros(512, 1, 28, 28)
    assert Augment.for_round(cfg, torch.device("cpu"), 0, 1, 4).ops == ()
    for pid in (1, 2, 3):
        augment = Augment.for_round(cfg, torch.device("cpu"), pid, 1, 4)
        first, second = augment(x), augment(x)
        assert (first * std).std().item() == pytest.approx(0.4 * pid / 3, rel=0.01)
        assert not torch.equal(first, second)
        assert torch.equal(Augment.for_round(cfg, torch.device("cpu"), pid, 1, 4)(x), first)
        assert not torch.equal(Augment.for_round(cfg, torch.device("cpu"), pid, 2, 4)(x), first)
    assert Augment.for_round(cfg, torch.device("cpu"), 3, 1, None).ops == ()  # a node's own data: no noise


def test_code_noise_reaches_both_execution_paths(small_mnist):
    """A virtual client prepared by a cohort node (``cohort_client.prepare``) and the per-client
    node of the same partition prepare the same augmentation callable (op noise, the same draws)."""
    import torch

    from clients import fedavg
    from fl_app.node.client_state import ClientStateStore
    from fl_app.node.cohort_client import prepare
    from fl_app.node.drift_client import DriftClient
    from protocol.cohort import NUM_PARTITIONS
    from tasks.models import get_weights
    from tests.kit import fake_context

    cfg = code_noise_cfg(small_mnist)
    alone = DriftClient(fedavg.UPDATE, cfg, fake_context(cfg), 3, 4)
    weights = get_weights(alone.model)
    failed: dict = {}
    (member,) = prepare(fedavg.UPDATE, cfg, [(3, weights, {NUM_PARTITIONS: 4, "server-round": 2})],
                        ClientStateStore(), failed)
    jobs = [member.job, alone.prepare_round(weights, {"server-round": 2})]
    assert not failed and [j.augment.ops for j in jobs] == [("noise",), ("noise",)]
    x = alone.data[0][:64]
    assert torch.equal(jobs[0].augment(x), jobs[1].augment(x)) and not torch.equal(jobs[0].augment(x), x)


# ------------------------------------------------------------------ simple-cnn
def test_simple_cnn_parameter_counts_match_a_hand_count():
    """NIID-Bench's SimpleCNNMNIST (28x28, 1 channel): conv1 1*6*25 + 6 = 156, conv2 6*16*25 + 16 =
    2,416, fc1 (16*4*4 = 256)*120 + 120 = 30,840, fc2 120*84 + 84 = 10,164, fc3 84*10 + 10 = 850:
    44,426. Its SimpleCNN (32x32, 3 channels): conv1 3*6*25 + 6 = 456, conv2 2,416, fc1
    (16*5*5 = 400)*120 + 120 = 48,120, fc2 10,164, fc3 850: 62,006. No buffers either way."""
    from tasks.datasets import input_shape
    from tasks.models import build_model

    for dataset, count in (("mnist", 44_426), ("fashion_mnist", 44_426), ("cifar10", 62_006)):
        model = build_model("simple-cnn", input_shape(dataset))
        assert sum(p.numel() for p in model.parameters()) == count
        assert not list(model.buffers())


@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
def test_simple_cnn_sees_raw_pixels(dataset):
    """fl-drift hands every model normalised inputs; simple-cnn undoes it, so on 32x32 inputs
    (where its layers are lenet's, the same draws initialising them) it gives on the normalised
    images what lenet gives on the raw [0, 1] pixels, as NIID-Bench's ToTensor-only loaders."""
    import torch

    from tasks.catalogue import DATASETS
    from tasks.datasets import input_shape
    from tasks.models import build_model

    info, shape = DATASETS[dataset], input_shape(dataset)
    raw = torch.rand(5, shape.channels, shape.size, shape.size)
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in (info.mean, info.std))
    model = build_model("simple-cnn", shape, seed=0)
    torch.testing.assert_close(model.body[0]((raw - mean) / std), raw)
    if dataset == "cifar10":
        lenet = build_model("lenet", shape, seed=0)
        torch.testing.assert_close(model((raw - mean) / std), lenet(raw))


def test_simple_cnn_trains_alike_in_a_cohort_and_alone():
    """The cohort's vmap over simple-cnn (its RawPixels first) equals each client's own round."""
    from tasks.datasets import input_shape
    from tests.kit_training import compare_cohort

    compare_cohort("fedavg", "simple-cnn", [12, 6], 4, rel=1e-5, shape=input_shape("mnist"))
