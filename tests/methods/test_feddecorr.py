"""FedDecorr (clients/feddecorr.py): the decorrelation loss and its gradient by hand, two SGD
steps through a body and a head in float64, a batch of one and beta = 0 are FedAvg bit for bit,
and the cohort path (a last batch of one inside the vmap included) trains each client as its own
round does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from clients.feddecorr import decorrelation_loss
from fl_app.registry import get_method
from tasks.functional import Hyper, Round, local_round, module_state
from tasks.models import Classifier
from tests.kit import assert_cohort_equals_per_client, initial_weights, make_client

Z = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]  # N = 3 representations of d = 2 dimensions


def correlation_form(z: torch.Tensor) -> torch.Tensor:
    """The same penalty from the correlation matrix K (``torch.corrcoef``, no eps):
    (N - 1)^2 / N * mean_{i != j} K_ij^2, since the code's G = Z_hat^T Z_hat is (N - 1) K."""
    n, d = z.shape
    k = torch.corrcoef(z.T)
    off = k.pow(2).sum() - k.diagonal().pow(2).sum()
    return (n - 1) ** 2 / n * off / (d * (d - 1))


def test_decorrelation_loss_and_gradient_by_hand():
    """Columns centred (means 2/3), unbiased variance 1/3, so Z_hat = sqrt(3) Z_c and
    G = [[2, -1], [-1, 2]]: L = ((-1)^2 + (-1)^2) / 2 / 3 = 1/3, dL/dZ = [[1, 0], [0, 1], [-1, -1]]."""
    z = torch.tensor(Z, dtype=torch.float64, requires_grad=True)
    loss = decorrelation_loss(z)
    loss.backward()
    assert loss.item() == pytest.approx(1 / 3, abs=1e-7)
    np.testing.assert_allclose(z.grad.numpy(), [[1, 0], [0, 1], [-1, -1]], atol=1e-6)
    gen = torch.Generator().manual_seed(0)
    for n, d in ((5, 4), (64, 16)):  # any batch: the correlation-matrix form within eps
        z = torch.randn(n, d, generator=gen, dtype=torch.float64)
        assert decorrelation_loss(z).item() == pytest.approx(correlation_form(z).item(), rel=1e-6)
    assert decorrelation_loss(torch.ones(1, 3)).item() == 0.0  # one sample: no statistics, no term


def test_a_constant_feature_contributes_nothing():
    """Z with a third column constant at 0.25 (exact in binary, so centring it gives exact zeros):
    its variance is 0 and eps keeps it at Z_hat = 0 / sqrt(1e-8) = 0, as in the authors' code, so
    G = [[2, -1, 0], [-1, 2, 0], [0, 0, 0]]. L = ((-1)^2 + (-1)^2 + 4 * 0) / 6 / 3 = 1/9, a third of
    the two-column loss (the mean now runs over 6 off-diagonal entries, not 2), dL/dZ a third of
    its gradient, and no gradient on the constant column."""
    z = torch.tensor([row + [0.25] for row in Z], dtype=torch.float64, requires_grad=True)
    loss = decorrelation_loss(z)
    loss.backward()
    assert loss.item() == pytest.approx(1 / 9, abs=1e-7)
    np.testing.assert_allclose(z.grad.numpy(), [[1 / 3, 0, 0], [0, 1 / 3, 0], [-1 / 3, -1 / 3, 0]], atol=1e-6)
    assert torch.equal(z.grad[:, 2], torch.zeros(3, dtype=torch.float64))


