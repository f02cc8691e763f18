"""FedSOL client: plain SGD while w == w_g, the proximal perturbation rho*Lambda*g_p/||g_p||
afterwards (captured, compared with an independent computation), w unchanged before the step."""

import dataclasses
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from clients import fedavg, fedsol
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import make_client

LR = 0.5


def _data(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 60, generator=g), torch.randint(0, 10, (n,), generator=g)


def _mlp_logits(w, x):
    """The 'mlp' model written out by hand: relu(x W1^T + b1) W2^T + b2."""
    W1, b1, W2, b2 = w
    return torch.relu(x @ W1.T + b1) @ W2.T + b2


def _kl(w, wg, x, T):
    """KL(p_global || p_local) per sample, averaged, written from the definition."""
    pl = torch.softmax(_mlp_logits(w, x) / T, 1)
    pg = torch.softmax(_mlp_logits(wg, x) / T, 1)
    return (pg * (pg.log() - pl.log())).sum(1).mean()


def _ce(w, x, y):
    p = torch.softmax(_mlp_logits(w, x), 1)
    return -p[torch.arange(len(y)), y].log().mean()


@contextmanager
def _spy(records, monkeypatch):
    """Yield FedSOL's update with its direction recording each local step: the weights before
    it, eps, w + eps, the weights after it (before the optimiser) and the direction it hands the
    optimiser."""
    names = [n for n, _ in build_model("mlp", input_shape("synthetic")).named_parameters()]
    seen = {}
    real_eps, real_copy = fedsol.fedsol_eps, fedsol.perturbed_copy

    def eps_spy(*args, **kwargs):
        seen["eps"] = real_eps(*args, **kwargs)
        return seen["eps"]

    def copy_spy(params, eps):
        seen["inside"] = real_copy(params, eps)
        return seen["inside"]

    def direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
        before = [params[n].clone() for n in names]
        d, new_buffers, carry, loss = fedsol.fedsol_direction(model, params, buffers, x, y, w_t, ctx, carry, hp)
        records.append(dict(
            before=before, inside=[seen["inside"][n].clone() for n in names],
            eps=[seen["eps"][n].clone() if n in seen["eps"] else None for n in names],
            after=[params[n].clone() for n in names], grad=[d[n].clone() for n in names],
        ))
        return d, new_buffers, carry, loss

    monkeypatch.setattr(fedsol, "fedsol_eps", eps_spy)
    monkeypatch.setattr(fedsol, "perturbed_copy", copy_spy)
    yield dataclasses.replace(fedsol.UPDATE, direction=direction)


def _overrides(**kw):
    return {"model": "mlp", "learning-rate": LR, "batch-size": 64, **kw}


def test_first_step_is_plain_sgd():
    x, y = _data()
    sol = make_client(fedsol.UPDATE, _overrides(**{"local-epochs": 1}), x, y)
    w0 = sol.get_parameters({})
    got, _, metrics = sol.fit([a.copy() for a in w0], {"server-round": 1})
    avg = make_client(fedavg.UPDATE, _overrides(**{"local-epochs": 1}), x, y)
    want, _, _ = avg.fit([a.copy() for a in w0], {"server-round": 1})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    assert metrics["prox_loss"] == pytest.approx(0.0, abs=1e-7)  # w == w_g: KL is zero


