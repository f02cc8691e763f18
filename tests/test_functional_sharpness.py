"""The sharpness-aware local updates (``tasks.functional.sharpness``) against independent references.

(a) Hand computations: one full-batch step of each update on softmax regression (``logreg``),
    recomputed in float64 from the formula with closed-form gradients; the perturbations on
    numbers small enough to do on paper.
(a') Each update equals the module-based hook loop it replaces, written here as it ran
    (``torch.optim`` on a module, the perturbation moved into the weights in place and restored
    by ``clients.perturbation.perturbed``), on a channels-last CNN and on a BatchNorm CNN: bit for
    bit (on CPU ``grad_and_loss`` runs the same autograd kernels as ``backward()``).
(b) A cohort of K = 3 (one ``vmap``) equals three ``local_round`` calls within 1e-5 relative
    (float32: vmap's batched convolutions and matmuls sum in another order, a few ulp per step),
    and a cohort of one equals ``local_round`` exactly.
(c) Where the method has state, a second round starts from the state the first left.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.perturbation import perturbed
from tasks.catalogue import InputShape
from tasks.datasets import input_shape
from tasks.functional import Hyper, cohort_round, local_round, module_state
from tasks.functional.rounds import stack_trees, unstack_tree
from tasks.functional.sharpness import FEDASAM, asam_eps, asam_scaled
from tasks.models import build_model
from tests.helpers_baselines import softmax_regression_grad

SHAPE = InputShape(1, 8, 10)  # one channel (channels-last quirk: keep_layout), small for speed
KEYS = {"asam-rho": 0.5, "asam-eta": 0.01}
UPDATES = {"fedasam": FEDASAM}


# ------------------------------------------------------------------ (a) hand computations
def _logreg_step(update, keys, seed=0, lr=0.4, n=7):
    """One full-batch step of ``update`` on logreg: (x, y, W, b in float64, new W, b)."""
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 60, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    model = build_model("logreg", input_shape("synthetic"), seed=seed)
    params, buffers = module_state(model)
    result = local_round(update, model, params, buffers, {}, {}, Hyper(lr=lr, keys=keys), x, y, 64, 1,
                         torch.Generator().manual_seed(1))
    assert result.metrics["num_steps"] == 1
    f64 = [params[n].double().numpy() for n in ("head.weight", "head.bias")]
    new = [result.params[n].numpy() for n in ("head.weight", "head.bias")]
    return x.double().numpy(), y.numpy(), *f64, *new


def test_asam_eps_hand_computed():
    w = {"a.weight": torch.tensor([1.0, -2.0]), "a.bias": torch.tensor([0.5])}
    g = {"a.weight": torch.tensor([1.0, 1.0]), "a.bias": torch.tensor([2.0])}
    rho, eta = 0.5, 0.1
    assert asam_scaled(w) == {"a.weight": True, "a.bias": False}
    # weight: T = |w| + eta = [1.1, 2.1], T g = [1.1, 2.1]; bias: T = 1, T g = 2
    tg_norm = math.sqrt(1.1**2 + 2.1**2 + 2.0**2)
    got = asam_eps(w, g, rho, eta, asam_scaled(w))
    torch.testing.assert_close(got["a.weight"], torch.tensor([1.21, 4.41]) * rho / tg_norm, rtol=0, atol=1e-7)
    torch.testing.assert_close(got["a.bias"], torch.tensor([2.0]) * rho / tg_norm, rtol=0, atol=1e-7)
    # every tensor scaled: T = 0.6 for the bias too; the ASAM constraint ||T^-1 eps|| = rho
    every = asam_eps(w, g, rho, eta, dict.fromkeys(w, True))
    t = {n: v.abs() + eta for n, v in w.items()}
    assert math.isclose(math.sqrt(sum(float(((every[n] / t[n]) ** 2).sum()) for n in w)), rho, rel_tol=1e-6)


def test_fedasam_step_is_grad_at_the_adaptive_perturbation():
    rho, eta, lr = 0.9, 0.05, 0.4
    x, y, W, b, new_W, new_b = _logreg_step(FEDASAM, {"asam-rho": rho, "asam-eta": eta}, lr=lr)
    gW, gb = softmax_regression_grad(x, y, W, b)
    T = np.abs(W) + eta  # the weight: T = |w| + eta; the bias: T = 1
    n = np.sqrt(((T * gW) ** 2).sum() + (gb**2).sum())
    pW, pb = softmax_regression_grad(x, y, W + rho * T * T * gW / n, b + rho * gb / n)
    np.testing.assert_allclose(new_W, W - lr * pW, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_b, b - lr * pb, rtol=1e-5, atol=1e-6)
    assert not np.allclose(new_W, W - lr * gW, atol=1e-5)  # the perturbation matters


# ---------------------------------------------------- (a') against the module-based hook loop
def _hook_asam_eps(params, grads, rho, eta, scaled):
    """clients.perturbation.asam_eps as it was: T g in one buffer, then T T g, then the scale."""
    eps, ts = [], []
    for p, g, s in zip(params, grads, scaled):
        t = p.detach().abs().add_(eta) if s else None
        eps.append(t * g.detach() if s else g.detach().clone())
        ts.append(t)
    scale = rho / (torch.linalg.vector_norm(torch.stack(torch._foreach_norm(eps))) + 1e-12)
    for e, t in zip(eps, ts):
        if t is not None:
            e.mul_(t)
        e.mul_(scale)
    return eps


def _hook_sam_step(model, xb, yb, eps_fn):
    """The SAM-style train_step of the hook clients: .grad = grad f(w + eps) with w + eps in place."""
    params = list(model.parameters())
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    eps = eps_fn(params, [p.grad for p in params])
    with perturbed(params, eps, model):
        for p in params:
            p.grad = None
        F.cross_entropy(model(xb), yb).backward()
    return loss.detach()


def hook_fedasam(model, xb, yb, keys, ctx):
    scaled = [n.rsplit(".", 1)[-1] == "weight" for n, _ in model.named_parameters()]
    return _hook_sam_step(model, xb, yb, lambda p, g: _hook_asam_eps(p, g, keys["asam-rho"], keys["asam-eta"], scaled))


HOOKS = {"fedasam": hook_fedasam}


def module_round(hook, model, x, y, hp, batch_size, epochs, seed, ctx):
    """DriftClient's hook loop: ``hook`` fills .grad (and may correct it), then torch.optim steps."""
    opt = torch.optim.SGD(model.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    loss_sum, steps = torch.zeros(()), 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), batch_size):
            xb, yb = x[order[start:start + batch_size]], y[order[start:start + batch_size]]
            opt.zero_grad(set_to_none=True)
            loss_sum += hook(model, xb, yb, hp.keys, ctx)
            opt.step()
            steps += 1
    return loss_sum.item() / steps


