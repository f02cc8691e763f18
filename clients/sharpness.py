"""The SAM gradient with a dual-pulled perturbation, the client maths shared by FedSMOO and
FedSpeed (each module documents its use; the formulas are in ``dual_sam_gradient``).
"""

from __future__ import annotations

import torch

from tasks.functional.core import Tree, grad_and_loss, perturbed_copy, sam_step


def dual_sam_gradient(model, params, buffers, x, y, hp, rho: float, mu: Tree, s: Tree | None,
                      merge: float = 1.0) -> tuple[Tree, Tree, Tree, Tree, torch.Tensor]:
    """(g̃, the buffers after the first pass, μ_i', ŝ, the loss at w) on batch (x, y):

    g = ∇f(w); with a global perturbation ``s``: v = g − μ_i − s, ŝ = ρ v / (‖v‖ + NORM_EPS),
    μ_i' = μ_i + ŝ − s (FedSMOO); with ``s`` None: ŝ = SAM's ρ g / (‖g‖ + NORM_EPS), μ_i' = μ_i
    (FedSpeed, FedSMOO's ``none``); g̃ = ∇f(w + ŝ) on the same batch, and with ``merge`` m ≠ 1,
    (1 − m) g + m g̃ (FedSpeed's text; m is a Python float, so vmap batches it)."""
    grads, new_buffers, loss = grad_and_loss(model, params, buffers, x, y, hp)
    if s is None:
        shat = sam_step(grads, rho)
    else:
        shat = sam_step({n: g - mu[n] - s[n] for n, g in grads.items()}, rho)
        mu = {n: m + shat[n] - s[n] for n, m in mu.items()}
    d, _, _ = grad_and_loss(model, perturbed_copy(params, shat), new_buffers, x, y, hp)
    if merge != 1:
        d = {n: g.mul(merge).add(grads[n], alpha=1 - merge) for n, g in d.items()}
    return d, new_buffers, mu, shat, loss


def dual_carry(mu: Tree) -> Tree:
    """The per-step carry: the dual μ_i and the last step's perturbation ŝ (zeros at first)."""
    return {"mu": mu, "shat": {n: torch.zeros_like(m) for n, m in mu.items()}}
