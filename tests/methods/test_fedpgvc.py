"""FedPGVC: masked layers step with g + rho, the rest with g; server mixing of the plain mean
by eta_g (docs/methods.md, "fedpgvc"). The authors' code reading: tests/methods/test_fedpgvc_authors.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Context, RecordDict
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from torch import nn

from clients import fedpgvc
from fl_app.config import ConfigError
from fl_app.node.drift_client import DriftClient
from fl_app.registry import validate_config
from strategies.base import fedavg_kwargs
from strategies.fedpgvc import FedPGVCStrategy
from tasks.models import Classifier, get_weights


def tiny_model() -> Classifier:
    """Three Linear layers: with pgvc-layers = 2, body.0 is outside the mask."""
    torch.manual_seed(0)
    body = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 6), nn.Tanh())
    return Classifier(body, nn.Linear(6, 3))


def test_fit_step_masked_layers_get_g_plus_rho_others_plain_sgd():
    eta, n = 0.3, 12
    cfg = validate_config({
        "strategy": "fedpgvc", "dataset": "synthetic", "model": "mlp",
        "learning-rate": eta, "batch-size": 64, "local-epochs": 1,  # one full-batch step
    })
    context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
    client = DriftClient(fedpgvc.UPDATE, cfg, context, partition_id=0, num_partitions=2)
    client.model = tiny_model()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=gen) * 2
    y = torch.randint(0, 3, (n,), generator=gen)
    client.use_data((x, y))

    ref = tiny_model()  # same weights, used for the hand computation
    start = get_weights(ref)
    weights, num, metrics = client.fit(start, {"server-round": 1})
    assert num == n and metrics["num_steps"] == 1
    names = [k for k, _ in ref.named_parameters()]
    masked = {"body.2.weight", "body.2.bias", "head.weight", "head.bias"}

    params = list(ref.parameters())
    g = torch.autograd.grad(F.cross_entropy(ref(x), y), params)
    # rho = (1/B) sum_b loss_b * grad loss_b, one sample at a time
    rho = [torch.zeros_like(p) for p in params]
    for b in range(n):
        loss_b = F.cross_entropy(ref(x[b : b + 1]), y[b : b + 1])
        for r, gb in zip(rho, torch.autograd.grad(loss_b, params)):
            r += loss_b.detach() * gb / n

    got = dict(zip(ref.state_dict().keys(), weights))
    for name, p, gi, ri in zip(names, params, g, rho):
        step = gi + ri if name in masked else gi
        want = (p.detach() - eta * step).numpy()
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-6, err_msg=name)
        if name in masked:  # the penalty matters: plain SGD would fail the check
            assert np.abs(got[name] - (p.detach() - eta * gi).numpy()).max() > 1e-4
    assert metrics["train_loss"] == pytest.approx(F.cross_entropy(ref(x), y).item(), rel=1e-5)


def strategy(server_lr: float, model: str = "mlp", layers: int = 2):
    cfg = validate_config({
        "strategy": "fedpgvc", "dataset": "synthetic", "model": model,
        "server-lr": server_lr, "pgvc-layers": layers,
    })
    return FedPGVCStrategy.from_config(cfg, **fedavg_kwargs(cfg, None, None))


class NoClients:
    def num_available(self) -> int:
        return 0

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return []


def fit_res(arrays, n):
    return None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, {})


@pytest.mark.parametrize("eta_g", [0.5, 1.0, 1.5])
def test_server_mixes_plain_mean_with_global_weights(eta_g):
    """Eq. 16's (1/K) sum: the clients' example counts (10 and 30) do not weight the mean."""
    rng = np.random.default_rng(0)
    shapes = [(3, 2), (3,)]
    w = [rng.normal(size=s).astype(np.float32) for s in shapes]
    a = [rng.normal(size=s).astype(np.float32) for s in shapes]
    b = [rng.normal(size=s).astype(np.float32) for s in shapes]
    s = strategy(eta_g)
    s.configure_fit(4, ndarrays_to_parameters(w), NoClients())
    params, _ = s.aggregate_fit(4, [fit_res(a, 10), fit_res(b, 30)], [])
    got = parameters_to_ndarrays(params)
    for wi, ai, bi, gi in zip(w, a, b, got):
        want = (1 - eta_g) * wi + eta_g * (ai + bi) / 2
        np.testing.assert_allclose(gi, want, rtol=0, atol=1e-6)
        assert gi.dtype == np.float32


def test_too_few_linear_layers_fails_at_start():
    with pytest.raises(ConfigError, match="pgvc-layers"):
        strategy(1.0, model="logreg", layers=2)
    strategy(1.0, model="logreg", layers=1)
