"""CCVR (clients/ccvr.py, strategies/ccvr.py): the statistics a client sends for a tiny feature set
by hand (both covariances), the calibration round's reply (no step, w_t and the statistics of its
features) and a training round's (empty groups), the server's pooled mean and covariance by hand,
the virtual features and the head's retraining by hand, a calibration with a fixed seed changing
the head only (and nothing outside the calibration round), every client asked in that round, the
cohort path, bad keys refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from clients import ccvr
from fl_app.node.node_client import NodeClient
from fl_app.registry import validate_config
from protocol.keys import ConfigError
from strategies.base import fedavg_kwargs
from strategies.ccvr import CCVRStrategy, HeadCalibration, pooled_statistics, retrained_head, virtual_features
from strategies.parts import Replies
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import FakeManager, Proxy, assert_cohort_equals_per_client, fake_context, initial_weights, make_client
from tests.kit_server import RoundByRound

# Five 2-d features: class 0 has three, class 1 two, class 2 none.
Z = torch.tensor([[1.0, 2.0], [3.0, 2.0], [2.0, 5.0], [0.0, 1.0], [4.0, -1.0]], dtype=torch.float64)
Y = torch.tensor([0, 0, 0, 1, 1])


def test_the_statistics_a_client_sends_by_hand():
    stats = ccvr.class_statistics(Z, Y, 3, "unbiased")
    assert stats["counts"].tolist() == [3.0, 2.0, 0.0]
    torch.testing.assert_close(stats["means"], torch.tensor([[2.0, 3.0], [2.0, 0.0], [0.0, 0.0]], dtype=torch.float64))
    # class 0: deviations (-1, -1), (1, -1), (0, 2): scatter [[2, 0], [0, 6]], / 2; class 1: (-2, 1), (2, -1):
    # scatter [[8, -4], [-4, 2]], / 1
    want = torch.tensor([[[1.0, 0.0], [0.0, 3.0]], [[8.0, -4.0], [-4.0, 2.0]], [[0.0, 0.0], [0.0, 0.0]]],
                        dtype=torch.float64)
    torch.testing.assert_close(stats["covs"], want, rtol=0, atol=1e-15)
    population = ccvr.class_statistics(Z, Y, 3, "population")["covs"]
    torch.testing.assert_close(population[0], want[0] * 2 / 3, rtol=0, atol=1e-15)
    torch.testing.assert_close(population[1], want[1] / 2, rtol=0, atol=1e-15)
    single = ccvr.class_statistics(Z[:1], Y[:1], 3, "unbiased")
    assert single["counts"][0] == 1 and not single["covs"].any()  # one example: no spread


def client_data(n: int = 18, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 60, generator=g), torch.arange(n) % 4


def test_the_calibration_round_trains_no_step_and_sends_the_statistics_of_w_t():
    x, y = client_data()
    client = make_client(ccvr.UPDATE, {"num-server-rounds": 3, "learning-rate": 0.1, "batch-size": 4}, x, y)
    w0 = initial_weights(client, seed=1)
    reply, n, metrics = client.fit([a.copy() for a in w0], {"server-round": 3})
    assert n == 18 and metrics["num_steps"] == 0
    for got, sent in zip(reply[:2], w0):
        np.testing.assert_array_equal(got, sent)
    counts, means, covs = reply[2:]
    z = x.double().numpy()  # logreg's body is Flatten: the features are the inputs
    assert counts.tolist() == [5, 5, 4, 4, 0, 0, 0, 0, 0, 0]
    for c in range(4):
        np.testing.assert_allclose(means[c], z[y.numpy() == c].mean(axis=0), rtol=0, atol=1e-12)
        np.testing.assert_allclose(covs[c], np.cov(z[y.numpy() == c].T, ddof=1), rtol=0, atol=1e-12)
    assert means.dtype == covs.dtype == np.float64 and not covs[4:].any()


def test_a_training_round_is_fedavg_with_empty_statistics():
    x, y = client_data()
    over = {"num-server-rounds": 3, "learning-rate": 0.1, "batch-size": 4}
    w0 = initial_weights(make_client(ccvr.UPDATE, over, x, y), seed=1)
    reply, _, metrics = make_client(ccvr.UPDATE, over, x, y).fit([a.copy() for a in w0], {"server-round": 2})
    plain, _, _ = make_client("fedavg", {k: v for k, v in over.items() if k != "num-server-rounds"}, x, y).fit(
        [a.copy() for a in w0], {"server-round": 2})
    assert metrics["num_steps"] == 5 and [a.size for a in reply[2:]] == [0, 0, 0]
    for got, want in zip(reply[:2], plain):
        np.testing.assert_array_equal(got, want)


def test_the_pooled_mean_and_covariance_by_hand():
    """Two clients' unbiased statistics pool to the statistics of all their features at once
    (Eq. (5)-(6) exactly): client A holds the first three samples of Z, client B the other two
    plus two of class 1 ((1, 1) and (3, 3))."""
    za, ya = Z[:3], Y[:3]
    zb = torch.cat([Z[3:], torch.tensor([[1.0, 1.0], [3.0, 3.0]], dtype=torch.float64)])
    yb = torch.tensor([1, 1, 1, 1])
    stats = [ccvr.class_statistics(z, y, 3, "unbiased") for z, y in ((za, ya), (zb, yb))]
    total, mean, cov = pooled_statistics(*([s[k].numpy() for s in stats] for k in ("counts", "means", "covs")))
    assert total.tolist() == [3.0, 4.0, 0.0]
    class1 = zb.numpy()  # all of class 1: (0, 1), (4, -1), (1, 1), (3, 3)
    np.testing.assert_allclose(mean[1], [2.0, 1.0], rtol=0, atol=1e-15)
    # deviations (-2, 0), (2, -2), (-1, 0), (1, 2): scatter [[10, -2], [-2, 8]], / 3
    np.testing.assert_allclose(cov[1], np.array([[10.0, -2.0], [-2.0, 8.0]]) / 3, rtol=0, atol=1e-14)
    np.testing.assert_allclose(cov[1], np.cov(class1.T, ddof=1), rtol=0, atol=1e-14)
    np.testing.assert_allclose(cov[0], [[1.0, 0.0], [0.0, 3.0]], rtol=0, atol=1e-14)  # one client: its own
    assert not mean[2].any() and not cov[2].any()
    population = [ccvr.class_statistics(z, y, 3, "population") for z, y in ((za, ya), (zb, yb))]
    _, _, fl_bench = pooled_statistics(*([s[k].numpy() for s in population] for k in ("counts", "means", "covs")))
    assert np.abs(fl_bench[1] - cov[1]).max() > 0.1  # the population reading pools to another covariance


def test_virtual_features_and_the_head_retraining_by_hand():
    mean, cov = np.array([1.0, -2.0]), np.array([[4.0, 0.0], [0.0, 1.0]])
    draws = virtual_features(mean, cov, 3, np.random.default_rng(7))
    eps = np.random.default_rng(7).standard_normal((3, 2))
    # eigh orders the eigenvalues 1, 4 (vectors e_2, e_1): V sqrt(L) = [[0, 2], [1, 0]]
    np.testing.assert_allclose(draws, mean + eps[:, ::-1] * [2.0, 1.0], rtol=0, atol=1e-14)
    many = virtual_features(mean, np.array([[2.0, 1.0], [1.0, 1.0]]), 20000, np.random.default_rng(0))
    np.testing.assert_allclose(np.cov(many.T), [[2.0, 1.0], [1.0, 1.0]], atol=0.05)

    z, y = np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([0, 1])
    w, b = np.array([[0.5, -0.5], [0.0, 1.0]]), np.array([0.1, -0.1])
    got_w, got_b = retrained_head(w, b, z, y, 1, 2, 0.3, np.random.default_rng(0))
    logits = z @ w.T + b  # [[0.6, -0.1], [-0.9, 1.9]]
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    g = (p - np.eye(2)[y]) / 2
    np.testing.assert_allclose(got_w, w - 0.3 * g.T @ z, rtol=0, atol=1e-15)
    np.testing.assert_allclose(got_b, b - 0.3 * g.sum(axis=0), rtol=0, atol=1e-15)


def replies_of(weights, stats, server_round):
    return Replies([weights] * len(stats), [{"class_stats": [s[k].numpy() for k in ("counts", "means", "covs")]}
                                            for s in stats], len(stats), len(stats), weights, [5] * len(stats),
                   server_round)


def test_a_calibration_with_a_fixed_seed_changes_the_head_only():
    model = build_model("mlp", input_shape("synthetic"), seed=1)
    w = get_weights(model)
    g = torch.Generator().manual_seed(0)
    stats = [ccvr.class_statistics(torch.randn(30, 64, generator=g, dtype=torch.float64), torch.arange(30) % 3, 10,
                                   "unbiased") for _ in range(2)]
    part = HeadCalibration(2, 3, num_rounds=4, samples=50, epochs=2, lr=0.5, batch_size=16, seed=3)
    assert part.revise(w, replies_of(w, stats, 3)) is w and part.metrics()["ccvr_virtual_features"] == 0
    new = part.revise(w, replies_of(w, stats, 4))
    for i in (0, 1):
        np.testing.assert_array_equal(new[i], w[i])
    assert np.abs(new[2] - w[2]).max() > 1e-3 and np.abs(new[3] - w[3]).max() > 1e-3
    assert new[2].dtype == w[2].dtype and part.metrics()["ccvr_virtual_features"] == 150
    again = HeadCalibration(2, 3, num_rounds=4, samples=50, epochs=2, lr=0.5, batch_size=16, seed=3)
    for a, b in zip(again.revise(w, replies_of(w, stats, 4)), new):
        np.testing.assert_array_equal(a, b)  # the same seed: the same head
    # the head by hand: the pooled statistics, the draws and the order of the generator seeded (3, 4)
    total, mean, cov = pooled_statistics(*([s[k].numpy() for s in stats] for k in ("counts", "means", "covs")))
    rng = np.random.default_rng([3, 4])
    z = np.concatenate([virtual_features(mean[c], cov[c], 50, rng) for c in range(3)])
    hw, hb = retrained_head(w[2], w[3], z, np.repeat([0, 1, 2], 50), 2, 16, 0.5, rng)
    np.testing.assert_allclose(new[2], hw, rtol=0, atol=1e-6)
    np.testing.assert_allclose(new[3], hb, rtol=0, atol=1e-6)


def test_two_rounds_fedavg_then_the_calibration_of_every_client(tmp_path):
    sizes = [12, 20, 16, 10]
    cfg = validate_config({"strategy": "ccvr", "dataset": "synthetic", "model": "mlp", "fraction-fit": 0.5,
                           "min-fit-clients": 2, "min-available-clients": 4, "learning-rate": 0.1, "batch-size": 8,
                           "num-server-rounds": 2, "ccvr-lr": 0.5})
    w = get_weights(build_model("mlp", input_shape("synthetic"), seed=1))
    inner = CCVRStrategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w), None))
    strategy = RoundByRound(inner, cfg, tmp_path, num_rounds=2)
    manager = FakeManager(4)
    nodes = {str(k): Proxy(str(k), NodeClient(make_client(ccvr.UPDATE, dict(cfg), *client_data(n, seed=k),
                                                          fake_context()))) for k, n in enumerate(sizes)}
    for t, asked in ((1, 2), (2, 4)):
        instructions = strategy.configure_fit(t, ndarrays_to_parameters(w), manager)
        assert len(instructions) == asked  # every client in the calibration round
        results = [(nodes[p.cid], nodes[p.cid].fit(ins, None, None)) for p, ins in instructions]
        new, metrics = strategy.aggregate_fit(t, results, [])
        replies = [parameters_to_ndarrays(r.parameters) for _, r in results]
        got = parameters_to_ndarrays(new)
        n = [sizes[int(p.cid)] for p, _ in instructions]
        mean = [sum(k * r[i].astype(np.float64) for k, r in zip(n, replies)) / sum(n) for i in range(4)]
        np.testing.assert_allclose(got[0], mean[0], rtol=1e-6, atol=1e-7)  # the body: FedAvg's mean
        if t == 1:
            np.testing.assert_allclose(got[2], mean[2], rtol=1e-6, atol=1e-7)
            assert metrics["ccvr_virtual_features"] == 0
        else:
            np.testing.assert_allclose(got[0], w[0], rtol=1e-6, atol=1e-7)  # no step in the calibration round
            assert np.abs(got[2] - mean[2]).max() > 1e-3 and metrics["ccvr_head_change"] > 0
            assert metrics["ccvr_virtual_features"] == 4 * 100  # the 4 classes the clients hold
        w = got


def test_per_client_and_cohort_paths_agree():
    over = {"learning-rate": 0.1, "momentum": 0.9, "batch-size": 8, "local-epochs": 2, "num-server-rounds": 5}
    clients = [make_client(ccvr.UPDATE, over, *client_data(n, seed=k), partition=k, num_partitions=3)
               for k, n in enumerate((20, 13, 28))]
    assert_cohort_equals_per_client(clients, initial_weights(clients[0], seed=1))


@pytest.mark.parametrize(("key", "value"), [("ccvr-samples", 0), ("ccvr-epochs", 0), ("ccvr-lr", 0.0),
                                            ("ccvr-clients", "half"), ("ccvr-covariance", "biased")])
def test_bad_keys_are_refused(key, value):
    with pytest.raises(ConfigError, match=key):
        validate_config({"strategy": "ccvr", "dataset": "synthetic", "model": "logreg", key: value})


def test_a_reply_may_carry_groups_that_answer_nothing_sent():
    """The server's reply check (``protocol.layout.reply_problem``) with ``more``: the arrays sent
    keep their shapes, the statistics after them are the strategy's split's to count."""
    from protocol.layout import reply_problem

    sent = [(2,), (3,)]
    reply = [np.zeros(2), np.zeros(3), np.zeros(0), np.zeros((4, 2)), np.zeros((4, 2, 2))]
    assert reply_problem(reply, sent, more=True) == ""
    assert reply_problem(reply, sent) == "5 arrays, expected 2"
    assert reply_problem(reply[:1], sent, more=True) == "1 arrays, expected at least 2"
    assert reply_problem([np.zeros(3), *reply[1:]], sent, more=True) == "array 0 has shape (3,), expected (2,)"
