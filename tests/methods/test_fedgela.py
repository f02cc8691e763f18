"""FedGELA (clients/fedgela.py): the simplex ETF's geometry, the adapted local step by hand in
float64 (an MLP body under the fixed head), the reply's head set back to the fixed head under
weight decay, each term acting (the adaptation, the fixed head: neither is FedAvg), two rounds on
the server keeping the ETF head, the cohort path against the per-client path, bad keys refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from clients import fedavg, fedgela
from fl_app.node.node_client import NodeClient
from fl_app.registry import validate_config
from protocol.keys import ConfigError
from strategies.base import DriftFedAvg, fedavg_kwargs
from tasks.datasets import input_shape
from tasks.functional.rounds import local_round
from tasks.models import build_model, get_weights
from tests.kit import Proxy, assert_cohort_equals_per_client, fake_context, in_float64, initial_weights, make_client
from tests.kit_server import RoundByRound

TAU = 0.5


def data(n: int = 12, seed: int = 0, classes: tuple[int, ...] = (0, 1, 2)):
    """n synthetic samples (60 features) whose labels cycle through ``classes``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 60, generator=g)
    y = torch.tensor([classes[i % len(classes)] for i in range(n)])
    return x, y


def test_the_etf_has_unit_columns_at_equal_angles_and_comes_from_the_seed():
    m = fedgela.simplex_etf(7, 4, seed=3)
    assert m.shape == (7, 4) and m.dtype == torch.float64
    want = 4 / 3 * (torch.eye(4, dtype=torch.float64) - 0.25)  # diagonal 1, off-diagonal -1/3
    torch.testing.assert_close(m.T @ m, want, rtol=0, atol=1e-14)
    torch.testing.assert_close(m.sum(dim=1), torch.zeros(7, dtype=torch.float64), rtol=0, atol=1e-14)
    assert torch.equal(m, fedgela.simplex_etf(7, 4, seed=3))
    assert not torch.allclose(m, fedgela.simplex_etf(7, 4, seed=4))
    with pytest.raises(ValueError, match="feature width >= 10; the model's head has 6 inputs"):
        fedgela.simplex_etf(6, 10, seed=0)


def test_adaptation_by_hand():
    counts = torch.tensor([6.0, 3.0, 3.0, 0.0])
    assert fedgela.adaptation(counts, "class-share").tolist() == [2.0, 1.0, 1.0, 0.0]  # 4 n_c / 12
    assert fedgela.adaptation(counts, "none").tolist() == [1.0, 1.0, 1.0, 1.0]


def hand_round(w1, b1, head, scale, x, y, lr, steps):
    """``steps`` full-batch plain-SGD steps of the MLP body (W1, b1) under the fixed head, in
    float64: h = relu(x W1^T + b1), z = scale * (h head^T), CE's gradient written out."""
    losses = []
    for _ in range(steps):
        pre = x @ w1.T + b1
        h = np.maximum(pre, 0.0)
        z = scale * (h @ head.T)
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        losses.append(float(-np.log(p[np.arange(len(y)), y]).mean()))
        g_z = (p - np.eye(head.shape[0])[y]) / len(y)
        g_pre = ((g_z * scale) @ head) * (pre > 0)
        w1, b1 = w1 - lr * g_pre.T @ x, b1 - lr * g_pre.sum(axis=0)
    return w1, b1, losses


@pytest.mark.parametrize("mode", fedgela.ADAPTATIONS)
def test_local_round_by_hand_in_float64(mode):
    """Two full-batch steps on a client holding classes 0, 1, 2 (counts 6, 3, 3 of 12: phi = 10 n_c / 12 =
    5, 2.5, 2.5 and 0 for the seven missing classes, or 1 everywhere): the body moves as the
    adapted CE's gradient says, the head does not move."""
    x, y = data(12, classes=(0, 0, 1, 2))
    client = make_client(fedgela.UPDATE, {"model": "mlp", "learning-rate": 0.3, "batch-size": 64, "local-epochs": 2,
                                          "fedgela-temperature": TAU, "fedgela-adaptation": mode, "seed": 5}, x, y)
    w0 = initial_weights(client, seed=1)
    (job,) = in_float64([client.prepare_round([a.copy() for a in w0], {"server-round": 1})])
    result = local_round(job)
    head = fedgela.simplex_etf(64, 10, seed=5).numpy().T
    phi = np.array([5.0, 2.5, 2.5] + [0.0] * 7) if mode == "class-share" else np.ones(10)
    w1, b1, losses = hand_round(w0[0].astype(np.float64), w0[1].astype(np.float64), head, phi / TAU,
                                x.double().numpy(), y.numpy(), 0.3, 2)
    np.testing.assert_allclose(result.params["body.1.weight"].numpy(), w1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.params["body.1.bias"].numpy(), b1, rtol=0, atol=1e-12)
    assert torch.equal(result.params["head.weight"], job.params["head.weight"])  # no gradient into the head
    assert result.metrics["train_loss"] == pytest.approx(np.mean(losses), rel=1e-6)
    assert np.abs(w1 - w0[0]).max() > 1e-3  # the body trained


