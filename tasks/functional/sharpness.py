"""The sharpness-aware local updates as ``LocalUpdate``s: FedASAM (and, below, the methods that
take gradients at perturbed weights). The contract is in ``tasks.functional``'s docstring; each
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

from tasks.functional.core import NORM_EPS, Tree, grad_and_loss, keep_layout, tree_norm
from tasks.functional.methods import LocalUpdate


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

METHODS = {u.name: u for u in (FEDASAM,)}
