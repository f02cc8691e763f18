"""FedProx: the client's gradient gets mu * (w - w_t), checked against a hand computation."""


import numpy as np
import torch

from clients import fedprox
from strategies.fedprox import FedProxStrategy
from tests.kit import make_client


def test_fedprox_step_matches_hand_computation():
    torch.manual_seed(0)
    x, y = torch.randn(4, 60), torch.tensor([0, 1, 2, 3])
    lr, mu = 0.5, 0.7
    client = make_client(fedprox.UPDATE, {"learning-rate": lr, "batch-size": 4, "local-epochs": 2,
                                         "proximal-mu": mu}, x, y)
    w0 = [a.copy() for a in client.get_parameters({})]  # logreg: weight (10, 60), bias (10,)
    new, n, metrics = client.fit(w0, {"server-round": 1})
    assert n == 4 and metrics["num_steps"] == 2

    # Hand computation: softmax-regression gradient, plus mu * (w - w_t), two full-batch steps.
    def ce_grad(W, b):
        logits = x.numpy() @ W.T + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(4), y.numpy()] -= 1
        p /= 4
        return p.T @ x.numpy(), p.sum(0)

    W, b = w0[0].astype(np.float64), w0[1].astype(np.float64)
    for _ in range(2):
        gW, gb = ce_grad(W, b)
        W, b = W - lr * (gW + mu * (W - w0[0])), b - lr * (gb + mu * (b - w0[1]))
    np.testing.assert_allclose(new[0], W, atol=1e-5)
    np.testing.assert_allclose(new[1], b, atol=1e-5)

    # mu = 0 must differ (the proximal term really acts on the second step).
    client2 = make_client(fedprox.UPDATE, {"learning-rate": lr, "batch-size": 4, "local-epochs": 2,
                                          "proximal-mu": 0.0}, x, y)
    plain, _, _ = client2.fit(w0, {"server-round": 1})
    assert not np.allclose(plain[0], new[0], atol=1e-6)


def test_fedprox_strategy_sends_mu():
    from fl_app.registry import validate_config

    cfg = validate_config({"strategy": "fedprox", "proximal-mu": 0.3})
    strategy = FedProxStrategy.from_config(cfg)
    assert strategy.proximal_mu == 0.3
