"""FedSAM / FedASAM clients: one full-batch step equals w - lr * grad f(w + eps), eps by hand."""


import numpy as np
import torch

from clients import fedasam, fedsam
from tests.kit import make_client
from tests.kit_training import softmax_regression_grad

LR = 0.4


def _run(update, overrides):
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(7, 60, generator=g), torch.randint(0, 10, (7,), generator=g)
    client = make_client(update, {"learning-rate": LR, "batch-size": 64, "local-epochs": 1, **overrides}, x, y)
    w0 = client.get_parameters({})
    new, _, _ = client.fit([a.copy() for a in w0], {"server-round": 1})
    return x.numpy().astype(np.float64), y.numpy(), [a.astype(np.float64) for a in w0], new


def test_fedsam_step():
    rho = 0.7
    x, y, (W, b), new = _run(fedsam.UPDATE, {"sam-rho": rho})
    gW, gb = softmax_regression_grad(x, y, W, b)
    n = np.sqrt((gW**2).sum() + (gb**2).sum())
    pW, pb = softmax_regression_grad(x, y, W + rho * gW / n, b + rho * gb / n)
    np.testing.assert_allclose(new[0], W - LR * pW, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new[1], b - LR * pb, rtol=1e-5, atol=1e-6)
    plainW, _ = softmax_regression_grad(x, y, W, b)
    assert not np.allclose(new[0], W - LR * plainW, atol=1e-5)


def test_fedasam_step_scales_weights_not_biases():
    rho, eta = 0.9, 0.05
    x, y, (W, b), new = _run(fedasam.UPDATE, {"asam-rho": rho, "asam-eta": eta})
    gW, gb = softmax_regression_grad(x, y, W, b)
    T = np.abs(W) + eta  # weight: T = |w| + eta; bias: T = 1
    n = np.sqrt(((T * gW) ** 2).sum() + (gb**2).sum())
    pW, pb = softmax_regression_grad(x, y, W + rho * T * T * gW / n, b + rho * gb / n)
    np.testing.assert_allclose(new[0], W - LR * pW, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new[1], b - LR * pb, rtol=1e-5, atol=1e-6)
