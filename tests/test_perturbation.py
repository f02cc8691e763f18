"""clients/perturbation.py: exact restore and the SAM perturbation against hand formulas (ASAM's:
tests/test_functional_sharpness.py)."""

import math

import pytest
import torch
from torch import nn

from clients.perturbation import global_norm, perturbed, sam_eps


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(3, 4, generator=g)), nn.Parameter(torch.randn(4, generator=g))]


def test_restore_is_bitwise_exact_even_when_subtraction_would_not_be():
    # w + eps - eps != w in float32 for these values: only a copy gives w back
    w = torch.tensor([1.0000001, 3.3333333, -7.1e-3, 1e8], dtype=torch.float32)
    e = torch.tensor([1e-8, 0.1, 1234.5, 3.3], dtype=torch.float32)
    assert not torch.equal((w + e) - e, w)  # the trap this helper avoids
    p = nn.Parameter(w.clone())
    with perturbed([p], [e]):
        assert torch.equal(p.detach(), w + e)
    assert torch.equal(p.detach(), w)


def test_restore_happens_on_exception_and_none_leaves_a_tensor_alone():
    a, b = _params()
    a0, b0 = a.detach().clone(), b.detach().clone()
    with pytest.raises(RuntimeError):
        with perturbed([a, b], [torch.ones_like(a), None]):
            assert torch.equal(b.detach(), b0)  # None: not perturbed
            assert torch.allclose(a.detach(), a0 + 1)
            raise RuntimeError("boom")
    assert torch.equal(a.detach(), a0) and torch.equal(b.detach(), b0)


def test_model_buffers_are_restored():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    model.train()
    x = torch.randn(8, 4)
    model(x)  # running stats move once
    before = [b.clone() for b in model.buffers()]
    params = list(model.parameters())
    with perturbed(params, [torch.full_like(p, 0.5) for p in params], model):
        model(x)  # a perturbed pass would move them again
    assert all(torch.equal(b, b0) for b, b0 in zip(model.buffers(), before))


def test_sam_eps_is_rho_g_over_global_norm():
    g = [torch.tensor([[3.0, 0.0]]), torch.tensor([4.0])]  # global norm 5
    eps = sam_eps(g, rho=0.5)
    assert torch.allclose(eps[0], torch.tensor([[0.3, 0.0]]))
    assert torch.allclose(eps[1], torch.tensor([0.4]))
    assert math.isclose(float(global_norm(eps)), 0.5, rel_tol=1e-6)