def two_layer_model() -> Classifier:
    """body Linear(2, 2) at W = I, b = 0 (no activation: Z = x at the start); head Linear(2, 3) at 0."""
    model = Classifier(nn.Linear(2, 2), nn.Linear(2, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.body.weight.copy_(torch.eye(2))
    return model


def run(method: str, keys: dict, x, y, batch_size: int, epochs: int = 2):
    model = two_layer_model()
    params, buffers = module_state(model)
    return local_round(Round(get_method(method).update, model, params, buffers, {}, {"buffers": buffers},
                       Hyper(lr=0.1, keys=keys), x, y, batch_size, epochs, torch.Generator().manual_seed(0)))


def test_two_steps_by_hand():
    """beta = 0.1, lr 0.1, the batch Z = x, y = (0, 1, 2). Step 0: CE = ln 3, L_dec = 1/3; the
    zero head gives the body no CE gradient, so the body's whole step is beta dL_dec/dW_b: its
    off-diagonals go UP by 0.1 * 0.1 (with beta = 0 they stay at 0 after step 0)."""
    x, y = torch.tensor(Z, dtype=torch.float64), torch.tensor([0, 1, 2])
    result = run("feddecorr", {"feddecorr-beta": 0.1}, x, y, batch_size=3)
    p = {n: t.numpy() for n, t in result.params.items()}
    np.testing.assert_allclose(p["body.weight"], [[1.00062951, 0.01952036], [0.01952036, 1.00062951]], atol=1e-8)
    np.testing.assert_allclose(p["body.bias"], [-8.3136e-06, -8.3136e-06], rtol=1e-4)
    np.testing.assert_allclose(p["head.weight"], [[0.02200880, -0.04396359], [-0.04396359, 0.02200880],
                                                  [0.02195479, 0.02195479]], atol=1e-8)
    np.testing.assert_allclose(p["head.bias"], [2.4941e-04, 2.4941e-04, -4.9882e-04], rtol=1e-4)
    # train_loss: the mean of the steps' whole objectives, (1.13194562 + 1.11533881) / 2
    assert result.metrics["train_loss"] == pytest.approx((1.13194562 + 1.11533881) / 2, rel=1e-6)
    # one step: W_b = I - 0.1 * 0.1 * dL_dec/dW_b with dL_dec/dW_b = [[0, -1], [-1, 0]] (up to eps)
    one = run("feddecorr", {"feddecorr-beta": 0.1}, x, y, batch_size=3, epochs=1)
    np.testing.assert_allclose(one.params["body.weight"].numpy(), [[1.0, 0.01], [0.01, 1.0]], atol=1e-9)
    plain = run("fedavg", {}, x, y, batch_size=3, epochs=1)
    assert torch.equal(plain.params["body.weight"], torch.eye(2, dtype=torch.float64))


@pytest.mark.parametrize("keys, batch_size", [({"feddecorr-beta": 0.0}, 3), ({"feddecorr-beta": 0.1}, 1)])
def test_beta_zero_and_batches_of_one_are_fedavg_bit_for_bit(keys, batch_size):
    x = torch.tensor(Z, dtype=torch.float64)
    y = torch.tensor([0, 1, 2])
    ours, fedavg = run("feddecorr", keys, x, y, batch_size), run("fedavg", {}, x, y, batch_size)
    for name in fedavg.params:
        assert torch.equal(ours.params[name], fedavg.params[name]), name
    assert ours.metrics == fedavg.metrics


def test_cohort_trains_each_client_as_its_own_round():
    """mlp (a body Linear + ReLU of 64 units, so the term reaches parameters) on three clients
    of 13, 6 and 12 examples, batches of 4: the 13-example client's last batch of one runs inside
    the vmap (its term is 0). In float64: in float32 the term amplifies rounding (module
    docstring; measured on cnn-small, one ulp of the input moves a client's own round by up to
    1e-1 relative, as much as the cohort's summation order does), so the float32 paths cannot
    be held to 1e-5; in float64 they agree to about 1e-10."""
    gen = torch.Generator().manual_seed(3)
    clients = [make_client("feddecorr", {"feddecorr-beta": 0.5, "model": "mlp", "batch-size": 4, "local-epochs": 2,
                                          "momentum": 0.9, "weight-decay": 5e-4, "learning-rate": 0.05},
                            torch.rand(n, 60, generator=gen), torch.randint(0, 10, (n,), generator=gen),
                            partition=k, num_partitions=3)
               for k, n in enumerate([13, 6, 12])]
    assert_cohort_equals_per_client(clients, initial_weights(clients[0]), rel=1e-9, float64=True)
