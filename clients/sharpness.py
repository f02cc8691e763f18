"""The SAM gradients the client methods share: SAM's own (``sam_gradient``: FedSAM, MoFedSAM,
FedGamma) and the one with a dual-pulled perturbation (``dual_sam_gradient``: FedSMOO and
FedSpeed); each module documents its use.
"""

from __future__ import annotations

import torch

from tasks.functional.core import Tree, grad_and_loss, keep_layout, perturbed_copy, sam_eps, sam_step


def sam_gradient(model, params, buffers, x, y, hp, rho: float, ascent_offset=None):
    """(d, the buffers after the first pass, the loss at w): g = grad f(w);
    eps = rho a / (||a|| + NORM_EPS) with a = g, or a = g + ``ascent_offset`` when given (FedGamma's
    global ascent along g + c - c_i); d = grad f(w + eps), applied at w. The buffers are those of
    the first (unperturbed) pass: the second pass's are dropped, so BatchNorm statistics count
    each batch once; w + eps is a copy, w never moves. FedSAM's, MoFedSAM's and FedGamma's gradient."""
    grads, new_buffers, loss = grad_and_loss(model, params, buffers, x, y, hp)
    ascent = grads if ascent_offset is None else {n: g + ascent_offset[n] for n, g in grads.items()}
    eps = dict(zip(ascent, sam_eps(ascent.values(), rho)))
    perturbed = {n: keep_layout(p + eps[n], p) for n, p in params.items()}
    sharp, _, _ = grad_and_loss(model, perturbed, new_buffers, x, y, hp)
    return sharp, new_buffers, loss


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
