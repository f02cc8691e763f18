"""The sharpness-aware local updates (clients/fedasam.py, fedgam.py, fedgam_cv.py, fedsol.py,
fedsmoo.py) against independent references.

(a) Hand computations: one full-batch step of each update on softmax regression (``logreg``),
    recomputed in float64 from the formula with closed-form gradients; the perturbations on
    numbers small enough to do on paper.
(a') Each update equals the module-based training the clients ran before they became functions,
    written here as it ran (``torch.optim`` on a module, the perturbation moved into the weights
    in place and restored by copy, ``tests.kit_training.perturbed``), on a channels-last CNN
    and on a BatchNorm CNN: bit for bit (on CPU ``grad_and_loss`` runs the same autograd kernels
    as ``backward()``).
(b) A cohort of K = 3 (one ``vmap``) equals three ``local_round`` calls within 1e-5 relative
    (float32: vmap's batched convolutions and matmuls sum in another order, a few ulp per step),
    and a cohort of one equals ``local_round`` exactly.
(c) Where the method has state, a second round starts from the state the first left (FedGAM-CV
    here; FedSMOO's mu_i and h_i by hand through the client in tests/methods/test_fedsmoo.py, whose hand
    computations of one step in each mode also check FedSMOO's maths). FedSOL's proximal-loss
    sum and FedSMOO's dual ride in the round's carry, started by the loop for every client.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients import fedasam, fedgam, fedgam_cv, fedsmoo, fedsol
from clients.fedasam import asam_eps, asam_scaled
from clients.fedsol import fedsol_direction, fedsol_end
from tasks.catalogue import InputShape
from tasks.datasets import input_shape
from tasks.functional import Hyper, Round, cohort_round, local_round, module_state
from tasks.functional.rounds import stack_trees, unstack_tree
from tasks.models import build_model
from tests.kit import assert_cohort_client_equals, make_client
from tests.kit_training import module_round, perturbed, softmax_regression_grad

FEDASAM, FEDGAM, FEDGAM_CV, FEDSMOO, FEDSOL = (m.UPDATE for m in (fedasam, fedgam, fedgam_cv, fedsmoo, fedsol))
SHAPE = InputShape(1, 8, 10)  # one channel (channels-last quirk: keep_layout), small for speed
GAM = {"gam-rho": 0.3, "gam-alpha": 0.7, "gam-cv-alpha": 0.6, "gam-variant": "paper", "gam-norm-rho": 0.6,
       "gam-beta1": 1.0, "gam-beta2": -1.0, "gam-beta3": 1.0, "gam-gamma": 0.5}
SOL = {"fedsol-rho": 1.5, "fedsol-temperature": 3.0, "fedsol-perturb": "head", "fedsol-adaptive": True,
       "fedsol-radius": "layer"}
SMOO = {"smoo-rho": 0.3, "smoo-alpha": 0.2, "smoo-s": "paper", "smoo-clip-norm": 0.0}
KEYS = {"asam-rho": 0.5, "asam-eta": 0.01, **GAM, **SOL, **SMOO}
# name -> (update, keys that differ from KEYS)
CASES = {"fedasam": (FEDASAM, {}), "fedgam": (FEDGAM, {}), "fedgam-reference": (FEDGAM, {"gam-variant": "reference"}),
         "fedgam-cv": (FEDGAM_CV, {}), "fedgam-cv-reference": (FEDGAM_CV, {"gam-variant": "reference"}),
         # the paper's text (head, radius per tensor) and the authors' code (every layer, per axis)
         "fedsol-text": (FEDSOL, {}), "fedsol": (FEDSOL, {"fedsol-perturb": "all", "fedsol-radius": "axis"}),
         # the paper's s; the authors' code's (mu_i replied) with their clipping; plain SAM in FedDyn, alpha = 0
         "fedsmoo": (FEDSMOO, {}), "fedsmoo-code-clip": (FEDSMOO, {"smoo-s": "code", "smoo-clip-norm": 0.5}),
         "fedsmoo-none": (FEDSMOO, {"smoo-s": "none", "smoo-alpha": 0.0})}


# ------------------------------------------------------------------ (a) hand computations
LOGREG = ("head.weight", "head.bias")


def _logreg_step(update, keys, seed=0, lr=0.4, n=7, state=None, server=None, params=None):
    """One full-batch step of ``update`` on logreg: (x, y, W, b in float64, new W, b, the result)."""
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 60, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    model = build_model("logreg", input_shape("synthetic"), seed=seed)
    start, buffers = module_state(model)
    params = params or start
    result = local_round(Round(update, model, params, buffers, state or {}, server or {}, Hyper(lr=lr, keys=keys),
                         x, y, 64, 1, torch.Generator().manual_seed(1)))
    assert result.metrics["num_steps"] == 1
    f64 = [params[n].double().numpy() for n in LOGREG]
    new = [result.params[n].numpy() for n in LOGREG]
    return x.double().numpy(), y.numpy(), *f64, *new, result


def _norm(v):
    return np.sqrt(sum((a**2).sum() for a in v))


def _gam_paper(x, y, W, b, rho, alpha):
    """Eq. 19 in float64: g + alpha rho grad f(w + rho g/||g||)."""
    g = softmax_regression_grad(x, y, W, b)
    n = _norm(g)
    g_adv = softmax_regression_grad(x, y, W + rho * g[0] / n, b + rho * g[1] / n)
    return [a + alpha * rho * c for a, c in zip(g, g_adv)]


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
    x, y, W, b, new_W, new_b, _ = _logreg_step(FEDASAM, {"asam-rho": rho, "asam-eta": eta}, lr=lr)
    gW, gb = softmax_regression_grad(x, y, W, b)
    T = np.abs(W) + eta  # the weight: T = |w| + eta; the bias: T = 1
    n = np.sqrt(((T * gW) ** 2).sum() + (gb**2).sum())
    pW, pb = softmax_regression_grad(x, y, W + rho * T * T * gW / n, b + rho * gb / n)
    np.testing.assert_allclose(new_W, W - lr * pW, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_b, b - lr * pb, rtol=1e-5, atol=1e-6)
    assert not np.allclose(new_W, W - lr * gW, atol=1e-5)  # the perturbation matters


def test_fedgam_paper_step_is_eq19():
    rho, alpha, lr = 0.5, 0.7, 0.3  # large, so the second term is far above float noise
    x, y, W, b, new_W, new_b, _ = _logreg_step(FEDGAM, {**GAM, "gam-rho": rho, "gam-alpha": alpha}, lr=lr)
    G = _gam_paper(x, y, W, b, rho, alpha)
    np.testing.assert_allclose(new_W, W - lr * G[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_b, b - lr * G[1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(new_W, W - lr * softmax_regression_grad(x, y, W, b)[0], atol=1e-5)


def test_fedgam_reference_step_is_the_gam_optimiser_step():
    r1, r2, gamma, b1, b2, b3, lr = 0.3, 0.6, 0.5, 1.0, -1.0, 1.0, 0.3
    keys = {**GAM, "gam-variant": "reference", "gam-rho": r1, "gam-norm-rho": r2, "gam-gamma": gamma}
    x, y, W, b, new_W, new_b, _ = _logreg_step(FEDGAM, keys, seed=2, lr=lr)

    def grad(w):
        return softmax_regression_grad(x, y, *w)

    def at(w, d, scale):  # w + scale d / ||d||
        return [a + scale * c / _norm(d) for a, c in zip(w, d)]

    g0 = grad([W, b])
    g1 = grad(at([W, b], g0, r1))
    w2 = at([W, b], [a - c for a, c in zip(g1, g0)], r2)
    g2 = grad(w2)
    g3 = grad(at(w2, g2, r1))
    u = np.concatenate([(b1 * a + b3 * c).ravel() for a, c in zip(g1, g3)])
    m = np.concatenate([(a + abs(b2) * c).ravel() for a, c in zip(g0, g2)])
    G = u - gamma * (m - (m @ u) / (u @ u) * u)  # u minus gamma times the part of m orthogonal to u
    want = np.concatenate([W.ravel(), b]) - lr * G
    np.testing.assert_allclose(np.concatenate([new_W.ravel(), new_b]), want, rtol=1e-5, atol=1e-6)


def test_fedgam_cv_two_rounds_carry_c_i():
    """One step a round, momentum 0: c_i+ = c_i - c + (w_t - w)/lr = G(w_t) (the step was
    G - c_i + c); round 2 steps with G(w_t') - c_i+ + c from the state round 1 left."""
    rho, alpha, lr = 0.4, 0.6, 0.3
    keys = {**GAM, "gam-rho": rho, "gam-cv-alpha": alpha, "gam-alpha": 99.0}  # gam-alpha is not FedGAM-CV's
    gen = torch.Generator().manual_seed(9)
    c = {n: torch.randn(s, generator=gen) * 0.1 for n, s in (("head.weight", (10, 60)), ("head.bias", (10,)))}
    ci = {n: torch.randn(v.shape, generator=gen) * 0.1 for n, v in c.items()}
    x, y, W, b, new_W, new_b, first = _logreg_step(FEDGAM_CV, keys, lr=lr, state={"ci": ci}, server={"c": c})
    G = _gam_paper(x, y, W, b, rho, alpha)
    c64, ci64 = ([t[n].double().numpy() for n in LOGREG] for t in (c, ci))
    for new, w, g, cn, cin in zip((new_W, new_b), (W, b), G, c64, ci64):
        np.testing.assert_allclose(new, w - lr * (g - cin + cn), rtol=1e-5, atol=1e-6)
    for n, g, cin in zip(LOGREG, G, ci64):
        np.testing.assert_allclose(first.state["ci"][n].numpy(), g, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(first.reply["delta_c"][n].numpy(), g - cin, rtol=1e-4, atol=1e-5)
    assert first.metrics["ci_norm"] == pytest.approx(_norm(G), rel=1e-4)
    # round 2 from the state round 1 left, at the new global model
    start = {n: first.params[n] + 0.01 for n in LOGREG}
    x, y, W2, b2, new_W2, new_b2, _ = _logreg_step(FEDGAM_CV, keys, lr=lr, state=first.state, server={"c": c},
                                                   params=start)
    G2 = _gam_paper(x, y, W2, b2, rho, alpha)
    ci1 = [first.state["ci"][n].double().numpy() for n in LOGREG]
    for new, w, g, cn, cin in zip((new_W2, new_b2), (W2, b2), G2, c64, ci1):
        np.testing.assert_allclose(new, w - lr * (g - cin + cn), rtol=1e-5, atol=1e-6)


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.mark.parametrize("perturb,radius,adaptive", [("head", "layer", True), ("all", "axis", True),
                                                     ("all", "layer", False)])
def test_fedsol_step_at_w_off_the_global_model(perturb, radius, adaptive):
    """The direction at w != w_g on logreg (its one Linear is the head), in float64 by hand:
    g_p = dL_p/dw through (p_local - p_global)/(T B), Lambda, eps = rho Lambda g_p/||g_p||,
    d = grad CE(w + eps); the loss is CE(w), L_p = KL(p_g || p_l) joins the round's sum (the
    carry), whose mean over the round's steps ``fedsol_end`` reports as ``prox_loss``."""
    rho, T = 1.5, 3.0
    keys = {**SOL, "fedsol-rho": rho, "fedsol-temperature": T, "fedsol-perturb": perturb, "fedsol-radius": radius,
            "fedsol-adaptive": adaptive}
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(6, 60, generator=gen), torch.randint(0, 10, (6,), generator=gen)
    model = build_model("logreg", input_shape("synthetic"), seed=0)
    w_g, buffers = module_state(model)
    w = {n: v + 0.05 * torch.randn(v.shape, generator=gen) for n, v in w_g.items()}
    hp = Hyper(lr=0.1, keys=keys)
    ctx = FEDSOL.begin(w_g, {}, {"buffers": buffers}, hp)
    d, new_buffers, carry, loss = fedsol_direction(model, w, buffers, x, y, w_g, ctx, {"prox_sum": torch.tensor(0.25)},
                                                   hp)

    xn, yn = x.double().numpy(), y.numpy()
    (W, b), (Wg, bg) = ([t[n].double().numpy() for n in LOGREG] for t in (w, w_g))
    logits, global_logits = xn @ W.T + b, xn @ Wg.T + bg
    pl, pg = _softmax(logits / T), _softmax(global_logits / T)
    dz = (pl - pg) / (T * len(yn))
    gp = [dz.T @ xn, dz.sum(0)]
    lam = [np.ones_like(W), np.ones_like(b)]
    if adaptive:
        diffs = [np.abs(W - Wg), np.abs(b - bg)]
        if radius == "layer":
            lam = [dd / np.sqrt((dd**2).sum()) for dd in diffs]
        else:
            lam = [dd / np.sqrt((dd**2).sum(0, keepdims=True)) for dd in diffs]
    eps = [rho * la * g / _norm(gp) for la, g in zip(lam, gp)]
    want = softmax_regression_grad(xn, yn, W + eps[0], b + eps[1])
    for n, g in zip(LOGREG, want):
        np.testing.assert_allclose(d[n].numpy(), g, rtol=1e-4, atol=1e-6)
    assert not np.allclose(d["head.weight"].numpy(), softmax_regression_grad(xn, yn, W, b)[0], atol=1e-4)
    ce = -np.log(_softmax(logits)[np.arange(len(yn)), yn]).mean()
    kl = (pg * (np.log(pg) - np.log(pl))).sum(1).mean()
    assert float(loss) == pytest.approx(ce, rel=1e-5)
    assert float(carry["prox_sum"]) == pytest.approx(0.25 + kl, rel=1e-5)
    assert fedsol_end(w_g, w, new_buffers, carry, 2, ctx, {}, hp) == (
        {}, {}, {"prox_loss": pytest.approx((0.25 + kl) / 2, rel=1e-5)})


def test_fedsol_first_step_is_plain_sgd():
    """Lambda = 0 at w = w_g: the round's first step is the cross-entropy gradient, exactly."""
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(6, 60, generator=gen), torch.randint(0, 10, (6,), generator=gen)
    model = build_model("mlp", input_shape("synthetic"), seed=0)
    params, buffers = module_state(model)
    for perturb in ("head", "all"):
        hp = Hyper(lr=0.1, keys={**SOL, "fedsol-perturb": perturb})
        ctx = FEDSOL.begin(params, {}, {}, hp)
        d, _, _, _ = fedsol_direction(model, params, buffers, x, y, params, ctx, FEDSOL.initial_carry(params, ctx, hp),
                                      hp)
        plain = torch.func.grad(lambda p: F.cross_entropy(torch.func.functional_call(model, p, (x,)), y))(params)
        for n in params:
            torch.testing.assert_close(d[n], plain[n], rtol=0, atol=0)


def _without(result, metric: str):
    """``result`` (a ``RoundResult``) less the fit metric ``metric``."""
    return dataclasses.replace(result, metrics={k: v for k, v in result.metrics.items() if k != metric})


def assert_prox_sums_close(together, k: int, alone, rel: float) -> None:
    """FedSOL's ``prox_loss`` (the round's mean L_p) of cohort client ``k`` against its own round:
    a sum of KLs, each a difference of terms of order log(10), so float32 rounding is relative to
    those terms (about 1e-7 a step), not to the small KL: the sums (mean times steps) within
    1e-6 absolute, exactly equal when ``rel`` is 0."""
    u, v = together.metrics[k]["prox_loss"], alone.metrics["prox_loss"]
    steps = alone.metrics["num_steps"]
    assert u == v if rel == 0 else abs(u - v) * max(steps, 1) <= 1e-6


def test_fedsol_client_round_runs_as_a_cohort_with_a_masked_first_step():
    """FedSOL's round as its client prepares it (``prepare_round``: w_t, the received global
    buffers in ``server``) runs as a cohort whose first step is masked for one client (3 samples:
    one batch of 3, beside the other's batch of 4): the loop starts every client's carried
    proximal-loss sum at zero (``initial_carry``), so each client's ``prox_loss`` is that of its
    own round, and the short client's one step, at w = w_g, has L_p = 0 up to rounding."""
    gen = torch.Generator().manual_seed(6)
    x, y = torch.randn(9, 60, generator=gen), torch.randint(0, 10, (9,), generator=gen)
    client = make_client(FEDSOL, {"model": "mlp", "batch-size": 4,
                                                                  "local-epochs": 1}, x, y)
    job = client.prepare_round(client.get_parameters({}), {"server-round": 1})
    assert job.update is FEDSOL and "buffers" in job.server
    ctx = FEDSOL.begin(job.params, job.state, job.server, job.hp)
    assert torch.equal(FEDSOL.initial_carry(job.params, ctx, job.hp)["prox_sum"], torch.zeros(()))
    data = [(x, y), (x[:3], y[:3])]
    gens = [torch.Generator().manual_seed(k) for k in range(2)]
    params = {n: p.contiguous() for n, p in stack_trees([job.params] * 2).items()}
    together = cohort_round(job.update, job.model, params, stack_trees([job.buffers] * 2), [{}, {}], job.server,
                            job.hp, data, 4, 1, gens)
    for k, (xk, yk) in enumerate(data):
        alone = local_round(Round(job.update, job.model, job.params, job.buffers, {}, job.server, job.hp, xk, yk, 4, 1,
                            torch.Generator().manual_seed(k)))
        assert_cohort_client_equals(together, k, _without(alone, "prox_loss"), 1e-5)
        assert_prox_sums_close(together, k, alone, 1e-5)
    assert together.metrics[0]["prox_loss"] > 1e-6  # the long client's later steps are off w_g: L_p acts
    assert together.metrics[1]["num_steps"] == 1 and abs(together.metrics[1]["prox_loss"]) <= 1e-7


@pytest.mark.parametrize("clip", [0.05, 1e3])
def test_fedsmoo_clip_scales_the_step_down_never_up(clip):
    """One full-batch FedSMOO step on logreg in float64 against the formula by hand (the paper's
    s, alpha > 0, g_k, mu_i and s non-zero): g = grad f(w), v = g - mu_i - s, shat = rho v/||v||,
    gtil = grad f(w + shat), d = gtil - (g_k + alpha w_t), d *= min(1, clip/(||d|| + 1e-6))
    (``clip_grad_norm_``'s rule), w' = w - lr (d + alpha w). A clip below ||d|| shrinks the
    step; a clip far above ||d|| (1e3) leaves it as it is: the clip caps the step's norm, it
    never stretches d up to the clip norm (which would grow this step about 1e3/||d|| times)."""
    rho, alpha, lr = 0.3, 0.2, 0.4
    keys = {**SMOO, "smoo-rho": rho, "smoo-alpha": alpha, "smoo-s": "paper", "smoo-clip-norm": clip}
    gen = torch.Generator().manual_seed(8)
    x, y = torch.randn(7, 60, generator=gen, dtype=torch.float64), torch.randint(0, 10, (7,), generator=gen)
    model = build_model("logreg", input_shape("synthetic"), seed=0).double()
    w_t, buffers = module_state(model)
    g_k, s, mu = ({n: 0.05 * torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in w_t.items()}
                  for _ in range(3))
    result = local_round(Round(FEDSMOO, model, w_t, buffers, {"grad": g_k, "mu": mu}, {"s": s},
                         Hyper(lr=lr, keys=keys), x, y, 64, 1, torch.Generator().manual_seed(1)))
    assert result.metrics["num_steps"] == 1

    xn, yn = x.numpy(), y.numpy()
    W, b = (w_t[n].numpy() for n in LOGREG)
    g_kn, sn, mun = ([t[n].numpy() for n in LOGREG] for t in (g_k, s, mu))
    v = [a - m - c for a, m, c in zip(softmax_regression_grad(xn, yn, W, b), mun, sn)]
    shat = [rho * a / (_norm(v) + 1e-12) for a in v]
    gtil = softmax_regression_grad(xn, yn, W + shat[0], b + shat[1])
    d = [a - (gk + alpha * w) for a, gk, w in zip(gtil, g_kn, (W, b))]
    if clip < _norm(d):
        assert clip == 0.05 and _norm(d) > 10 * clip  # the clip acts, and strongly
        d = [a * clip / (_norm(d) + 1e-6) for a in d]
    else:
        assert clip == 1e3 and _norm(d) < 1e-2 * clip  # far above ||d||: d stays as it is
    for n, w, dd, m, e, c in zip(LOGREG, (W, b), d, mun, shat, sn):
        np.testing.assert_allclose(result.params[n].numpy(), w - lr * (dd + alpha * w), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(result.state["mu"][n].numpy(), m + e - c, rtol=1e-10, atol=1e-12)


# ------------------------------------------------- (a') against the module-based training
def _module_asam_eps(params, grads, rho, eta, scaled):
    """ASAM's eps as the module-based client computed it: T g in one buffer, then T T g, then the scale."""
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


def _module_sam_step(model, xb, yb, eps_fn):
    """The module-based SAM-style step: .grad = grad f(w + eps) with w + eps in place."""
    params = list(model.parameters())
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    eps = eps_fn(params, [p.grad for p in params])
    with perturbed(params, eps, model):
        for p in params:
            p.grad = None
        F.cross_entropy(model(xb), yb).backward()
    return loss.detach()


def module_fedasam(model, xb, yb, keys, ctx):
    scaled = [n.rsplit(".", 1)[-1] == "weight" for n, _ in model.named_parameters()]
    return _module_sam_step(model, xb, yb, lambda p, g: _module_asam_eps(p, g, keys["asam-rho"], keys["asam-eta"], scaled))


def _module_sam_eps(grads, rho):
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    return [g * (rho / (norm + 1e-12)) for g in grads]


def _module_grad(model, xb, yb, params):
    loss = F.cross_entropy(model(xb), yb)
    return loss.detach(), list(torch.autograd.grad(loss, params))


def module_fedgam(model, xb, yb, keys, ctx, alpha_key="gam-alpha"):
    """FedGAM's module-based step (both variants); then ctx's correction c - c_i, if any."""
    params = list(model.parameters())
    r1 = keys["gam-rho"]
    loss, g0 = _module_grad(model, xb, yb, params)
    with perturbed(params, _module_sam_eps(g0, r1), model):
        _, g1 = _module_grad(model, xb, yb, params)
    if keys["gam-variant"] == "paper":
        grad = [a.add_(c, alpha=keys[alpha_key] * r1) for a, c in zip(g0, g1)]
    else:
        b1, b2, b3, gamma = keys["gam-beta1"], keys["gam-beta2"], keys["gam-beta3"], keys["gam-gamma"]
        e2 = _module_sam_eps([a - c for a, c in zip(g1, g0)], keys["gam-norm-rho"])
        with perturbed(params, e2, model):
            _, g2 = _module_grad(model, xb, yb, params)
        e3 = [a + c for a, c in zip(e2, _module_sam_eps(g2, r1))]
        with perturbed(params, e3, model):
            _, g3 = _module_grad(model, xb, yb, params)
        u = [b1 * a + b3 * c for a, c in zip(g1, g3)]
        m = [a + abs(b2) * c for a, c in zip(g0, g2)]
        u_norm, m_norm = (torch.linalg.vector_norm(torch.stack(torch._foreach_norm(t))) for t in (u, m))
        cosine = sum((a * c).sum() for a, c in zip(m, u)) / (u_norm * m_norm + 1e-12)
        along = cosine * m_norm / (u_norm + 1e-12)
        grad = [a - gamma * (mm - along * a) for a, mm in zip(u, m)]
    for p, g in zip(params, grad):
        p.grad = g
    with torch.no_grad():
        for p, corr in zip(params, ctx.get("corr", ())):
            p.grad.add_(corr)
    return loss


def module_fedgam_cv(model, xb, yb, keys, ctx):
    return module_fedgam(model, xb, yb, keys, ctx, alpha_key="gam-cv-alpha")


def module_fedsol(model, xb, yb, keys, ctx):
    """FedSOL's module-based step: the global model a frozen eval-mode copy of w_t, the
    head's perturbation on a shared body pass, w + eps in place and restored by copy."""
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    head_only = keys["fedsol-perturb"] == "head"
    index = [i for i, n in enumerate(names) if not head_only or n.startswith("head.")]
    targets = [params[i] for i in index]
    if head_only:
        features = model.body(xb)
        logits = model.head(features)
    else:
        logits = model(xb)
    ce = F.cross_entropy(logits, yb)
    T = keys["fedsol-temperature"]
    with torch.no_grad():
        global_logits = ctx["global_model"](xb)
        prox = F.kl_div(F.log_softmax(logits / T, dim=1), F.softmax(global_logits / T, dim=1), reduction="batchmean")
        d_logits = F.softmax(logits / T, dim=1) - F.softmax(global_logits / T, dim=1)
        d_logits /= T * len(xb)
    grads = torch.autograd.grad(logits, targets, grad_outputs=d_logits, retain_graph=head_only)
    scale = keys["fedsol-rho"] / (torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(grads)))) + 1e-12)
    eps = [None] * len(params)
    for i, w, g in zip(index, targets, grads):
        e = g * scale
        if keys["fedsol-adaptive"]:
            diff = (w.detach() - ctx["round_start"][i]).abs()
            if keys["fedsol-radius"] == "axis":
                e = e * F.normalize(diff, p=2.0, dim=0, eps=1e-12)
            else:
                e = e * (diff / (torch.linalg.vector_norm(diff) + 1e-12))
        eps[i] = e
    with perturbed(params, eps, model):
        loss = F.cross_entropy(model.head(features) if head_only else model(xb), yb)
        loss.backward()
    ctx["prox_sum"] += prox
    return ce.detach()


