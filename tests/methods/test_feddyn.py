"""FedDyn: client gradient state and server state h against a hand computation, 2 rounds."""


import numpy as np
import torch
from flwr.common import parameters_to_ndarrays

from clients import feddyn
from strategies.feddyn import FedDynStrategy
from tests.kit import fit_res, make_client
from tests.kit_training import softmax_regression_grad


def test_feddyn_client_two_rounds_match_hand_computation():
    torch.manual_seed(0)
    x, y = torch.randn(4, 60), torch.tensor([0, 1, 2, 3])
    lr, alpha, steps = 0.5, 0.3, 2
    client = make_client(
        feddyn.UPDATE,
        {"strategy": "feddyn", "feddyn-alpha": alpha, "learning-rate": lr, "batch-size": 4, "local-epochs": steps},
        x, y,
    )
    xn, yn = x.numpy().astype(np.float64), y.numpy()
    w_round1 = [a.copy() for a in client.get_parameters({})]
    rng = np.random.default_rng(1)
    w_round2 = [(a + 0.3 * rng.standard_normal(a.shape)).astype(np.float32) for a in w_round1]

    g = [np.zeros_like(a, dtype=np.float64) for a in w_round1]  # g_k starts at zero
    for server_round, w_t in ((1, w_round1), (2, w_round2)):
        out, _, metrics = client.fit([a.copy() for a in w_t], {"server-round": server_round})
        # Hand: full-batch steps on CE - <g, w> + (alpha/2)||w - w_t||^2.
        W, b = w_t[0].astype(np.float64), w_t[1].astype(np.float64)
        for _ in range(steps):
            gW, gb = softmax_regression_grad(xn, yn, W, b)
            W = W - lr * (gW - g[0] + alpha * (W - w_t[0]))
            b = b - lr * (gb - g[1] + alpha * (b - w_t[1]))
        np.testing.assert_allclose(out[0], W, atol=1e-5)
        np.testing.assert_allclose(out[1], b, atol=1e-5)
        # g_k <- g_k - alpha (w_k - w_t)
        g = [g[0] - alpha * (W - w_t[0]), g[1] - alpha * (b - w_t[1])]
        saved = client.load_state(feddyn.GRAD.record)  # g_k in named_parameters order
        np.testing.assert_allclose(saved[0], g[0], atol=1e-6)
        np.testing.assert_allclose(saved[1], g[1], atol=1e-6)
        assert metrics["feddyn_grad_norm"] > 0
    # Round 2 really used a non-zero g (the linear term acts): it must differ from g = 0.
    fresh = make_client(
        feddyn.UPDATE,
        {"strategy": "feddyn", "feddyn-alpha": alpha, "learning-rate": lr, "batch-size": 4, "local-epochs": steps},
        x, y,
    )
    no_state, _, _ = fresh.fit([a.copy() for a in w_round2], {"server-round": 2})
    assert not np.allclose(no_state[0], out[0], atol=1e-5)


def feddyn_server(alpha: float, trainable: list[bool]) -> FedDynStrategy:
    """FedDyn's server for a model whose state entries are ``trainable`` (True) or buffers."""
    memory = FedDynStrategy.SERVER.parts["memory"].part(trainable, alpha)
    return FedDynStrategy(parts={"memory": memory}, num_state=len(trainable))


def test_feddyn_server_h_and_weights_two_rounds():
    alpha, n_total = 0.1, 5
    strategy = feddyn_server(alpha, [True, False])  # a weight and a buffer
    rng = np.random.default_rng(0)
    w_t = [rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
    h = np.zeros((3, 2))
    for server_round in (1, 2):
        clients = [[(a + rng.standard_normal(a.shape)).astype(np.float32) for a in w_t] for _ in range(2)]
        strategy.global_weights, strategy.num_clients = w_t, n_total
        results = [(None, fit_res(c, n)) for c, n in zip(clients, (10, 30))]  # n_k must not matter
        params, metrics = strategy.aggregate_fit(server_round, results, [])
        new = parameters_to_ndarrays(params)
        W = [c[0].astype(np.float64) for c in clients]
        h = h - alpha / n_total * sum(w - w_t[0] for w in W)
        np.testing.assert_allclose(new[0], np.mean(W, axis=0) - h / alpha, atol=1e-5)
        np.testing.assert_allclose(new[1], np.mean([c[1] for c in clients], axis=0), atol=1e-6)
        np.testing.assert_allclose(strategy.memory.h[0], h, atol=1e-6)
        assert np.isclose(metrics["feddyn_h_norm"], np.linalg.norm(h))
        w_t = new


def test_feddyn_state_round_trip():
    strategy = feddyn_server(0.1, [True])
    assert strategy.get_state() == {}
    strategy.set_state({"feddyn-h": [np.ones(3)]})
    np.testing.assert_array_equal(strategy.get_state()["feddyn-h"][0], np.ones(3))