@pytest.mark.parametrize("perturb, adaptive, radius", [
    ("head", True, "layer"), ("all", False, "layer"), ("all", True, "layer"), ("all", True, "axis"),
])
def test_second_step_perturbation_restore_and_update(monkeypatch, perturb, adaptive, radius):
    rho, T = 0.8, 3.0
    x, y = _data()
    records = []
    with _spy(records, monkeypatch) as spied:
        client = make_client(spied, _overrides(**{
            "local-epochs": 2, "fedsol-rho": rho, "fedsol-temperature": T,
            "fedsol-perturb": perturb, "fedsol-adaptive": adaptive, "fedsol-radius": radius,
        }), x, y)
        # fixed start (the process-wide model cache holds whatever an earlier test left)
        w0 = get_weights(build_model("mlp", input_shape("synthetic"), seed=0))
        got, _, metrics = client.fit([a.copy() for a in w0], {"server-round": 1})
    assert len(records) == 2
    names = [n for n, _ in client.model.named_parameters()]  # body.1.weight, body.1.bias, head.*
    assert names == ["body.1.weight", "body.1.bias", "head.weight", "head.bias"]
    wg = [torch.tensor(a) for a in w0]

    first, second = records
    assert all(e is None or torch.count_nonzero(e) == 0 for e in first["eps"])  # Lambda = 0 at w_g

    # independent g_p at the second step's weights w1 (w1 != w_g)
    w1 = [t.clone().requires_grad_(True) for t in second["before"]]
    assert not torch.equal(w1[2], wg[2])
    kl = _kl(w1, wg, x, T)
    targets = [2, 3] if perturb == "head" else [0, 1, 2, 3]
    gp = torch.autograd.grad(kl, [w1[i] for i in targets])
    gp_norm = torch.sqrt(sum((g**2).sum() for g in gp))
    for i in range(4):
        if i not in targets:
            assert second["eps"][i] is None  # the body is not perturbed
            continue
        g = gp[targets.index(i)]
        if adaptive:
            d = (w1[i].detach() - wg[i]).abs()
            lam = d / d.norm() if radius == "layer" else d / d.norm(dim=0, keepdim=True).clamp_min(1e-12)
        else:
            lam = torch.ones_like(g)
        want = rho * lam * g / gp_norm
        torch.testing.assert_close(second["eps"][i], want, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(second["inside"][i], second["before"][i] + want, rtol=1e-4, atol=1e-6)

    # w itself unchanged before the optimiser update, and the update uses grad CE(w1 + eps)
    for b, a in zip(second["before"], second["after"]):
        assert torch.equal(a, b)
    wp = [(w1[i].detach() + (second["eps"][i] if second["eps"][i] is not None else 0)).requires_grad_(True)
          for i in range(4)]
    g_ce = torch.autograd.grad(_ce(wp, x, y), wp)
    for i in range(4):
        torch.testing.assert_close(second["grad"][i], g_ce[i], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got[i], (w1[i].detach() - LR * g_ce[i]).numpy(), rtol=1e-4, atol=1e-6)

    # prox_loss: mean over the two batches (the first is 0)
    assert metrics["prox_loss"] == pytest.approx(kl.item() / 2, rel=1e-4)


def test_perturbation_changes_the_update():
    """rho > 0 must change the second step compared with plain SGD (the test above can fail)."""
    x, y = _data()
    sol = make_client(fedsol.UPDATE, _overrides(**{"local-epochs": 2, "fedsol-rho": 2.0}), x, y)
    w0 = sol.get_parameters({})
    got, _, _ = sol.fit([a.copy() for a in w0], {"server-round": 1})
    avg = make_client(fedavg.UPDATE, _overrides(**{"local-epochs": 2}), x, y)
    want, _, _ = avg.fit([a.copy() for a in w0], {"server-round": 1})
    assert not np.allclose(got[2], want[2], atol=1e-6)


def test_keys_and_defaults():
    keys = fedsol.UPDATE.keys
    assert keys["fedsol-rho"].default == 1.0 and keys["fedsol-temperature"].default == 3.0
    assert keys["fedsol-perturb"].default == "head" and keys["fedsol-adaptive"].default is True


def test_axis_radius_against_a_hand_computation():
    """Lambda = F.normalize(|w - w_g|, dim=0): columns of the weight, the bias as a whole."""
    wg = {"w": torch.zeros(2, 2), "b": torch.zeros(2)}
    w = {"w": torch.tensor([[3.0, -1.0], [4.0, 0.0]]), "b": torch.tensor([-3.0, 4.0])}
    g = {"w": torch.ones(2, 2), "b": torch.tensor([1.0, 1.0])}
    rho = 2.0
    scale = rho / np.sqrt(6.0)  # ||g_p|| over all six entries
    got = fedsol.fedsol_eps(w, wg, g, rho, adaptive=True, radius="axis")
    # column 0: |(3, 4)| / 5; column 1: |(-1, 0)| / 1; bias |(-3, 4)| / 5
    torch.testing.assert_close(got["w"], scale * torch.tensor([[0.6, 1.0], [0.8, 0.0]]))
    torch.testing.assert_close(got["b"], scale * torch.tensor([0.6, 0.8]))
    layer = fedsol.fedsol_eps(w, wg, g, rho, adaptive=True, radius="layer")
    torch.testing.assert_close(layer["w"], scale * torch.tensor([[3.0, 1.0], [4.0, 0.0]]) / np.sqrt(26.0))
    zero = fedsol.fedsol_eps(wg, wg, g, rho, adaptive=True, radius="axis")  # w == w_g: eps = 0
    assert all(torch.count_nonzero(e) == 0 for e in zero.values())
