"""The SAM perturbation of the functional updates (``tasks.functional``): its formula by hand
(ASAM's: tests/training/test_functional_sharpness.py), and the guarantees that replace moving the
weights in place and restoring them: w + eps is a copy, so the weights and buffers a step
was given are never written, the perturbed point is exactly w + eps, and the buffers a SAM
step returns are those of its first, unperturbed pass (BatchNorm counts a batch once)."""

import math

import torch
from torch import nn

from clients.fedsam import UPDATE as FEDSAM
from tasks.functional import Hyper, module_state, tree_norm
from tasks.functional.core import NORM_EPS, cross_entropy, perturbed_copy, sam_eps
from tasks.models import Classifier


def test_sam_eps_is_rho_g_over_global_norm():
    g = [torch.tensor([[3.0, 0.0]]), torch.tensor([4.0])]  # global norm 5
    eps = sam_eps(g, rho=0.5)
    assert torch.allclose(eps[0], torch.tensor([[0.3, 0.0]]))
    assert torch.allclose(eps[1], torch.tensor([0.4]))
    assert math.isclose(float(tree_norm(eps)), 0.5, rel_tol=1e-6)
    assert NORM_EPS == 1e-12  # the one value added to every norm in a denominator


def test_sam_eps_skips_none_and_the_norm_is_over_the_rest():
    eps = sam_eps([torch.tensor([0.0, 2.0]), None], rho=1.0)
    assert eps[1] is None and torch.allclose(eps[0], torch.tensor([0.0, 1.0]))
    assert sam_eps([None, None], rho=1.0) == [None, None]


def test_perturbed_point_is_a_copy_and_w_is_never_written():
    # (w + eps) - eps != w in float32 for these values: moving w in place could not go back exactly
    w = torch.tensor([1.0000001, 3.3333333, -7.1e-3, 1e8], dtype=torch.float32)
    e = torch.tensor([1e-8, 0.1, 1234.5, 3.3], dtype=torch.float32)
    assert not torch.equal((w + e) - e, w)
    params = {"a": w.clone(), "b": torch.tensor([2.0])}
    point = perturbed_copy(params, {"a": e})  # no entry for "b": passed through unchanged
    assert torch.equal(point["a"], w + e) and point["b"] is params["b"]
    assert torch.equal(params["a"], w) and point["a"].data_ptr() != params["a"].data_ptr()


def test_sam_step_keeps_the_first_pass_buffers_and_writes_no_input():
    torch.manual_seed(0)
    model = Classifier(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)), nn.Linear(3, 2))
    model.train()
    params, buffers = module_state(model)
    before = ({n: t.clone() for n, t in params.items()}, {n: t.clone() for n, t in buffers.items()})
    x, y = torch.randn(8, 4), torch.tensor([0, 1] * 4)
    _, one_pass = cross_entropy(model, params, buffers, x, y)  # BN statistics after one batch
    _, new_buffers, _, _ = FEDSAM.direction(model, params, buffers, x, y, params, {}, {},
                                            Hyper(lr=0.1, keys={"sam-rho": 0.5}))
    assert all(torch.equal(new_buffers[n], one_pass[n]) for n in buffers)  # the perturbed pass is not counted
    assert not torch.equal(one_pass["body.1.running_mean"], buffers["body.1.running_mean"])  # BN did move once
    assert all(torch.equal(params[n], before[0][n]) for n in params)
    assert all(torch.equal(buffers[n], before[1][n]) for n in buffers)
