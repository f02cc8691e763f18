"""FedDyn's dynamic regulariser, the client maths shared by the methods built on it (FedDyn,
FedSMOO, FedSpeed): the gradient memory g_k, its round constant g_k + α w_t, the two terms of
the step and the update of g_k after the round. α is each method's own key.

The regulariser's gradient, −g_k + α (w − w_t), is added in two places
(``tasks.functional.terms``): −(g_k + α w_t) with the gradient, before the clip, and α w after
it, as the authors' codes add it through SGD's ``weight_decay`` (alpemreacar/FedDyn
utils_general.py; FL-Simulator client/feddyn.py, fedsmoo.py, fedspeed.py: the linear term in
the loss, ``weight_decay = alpha + wd``). Without a clip the step is the same either way.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tasks.functional.core import Tree
from tasks.functional.terms import Term, constant, decay
from tasks.functional.update import Arrays


def dynamic_context(w_t: Tree, grad: Tree | None, alpha: float) -> dict:
    """g_k (``grad``; zeros the first time) and the round's constant offset g_k + α w_t."""
    g = grad or {n: torch.zeros_like(w) for n, w in w_t.items()}
    return {"grad": g, "offset": {n: g[n] + alpha * w_t[n] for n in w_t}}


def dynamic_update(grad: Tree, params: Tree, w_t: Tree, alpha: float) -> Tree:
    """g_k ← g_k − α (w_K − w_t): the first-order condition of the local objective at w_K."""
    return {n: g - alpha * (params[n] - w_t[n]) for n, g in grad.items()}


def grad_norm(grad: Tree) -> torch.Tensor:
    """‖g_k‖, the fit metric ``feddyn_grad_norm``."""
    return torch.sqrt(sum((g**2).sum() for g in grad.values()))


def dynamic_terms(alpha_key: str) -> tuple[Term, ...]:
    """−(g_k + α w_t) before the clip, then α w after it: −g_k + α (w − w_t) in all; nothing at
    α = 0 (the regulariser is off: g_k, which only α moves, is not applied either)."""
    offset = constant("offset", -1.0)
    return (replace(offset, coef=lambda hp: -1.0 if hp.keys[alpha_key] != 0 else 0.0), decay(alpha_key))


def all_param_names(model, cfg) -> list[str]:
    """Every parameter, in ``named_parameters`` order (g_k's entries)."""
    return [n for n, _ in model.named_parameters()]


GRAD = Arrays(all_param_names, record="feddyn-grad")  # g_k, kept per client