def module_fedsmoo(model, xb, yb, keys, ctx):
    """FedSMOO's module-based step: FedSAM's step with shat = rho v/||v|| built in
    the gradient buffers (mu_i updated in place), then FedDyn's dual, the clip, + alpha w."""
    rho, alpha, clip = keys["smoo-rho"], keys["smoo-alpha"], keys["smoo-clip-norm"]

    def eps_fn(params, grads):
        if keys["smoo-s"] == "none":
            return _module_sam_eps([g.detach() for g in grads], rho)
        v = [g.sub_(m).sub_(s) for g, m, s in zip(grads, ctx["mu"], ctx["s"])]
        shat = _module_sam_eps(v, rho)
        for m, e, s in zip(ctx["mu"], shat, ctx["s"]):
            m.add_(e)
            m.sub_(s)
        return shat

    loss = _module_sam_step(model, xb, yb, eps_fn)
    params = list(model.parameters())
    with torch.no_grad():
        if alpha != 0:
            for p, c in zip(params, ctx["offset"]):
                p.grad.sub_(c)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        if alpha != 0:
            for p in params:
                p.grad.add_(p.detach(), alpha=alpha)
    return loss


MODULE_STEPS = {"fedsmoo": module_fedsmoo, "fedsmoo-code-clip": module_fedsmoo, "fedsmoo-none": module_fedsmoo,
         "fedsol": module_fedsol, "fedsol-text": module_fedsol, "fedasam": module_fedasam, "fedgam": module_fedgam, "fedgam-reference": module_fedgam,
         "fedgam-cv": module_fedgam_cv, "fedgam-cv-reference": module_fedgam_cv}


