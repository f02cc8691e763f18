"""FedNTD: the not-true distillation loss on a 3-class example, computed by hand."""

import math

import numpy as np
import torch
import torch.nn.functional as F

from clients import fedntd
from clients.fedntd import ntd_loss
from tests.kit import make_client


def _softmax(v):
    e = [math.exp(t) for t in v]
    return [t / sum(e) for t in e]


def test_ntd_loss_three_classes_by_hand():
    local = torch.tensor([[2.0, 1.0, -1.0], [0.5, 0.0, 3.0]])
    glob = torch.tensor([[1.0, 0.0, 2.0], [-1.0, 1.0, 0.5]])
    y = torch.tensor([0, 2])
    tau = 2.0
    # by hand: drop column y, softmax(/tau), KL(global || local), batch mean, times tau^2
    kl = 0.0
    for l_row, g_row, _ in (([1.0, -1.0], [0.0, 2.0], 0), ([0.5, 0.0], [-1.0, 1.0], 2)):
        ql = _softmax([v / tau for v in l_row])
        qg = _softmax([v / tau for v in g_row])
        kl += sum(g * math.log(g / l) for g, l in zip(qg, ql))
    expected = tau**2 * kl / 2
    assert math.isclose(ntd_loss(local, glob, y, tau).item(), expected, rel_tol=1e-6)
    # the true class really is dropped: changing it leaves the loss unchanged
    local2 = local.clone()
    local2[0, 0] = 50.0
    local2[1, 2] = -7.0
    assert math.isclose(ntd_loss(local2, glob, y, tau).item(), expected, rel_tol=1e-6)


def test_fedntd_client_step_matches_independent_gradient():
    torch.manual_seed(0)
    x, y = torch.randn(6, 60), torch.tensor([0, 1, 2, 3, 4, 5])
    lr, beta, tau = 0.5, 2.0, 1.5
    client = make_client(
        fedntd.UPDATE,
        {"strategy": "fedntd", "ntd-beta": beta, "ntd-tau": tau, "learning-rate": lr,
         "batch-size": 6, "local-epochs": 2},
        x, y,
    )
    w_t = [torch.randn(10, 60) * 0.3, torch.randn(10) * 0.3]
    out, _, _ = client.fit([a.numpy().copy() for a in w_t], {"server-round": 1})
    # independent: explicit not-true gather, KL written as sum p (log p - log q)
    Wg, bg = w_t
    W, b = Wg.clone().double().requires_grad_(), bg.clone().double().requires_grad_()
    xd = x.double()
    for _ in range(2):
        logits, glog = xd @ W.T + b, xd @ Wg.double().T + bg.double()
        idx = torch.tensor([[c for c in range(10) if c != t] for t in y.tolist()])
        lq = F.log_softmax(logits.gather(1, idx) / tau, 1)
        lp = F.log_softmax(glog.gather(1, idx) / tau, 1)
        kl = (lp.exp() * (lp - lq)).sum(1).mean()
        loss = F.cross_entropy(logits, y) + beta * tau**2 * kl
        gW, gb = torch.autograd.grad(loss, (W, b))
        W, b = (W - lr * gW).detach().requires_grad_(), (b - lr * gb).detach().requires_grad_()
    np.testing.assert_allclose(out[0], W.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(out[1], b.detach().numpy(), atol=1e-5)
