"""MOON: the model-contrastive loss on hand-made representations, and the client's state."""

import math

import numpy as np
import torch
import torch.nn.functional as F

from clients import fedavg, moon
from clients.moon import moon_contrastive
from tests.kit import make_client


def test_moon_contrastive_by_hand():
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[1.0, 1.0], [2.0, 2.0]])  # cos = 1/sqrt2, 1
    z_prev = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])  # cos = 0, -1/sqrt2
    T = 0.5
    rows = [(1 / math.sqrt(2), 0.0), (1.0, -1 / math.sqrt(2))]
    expected = sum(-math.log(math.exp(p / T) / (math.exp(p / T) + math.exp(n / T))) for p, n in rows) / 2
    assert math.isclose(moon_contrastive(z, z_glob, z_prev, T).item(), expected, rel_tol=1e-6)
    # positive == negative: log 2
    assert math.isclose(moon_contrastive(z, z_glob, z_glob, T).item(), math.log(2), rel_tol=1e-6)


def test_moon_client_round_two_uses_previous_model():
    torch.manual_seed(0)
    x, y = torch.randn(8, 60), torch.arange(8) % 10
    lr, mu, T = 0.1, 2.0, 0.5
    client = make_client(
        moon.UPDATE,
        {"strategy": "moon", "model": "mlp", "moon-mu": mu, "moon-temperature": T,
         "learning-rate": lr, "batch-size": 8, "local-epochs": 1},
        x, y,
    )
    w1 = client.get_parameters({})
    out1, _, _ = client.fit([a.copy() for a in w1], {"server-round": 1})
    prev = client.load_state(moon.UPDATE.state["prev"].record)  # every state_dict entry, in its order
    assert len(prev) == len(out1)
    for a, b in zip(prev, out1):  # previous model saved: the round's final weights and buffers
        np.testing.assert_array_equal(a, b)
    # round 1 has no previous model: plain CE step
    ref = make_client(fedavg.UPDATE, {"model": "mlp", "learning-rate": lr, "batch-size": 8}, x, y)
    ce_only, _, _ = ref.fit([a.copy() for a in w1], {"server-round": 1})
    for a, b in zip(out1, ce_only):
        np.testing.assert_allclose(a, b, atol=1e-6)

    rng = np.random.default_rng(0)
    w2 = [(a + 0.05 * rng.standard_normal(a.shape)).astype(np.float32) for a in out1]
    out2, _, _ = client.fit([a.copy() for a in w2], {"server-round": 2})
    # independent: functional MLP (Linear-ReLU, head), one full-batch SGD step
    def body(p, x):
        return F.relu(x @ p[0].T + p[1])

    params = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in w2]
    g = [torch.tensor(a, dtype=torch.float64) for a in w2]
    prev = [torch.tensor(a, dtype=torch.float64) for a in out1]
    xd = x.double()
    z, zg, zp = body(params, xd), body(g, xd), body(prev, xd)
    logits = z @ params[2].T + params[3]
    pos = (z * zg).sum(1) / (z.norm(dim=1) * zg.norm(dim=1))
    neg = (z * zp).sum(1) / (z.norm(dim=1) * zp.norm(dim=1))
    con = -(pos / T - torch.logaddexp(pos / T, neg / T)).mean()
    loss = F.cross_entropy(logits, y) + mu * con
    grads = torch.autograd.grad(loss, params)
    for a, p, gr in zip(out2, params, grads):
        np.testing.assert_allclose(a, (p - lr * gr).detach().numpy(), atol=1e-5)