def _inputs_for(name, model, gen, keys):
    """(state, server, starting buffers, the module step's view of them) for method ``name``: c and c_i
    for control variates (non-zero, so the correction really acts); FedSOL's global model (its
    buffers, and for the module step a frozen eval-mode copy); FedSMOO's g_k, s and mu_i (non-zero);
    nothing for stateless methods."""
    params, buffers = module_state(model)
    if name.startswith("fedsol"):
        frozen = copy.deepcopy(model).eval()
        return {}, {"buffers": buffers}, buffers, {"global_model": frozen, "round_start": list(params.values()),
                                                   "prox_sum": torch.zeros(())}
    if name.startswith("fedgam-cv"):
        c, ci = ({n: torch.randn(p.shape, generator=gen) * 0.1 for n, p in params.items()} for _ in range(2))
        return {"ci": ci}, {"c": c}, buffers, {"corr": [c[n] - ci[n] for n in params]}
    if name.startswith("fedsmoo"):
        g_k, s, mu = ({n: torch.randn(p.shape, generator=gen) * 0.05 for n, p in params.items()} for _ in range(3))
        if keys["smoo-s"] == "none":
            mu = {n: torch.zeros_like(m) for n, m in mu.items()}
        offset = [g_k[n] + keys["smoo-alpha"] * params[n] for n in params]
        return ({"grad": g_k, "mu": mu}, {"s": s}, buffers,
                {"mu": [m.clone() for m in mu.values()], "s": list(s.values()), "offset": offset})
    return {}, {}, buffers, {}