def test_the_reply_carries_the_fixed_head_whatever_weight_decay_did():
    x, y = data(16)
    client = make_client(fedgela.UPDATE, {"model": "mlp", "learning-rate": 0.1, "momentum": 0.9,
                                          "weight-decay": 0.1, "batch-size": 8, "fedgela-temperature": TAU}, x, y)
    w0 = initial_weights(client, seed=1)
    reply, _, _ = client.fit([a.copy() for a in w0], {"server-round": 1})
    np.testing.assert_array_equal(reply[2], fedgela.simplex_etf(64, 10, seed=0).T.float().numpy())
    np.testing.assert_array_equal(reply[3], np.zeros(10, dtype=np.float32))
    assert np.abs(reply[0] - w0[0]).max() > 1e-3


def test_each_term_acts():
    """The adaptation (class-share against none) and the fixed head (none against FedAvg's own
    trained head) each change the client's body."""
    x, y = data(16, classes=(0, 0, 0, 4))
    over = {"model": "mlp", "learning-rate": 0.2, "batch-size": 8, "fedgela-temperature": TAU}
    w0 = initial_weights(make_client(fedavg.UPDATE, over, x, y), seed=1)

    def body(update, **keys):
        reply, _, _ = make_client(update, {**over, **keys}, x, y).fit([a.copy() for a in w0], {"server-round": 1})
        return reply[0]

    adapted, fixed, plain = body(fedgela.UPDATE), body(fedgela.UPDATE, **{"fedgela-adaptation": "none"}), \
        body(fedavg.UPDATE)
    assert np.abs(adapted - fixed).max() > 1e-3 and np.abs(fixed - plain).max() > 1e-3


def test_per_client_and_cohort_paths_agree():
    over = {"model": "mlp", "learning-rate": 0.1, "momentum": 0.9, "weight-decay": 1e-3, "batch-size": 8,
            "local-epochs": 2}
    clients = [make_client(fedgela.UPDATE, over, *data(n, seed=k, classes=c), partition=k, num_partitions=3)
               for k, (n, c) in enumerate([(20, (0, 1)), (13, (2, 3, 4)), (28, (5,))])]
    assert_cohort_equals_per_client(clients, initial_weights(clients[0], seed=1))


class Everyone:
    """A client manager that samples every client, in order."""

    def __init__(self, nodes):
        self.nodes = nodes

    def num_available(self):
        return len(self.nodes)

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return list(self.nodes)


def test_two_rounds_keep_the_fixed_head_and_average_the_bodies(tmp_path):
    sizes = [12, 20, 16]
    cfg = validate_config({"strategy": "fedgela", "dataset": "synthetic", "model": "mlp", "fraction-fit": 1.0,
                           "min-fit-clients": 3, "min-available-clients": 3, "learning-rate": 0.1, "batch-size": 8,
                           "weight-decay": 0.01, "num-server-rounds": 2, "fedgela-temperature": TAU})
    w = get_weights(build_model("mlp", input_shape("synthetic"), seed=1))
    inner = DriftFedAvg.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w), None))
    strategy = RoundByRound(inner, cfg, tmp_path, num_rounds=2)
    nodes = [Proxy(str(k), NodeClient(make_client(fedgela.UPDATE, dict(cfg), *data(n, seed=10 + k, classes=(k, k + 3)),
                                                  fake_context()))) for k, n in enumerate(sizes)]
    head = fedgela.simplex_etf(64, 10, seed=cfg["seed"]).T.float().numpy()
    for t in (1, 2):
        instructions = strategy.configure_fit(t, ndarrays_to_parameters(w), Everyone(nodes))
        results = [(node, node.fit(ins, None, None)) for node, ins in instructions]
        new, _ = strategy.aggregate_fit(t, results, [])
        replies = [parameters_to_ndarrays(r.parameters) for _, r in results]
        w = parameters_to_ndarrays(new)
        body = sum(n * r[0].astype(np.float64) for n, r in zip(sizes, replies)) / sum(sizes)
        np.testing.assert_allclose(w[0], body, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(w[2], head, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(w[3], 0.0, atol=1e-7)


@pytest.mark.parametrize(("key", "value"), [("fedgela-temperature", 0.0), ("fedgela-adaptation", "count")])
def test_bad_keys_are_refused(key, value):
    with pytest.raises(ConfigError, match=key):
        validate_config({"strategy": "fedgela", "dataset": "synthetic", "model": "mlp", key: value})


def test_a_model_without_body_parameters_is_refused_before_training():
    """logreg's body is the identity: FedGELA, which trains the body alone, would have nothing to
    train (a cryptic autograd error in the first fit before this refusal)."""
    from fl_app.registry import get_method, validate_config
    from protocol.keys import ConfigError

    cfg = validate_config({"strategy": "fedgela", "dataset": "synthetic", "model": "logreg"})
    with pytest.raises(ConfigError, match=r"'model' = 'logreg' is invalid for strategy 'fedgela'.*valid choices: mlp$"):
        get_method("fedgela").strategy.from_config(cfg)
    get_method("fedgela").strategy.from_config(validate_config({"strategy": "fedgela", "dataset": "synthetic",
                                                                "model": "mlp"}))
