"""The sharpness-aware local updates as ``LocalUpdate``s: FedASAM, FedGAM, FedGAM-CV (the
methods that take gradients at perturbed weights). The contract is in ``tasks.functional``'s docstring; each
method's reading of its paper is in its client module's docstring (clients/<method>.py).

Every perturbed point w + eps is a copy of the weights (``perturbed_copy``): w itself never
moves, so nothing has to be restored (the hook path's ``clients.perturbation.perturbed`` went
back by copy for the same reason), and the buffers a direction returns are those of its first,
unperturbed pass (BatchNorm statistics count that pass only). Each formula uses the same tensor
operations, in the same order, as the hook code it replaces, so the converted clients give the
same numbers as before (bit for bit on CPU; scripts/same_metrics.py, tests/test_functional_sharpness.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from tasks.functional.core import NORM_EPS, Tree, grad_and_loss, keep_layout, sam_eps, tree_norm
from tasks.functional.methods import LocalUpdate, control_variate_begin, control_variate_end


def perturbed_copy(params: Tree, eps: Tree) -> Tree:
    """w + eps as new tensors, each in the memory layout of its weight (``keep_layout``);
    a parameter without an entry in ``eps`` is passed through unchanged."""
    return {n: keep_layout(p + eps[n], p) if n in eps else p for n, p in params.items()}


# ------------------------------------------------------------------------------ FedASAM
def asam_scaled(names: Iterable[str]) -> dict[str, bool]:
    """Which tensors ASAM rescales: those named ``weight`` (the official ASAM code's rule),
    not biases."""
    return {n: n.rsplit(".", 1)[-1] == "weight" for n in names}


def asam_eps(params: Tree, grads: Tree, rho: float, eta: float, scaled: dict[str, bool]) -> Tree:
    """Adaptive SAM's ascent step (Kwon et al. 2021): eps = rho T^2 g / (||T g|| + NORM_EPS),
    T = |w| + eta elementwise where ``scaled[name]``, T = 1 elsewhere; the norm over all of
    ``grads``. Plain tensor ops, so vmap batches it."""
    t = {n: params[n].abs().add(eta) for n in grads if scaled[n]}
    tg = {n: t[n] * g if n in t else g for n, g in grads.items()}
    scale = rho / (tree_norm(tg.values()) + NORM_EPS)
    return {n: (v * t[n] if n in t else v) * scale for n, v in tg.items()}


def asam_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """g = grad f(w); eps = ``asam_eps``; d = grad f(w + eps), applied at w."""
    grads, loss, new_buffers = grad_and_loss(model, params, buffers, x, y, hp)
    eps = asam_eps(params, grads, hp.keys["asam-rho"], hp.keys["asam-eta"], asam_scaled(params))
    sharp, _, _ = grad_and_loss(model, perturbed_copy(params, eps), new_buffers, x, y, hp)
    return sharp, new_buffers, loss


FEDASAM = LocalUpdate("fedasam", asam_direction, keys=("asam-rho", "asam-eta"))


# ---------------------------------------------------------------------- FedGAM, FedGAM-CV
GAM_KEYS = ("gam-rho", "gam-variant", "gam-norm-rho", "gam-beta1", "gam-beta2", "gam-beta3", "gam-gamma")


def _sam_step(grads: Tree, rho: float) -> Tree:
    """``core.sam_eps`` on a tree: rho g / (||g|| + NORM_EPS)."""
    return dict(zip(grads, sam_eps(grads.values(), rho)))


def gam_gradient(model, params, buffers, x, y, hp, alpha: float) -> tuple[Tree, Tree, torch.Tensor]:
    """(G, the buffers after the first pass, the loss at w) of FedGAM's ``gam-variant``:

    - ``paper`` (Eq. 19): g = grad f(w), G = g + alpha rho grad f(w + rho g/||g||);
    - ``reference`` (GAM's optimiser step, Zhang et al. 2023; ``alpha`` unused):
      g0 = grad f(w), g1 = grad f(w + r1 g0/||g0||), w2 = w + r2 (g1 - g0)/||g1 - g0||,
      g2 = grad f(w2), g3 = grad f(w2 + r1 g2/||g2||), u = b1 g1 + b3 g3, m = g0 + |b2| g2,
      G = u - gamma (m - (<m, u>/||u||^2) u), the inner product through the cosine as GAM
      computes it.

    Every norm in a denominator has NORM_EPS added; each perturbed point is a copy of w."""
    keys = hp.keys
    g0, loss, new_buffers = grad_and_loss(model, params, buffers, x, y, hp)

    def grad_at(eps: Tree) -> Tree:
        return grad_and_loss(model, perturbed_copy(params, eps), new_buffers, x, y, hp)[0]

    r1 = keys["gam-rho"]
    g1 = grad_at(_sam_step(g0, r1))
    if keys["gam-variant"] == "paper":
        return {n: g.add(g1[n], alpha=alpha * r1) for n, g in g0.items()}, new_buffers, loss
    b1, b2, b3, gamma = keys["gam-beta1"], keys["gam-beta2"], keys["gam-beta3"], keys["gam-gamma"]
    e2 = _sam_step({n: g1[n] - g for n, g in g0.items()}, keys["gam-norm-rho"])
    g2 = grad_at(e2)
    e3 = {n: e + e_g2 for (n, e), e_g2 in zip(e2.items(), _sam_step(g2, r1).values())}  # from w
    g3 = grad_at(e3)
    u = {n: b1 * g1[n] + b3 * g3[n] for n in g0}
    m = {n: g0[n] + abs(b2) * g2[n] for n in g0}
    u_norm, m_norm = tree_norm(u.values()), tree_norm(m.values())
    cosine = sum((m[n] * u[n]).sum() for n in g0) / (u_norm * m_norm + NORM_EPS)
    along = cosine * m_norm / (u_norm + NORM_EPS)
    return {n: a - gamma * (m[n] - along * a) for n, a in u.items()}, new_buffers, loss


def gam_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = G (``gam_gradient`` with alpha = ``gam-alpha``)."""
    return gam_gradient(model, params, buffers, x, y, hp, hp.keys["gam-alpha"])


def gam_cv_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = G - c_i + c (G with alpha = ``gam-cv-alpha``) on the parameters with control
    variates, G elsewhere (the correction of ``methods.control_variate_direction``)."""
    grads, new_buffers, loss = gam_gradient(model, params, buffers, x, y, hp, hp.keys["gam-cv-alpha"])
    corr = ctx["corr"]
    return {n: g.add(corr[n]) if n in corr else g for n, g in grads.items()}, new_buffers, loss


FEDGAM = LocalUpdate("fedgam", gam_direction, keys=(*GAM_KEYS, "gam-alpha"))
# c and c_i, c_i+ and delta c_i: SCAFFOLD's begin and end (option II, momentum-corrected K_eff)
FEDGAM_CV = LocalUpdate("fedgam-cv", gam_cv_direction, control_variate_begin, control_variate_end,
                        keys=(*GAM_KEYS, "gam-cv-alpha"))

METHODS = {u.name: u for u in (FEDASAM, FEDGAM, FEDGAM_CV)}