# every case on the channels-last CNN; the BatchNorm CNN (buffers of the first pass kept) once per update
TWIN_CASES = [(name, "cnn-small") for name in sorted(CASES)]
TWIN_CASES += [(name, "cnn-bn") for name in ("fedasam", "fedgam-cv", "fedsol", "fedsol-text", "fedsmoo")]


@pytest.mark.parametrize("name,model_name", TWIN_CASES)
def test_update_equals_the_module_loop(name, model_name):
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(10, 1, 8, 8, generator=gen), torch.randint(0, 10, (10,), generator=gen)
    model = build_model(model_name, SHAPE, seed=0)
    params, _ = module_state(model)
    update, keys = CASES[name]
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys={**KEYS, **keys})
    state, server, buffers, ctx = _inputs_for(name, model, gen, hp.keys)
    result = local_round(Round(update, copy.deepcopy(model), params, buffers, state, server, hp,
                         x, y, 4, 2, torch.Generator().manual_seed(3)))
    loss = module_round(MODULE_STEPS[name], model, x, y, hp, 4, 2, 3, ctx)
    assert result.metrics["train_loss"] == loss and result.metrics["num_steps"] == 6
    for n, p in model.named_parameters():
        assert torch.equal(result.params[n], p.detach()), n
    for n, b in model.named_buffers():
        assert torch.equal(result.buffers[n], b), n
    if "prox_sum" in ctx:
        assert result.metrics["prox_loss"] == ctx["prox_sum"].item() / 6
    if "mu" in ctx and hp.keys["smoo-s"] != "none":  # the dual, updated at every step, kept
        for n, m in zip(params, ctx["mu"]):
            assert torch.equal(result.state["mu"][n], m), n
    if "mu" in ctx and hp.keys["smoo-s"] == "none":  # held at zero, not kept
        assert "mu" not in result.state and result.metrics["smoo_mu_norm"] == 0


