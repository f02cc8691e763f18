"""The GAM gradient (gradient-aligned sharpness), shared by FedGAM and FedGAM-CV: each method's
module documents its use; the formulas are in ``gam_gradient``'s docstring and docs/methods.md."""

from __future__ import annotations

import torch

from protocol.keys import Key, non_negative, positive
from tasks.functional.core import NORM_EPS, Tree, grad_and_loss, perturbed_copy, sam_step, tree_norm


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
    g0, new_buffers, loss = grad_and_loss(model, params, buffers, x, y, hp)

    def grad_at(eps: Tree) -> Tree:
        return grad_and_loss(model, perturbed_copy(params, eps), new_buffers, x, y, hp)[0]

    r1 = keys["gam-rho"]
    g1 = grad_at(sam_step(g0, r1))
    if keys["gam-variant"] == "paper":
        return {n: g.add(g1[n], alpha=alpha * r1) for n, g in g0.items()}, new_buffers, loss
    b1, b2, b3, gamma = keys["gam-beta1"], keys["gam-beta2"], keys["gam-beta3"], keys["gam-gamma"]
    e2 = sam_step({n: g1[n] - g for n, g in g0.items()}, keys["gam-norm-rho"])
    g2 = grad_at(e2)
    e3 = {n: e + e_g2 for (n, e), e_g2 in zip(e2.items(), sam_step(g2, r1).values())}  # from w
    g3 = grad_at(e3)
    u = {n: b1 * g1[n] + b3 * g3[n] for n in g0}
    m = {n: g0[n] + abs(b2) * g2[n] for n in g0}
    u_norm, m_norm = tree_norm(u.values()), tree_norm(m.values())
    cosine = sum((m[n] * u[n]).sum() for n in g0) / (u_norm * m_norm + NORM_EPS)
    along = cosine * m_norm / (u_norm + NORM_EPS)
    return {n: a - gamma * (m[n] - along * a) for n, a in u.items()}, new_buffers, loss


# The GAM keys both variants read (FedGAM-CV with its own alpha).
GAM_KEYS = {
    "gam-rho": Key(0.02, positive, "> 0 (perturbation radius rho)"),
    "gam-variant": Key("paper", choices=("paper", "reference")),
    "gam-norm-rho": Key(0.2, positive, "> 0 (reference GAM: grad_norm_rho)"),
    "gam-beta1": Key(1.0),
    "gam-beta2": Key(-1.0),
    "gam-beta3": Key(1.0),
    "gam-gamma": Key(0.03, non_negative, ">= 0 (reference GAM: grad_gamma)"),
}
