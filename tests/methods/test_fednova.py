"""FedNova: aggregate of clients with different step counts vs the hand formula."""


import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays
from flwr.server.strategy import FedAvg

from clients import fednova
from strategies.fednova import FedNovaStrategy, normaliser
from tests.kit import fit_res, make_client


def _round(momentum):
    rng = np.random.default_rng(0)
    w_t = [rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(2).astype(np.float32)]
    clients = [[(a + rng.standard_normal(a.shape)).astype(np.float32) for a in w_t] for _ in range(3)]
    n, tau = [10, 20, 70], [2, 5, 40]
    results = [(None, fit_res(c, nk, num_steps=t, train_loss=1.0)) for c, nk, t in zip(clients, n, tau)]
    strategy = FedNovaStrategy(momentum=momentum, trainable=[True, False])
    strategy.global_weights = w_t
    params, metrics = strategy.aggregate_fit(1, results, [])
    return w_t, clients, n, tau, results, parameters_to_ndarrays(params), metrics


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fednova_matches_hand_formula_and_differs_from_fedavg(momentum):
    w_t, clients, n, tau, results, new, metrics = _round(momentum)
    p = np.array(n) / sum(n)
    if momentum == 0:
        a = np.array(tau, dtype=float)
    else:  # a_k = sum_{s=1}^{tau} (1 - rho^s) / (1 - rho), written out as a double loop
        a = np.array([sum(sum(momentum**j for j in range(s)) for s in range(1, t + 1)) for t in tau])
    tau_eff = (p * a).sum()
    d = sum(pk * (w_t[0].astype(np.float64) - c[0]) / ak for pk, ak, c in zip(p, a, clients))
    np.testing.assert_allclose(new[0], w_t[0] - tau_eff * d, atol=1e-5)
    # buffers: plain n_k-weighted mean
    np.testing.assert_allclose(new[1], sum(pk * c[1] for pk, c in zip(p, clients)), atol=1e-5)
    assert np.isclose(metrics["fednova_tau_eff"], tau_eff)
    fedavg, _ = FedAvg().aggregate_fit(1, results, [])
    assert not np.allclose(parameters_to_ndarrays(fedavg)[0], new[0], atol=1e-3)


def test_fednova_equal_steps_is_fedavg():
    rng = np.random.default_rng(3)
    w_t = [rng.standard_normal(4).astype(np.float32)]
    clients = [[(w_t[0] + rng.standard_normal(4)).astype(np.float32)] for _ in range(2)]
    results = [(None, fit_res(c, nk, num_steps=7)) for c, nk in zip(clients, (5, 15))]
    strategy = FedNovaStrategy(momentum=0.0, trainable=[True])
    strategy.global_weights = w_t
    new = parameters_to_ndarrays(strategy.aggregate_fit(1, results, [])[0])
    fedavg = parameters_to_ndarrays(FedAvg().aggregate_fit(1, results, [])[0])
    np.testing.assert_allclose(new[0], fedavg[0], atol=1e-5)


def test_normaliser_and_client_reports_steps():
    assert normaliser(3, 0.0) == 3
    assert np.isclose(normaliser(3, 0.5), 1 + 1.5 + 1.75)
    x, y = torch.randn(10, 60), torch.arange(10) % 10
    client = make_client(fednova.UPDATE, {"strategy": "fednova", "batch-size": 4, "local-epochs": 2}, x, y)
    _, _, metrics = client.fit(client.get_parameters({}), {"server-round": 1})
    assert metrics["num_steps"] == 6  # ceil(10 / 4) * 2