# -------------------------------------------------------------------------------- (b) cohorts
def _cohort_inputs(name, sizes, seed=5):
    gen = torch.Generator().manual_seed(seed)
    models = [build_model("cnn-small", SHAPE, seed=k) for k in range(len(sizes))]
    params, buffers = (stack_trees(t) for t in zip(*(module_state(m) for m in models)))
    params = {n: p.contiguous() for n, p in params.items()}  # the layout vmap batches
    data = [(torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)) for n in sizes]
    states, server = [{} for _ in sizes], {}
    if name.startswith("fedsmoo"):  # g_k and mu_i per client, s shared
        mus = [{n: torch.randn(v.shape[1:], generator=gen) * 0.05 for n, v in params.items()} for _ in sizes]
        states = [{"grad": {n: torch.randn(v.shape[1:], generator=gen) * 0.05 for n, v in params.items()}, "mu": mu}
                  for mu in mus]
        server = {"s": {n: torch.randn(v.shape[1:], generator=gen) * 0.05 for n, v in params.items()}}
    if name.startswith("fedgam-cv"):  # c_i different per client, c shared
        states = [{"ci": {n: torch.randn(v.shape[1:], generator=gen) * 0.1 for n, v in params.items()}} for _ in sizes]
        server = {"c": {n: torch.randn(v.shape[1:], generator=gen) * 0.1 for n, v in params.items()}}
    return build_model("cnn-small", SHAPE).to("meta"), params, buffers, data, states, server


def _compare(name, sizes, rel):
    skeleton, params, buffers, data, states, server = _cohort_inputs(name, sizes)
    update, keys = CASES[name]
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys={**KEYS, **keys})
    k_all = len(sizes)
    together = cohort_round(update, skeleton, params, buffers, states, server, hp, data, 4, 1,
                            [torch.Generator().manual_seed(10 + k) for k in range(k_all)])
    for k in range(k_all):
        alone = local_round(Round(update, skeleton, unstack_tree(params, k), unstack_tree(buffers, k), states[k], server,
                            hp, *data[k], 4, 1, torch.Generator().manual_seed(10 + k)))
        if "prox_loss" in alone.metrics:  # FedSOL's: compared as a sum (assert_prox_sums_close)
            assert_prox_sums_close(together, k, alone, rel)
            alone = _without(alone, "prox_loss")
        assert_cohort_client_equals(together, k, alone, rel)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cohort_of_three_clients_of_different_sizes(name):
    # 9 samples: batches 4, 4, 1; 3: one batch of 3; 6: 4, 2 (one epoch): masked at every step
    _compare(name, [9, 3, 6], rel=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cohort_of_one_is_exact(name):
    _compare(name, [6], rel=0)