def _inputs_for(name, params, gen):
    """(state, server, the hook's view of them) for method ``name``: none for stateless methods."""
    return {}, {}, {}


@pytest.mark.parametrize("model_name", ["cnn-small", "cnn-bn"])
@pytest.mark.parametrize("name", sorted(UPDATES))
def test_update_equals_the_hook_loop(name, model_name):
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(10, 1, 8, 8, generator=gen), torch.randint(0, 10, (10,), generator=gen)
    model = build_model(model_name, SHAPE, seed=0)
    params, buffers = module_state(model)
    state, server, ctx = _inputs_for(name, params, gen)
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=KEYS)
    result = local_round(UPDATES[name], copy.deepcopy(model), params, buffers, state, server, hp,
                         x, y, 4, 2, torch.Generator().manual_seed(3))
    loss = module_round(HOOKS[name], model, x, y, hp, 4, 2, 3, ctx)
    assert result.metrics["train_loss"] == loss and result.metrics["num_steps"] == 6
    for n, p in model.named_parameters():
        assert torch.equal(result.params[n], p.detach()), n
    for n, b in model.named_buffers():
        assert torch.equal(result.buffers[n], b), n


# -------------------------------------------------------------------------------- (b) cohorts
def _cohort_inputs(name, sizes, seed=5):
    gen = torch.Generator().manual_seed(seed)
    models = [build_model("cnn-small", SHAPE, seed=k) for k in range(len(sizes))]
    params, buffers = (stack_trees(t) for t in zip(*(module_state(m) for m in models)))
    params = {n: p.contiguous() for n, p in params.items()}  # the layout vmap batches
    data = [(torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)) for n in sizes]
    states, server = [{} for _ in sizes], {}
    return build_model("cnn-small", SHAPE).to("meta"), params, buffers, data, states, server


def _compare(name, sizes, rel):
    skeleton, params, buffers, data, states, server = _cohort_inputs(name, sizes)
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=KEYS)
    update, k_all = UPDATES[name], len(sizes)
    together = cohort_round(update, skeleton, params, buffers, states, server, hp, data, 4, 2,
                            [torch.Generator().manual_seed(10 + k) for k in range(k_all)])
    for k in range(k_all):
        alone = local_round(update, skeleton, unstack_tree(params, k), unstack_tree(buffers, k), states[k], server,
                            hp, *data[k], 4, 2, torch.Generator().manual_seed(10 + k))
        assert together.metrics[k]["num_steps"] == alone.metrics["num_steps"]
        pairs = [(together.params[n][k], alone.params[n]) for n in alone.params]
        pairs += [(together.buffers[n][k], alone.buffers[n]) for n in alone.buffers]
        pairs += [(together.states[k][s][n], alone.state[s][n]) for s in alone.state for n in alone.state[s]]
        pairs += [(together.replies[k][r][n], alone.reply[r][n]) for r in alone.reply for n in alone.reply[r]]
        for u, v in pairs:
            if rel == 0:
                assert torch.equal(u, v)
            else:
                assert (u - v).abs().max() <= rel * v.abs().max().clamp_min(1e-12)
        for key, value in alone.metrics.items():
            assert together.metrics[k][key] == pytest.approx(value, rel=max(rel, 1e-12))


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_cohort_of_three_clients_of_different_sizes(name):
    # 14 samples: batches 4, 4, 4, 2 per epoch; 6: 4, 2; 12: 4, 4, 4 -> 8, 4 and 6 steps
    _compare(name, [14, 6, 12], rel=1e-5)


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_cohort_of_one_is_exact(name):
    _compare(name, [10], rel=0)
