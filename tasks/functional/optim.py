"""The local optimisers of ``tasks.optim`` as pure functions: (params, direction, state) ->
(params', state'), the same tensor operations in the same order as ``torch.optim``'s
single-tensor implementations (the ones it runs on CPU), each new weight in its old memory
layout (``core.keep_layout``), so on CPU a functional step equals
``torch.optim``'s bit for bit (tests/training/test_functional.py). On CUDA ``torch.optim`` takes its
multi-tensor (foreach) kernels, the same formulas in other kernels: equal within rounding.

- ``sgd``: d += wd w; with momentum beta, b = d on the first step, else b = beta b + d; then
  w -= lr b (heavy ball, no dampening, no Nesterov: ``torch.optim.SGD``'s defaults).
- ``adam`` / ``adamw``: betas (0.9, 0.999), eps 1e-8 (``tasks.optim``'s fixed values);
  ``adam`` adds wd w to d (L2), ``adamw`` decays w by (1 - lr wd) first (decoupled).

``t`` is the 1-based number of the step within the round (the optimiser starts afresh every
round): a Python int, the same for every client of a cohort at a given step, since a client
takes its s-th step at the cohort's s-th step or not at all.
"""

from __future__ import annotations

import torch

from tasks.functional.core import Hyper, Tree, keep_layout

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def opt_init(params: Tree, hp: Hyper) -> dict[str, Tree]:
    """The optimiser's state at the start of a round (zeros; SGD without momentum: none)."""
    if hp.optimizer == "sgd":
        return {"buf": {n: torch.zeros_like(p) for n, p in params.items()}} if hp.momentum != 0 else {}
    if hp.optimizer in ("adam", "adamw"):
        return {"exp_avg": {n: torch.zeros_like(p) for n, p in params.items()},
                "exp_avg_sq": {n: torch.zeros_like(p) for n, p in params.items()}}
    raise ValueError(f"optimizer {hp.optimizer!r} is invalid; valid choices: sgd, adam, adamw")


def opt_step(params: Tree, direction: Tree, state: dict[str, Tree], hp: Hyper,
             t: int) -> tuple[Tree, dict[str, Tree]]:
    """One optimiser step along ``direction`` (the method's corrected gradient)."""
    if hp.optimizer == "sgd":
        return _sgd(params, direction, state, hp, t)
    return _adam(params, direction, state, hp, t)


def _sgd(params: Tree, direction: Tree, state: dict[str, Tree], hp: Hyper, t: int):
    new_params, bufs = {}, {}
    for n, p in params.items():
        d = direction[n]
        if hp.weight_decay != 0:
            d = d.add(p, alpha=hp.weight_decay)
        if hp.momentum != 0:
            d = d.clone() if t == 1 else state["buf"][n].mul(hp.momentum).add(d)
            bufs[n] = d
        new_params[n] = keep_layout(p.add(d, alpha=-hp.lr), p)
    return new_params, ({"buf": bufs} if hp.momentum != 0 else {})


def _adam(params: Tree, direction: Tree, state: dict[str, Tree], hp: Hyper, t: int):
    beta1, beta2 = ADAM_BETAS
    step_size = hp.lr / (1 - beta1**t)
    bias_correction2_sqrt = (1 - beta2**t) ** 0.5
    new_params, m_new, v_new = {}, {}, {}
    for n, p in params.items():
        d = direction[n]
        if hp.weight_decay != 0:
            if hp.optimizer == "adamw":
                p = p.mul(1 - hp.lr * hp.weight_decay)
            else:
                d = d.add(p, alpha=hp.weight_decay)
        m_new[n] = state["exp_avg"][n].lerp(d, 1 - beta1)
        v_new[n] = state["exp_avg_sq"][n].mul(beta2).addcmul(d, d, value=1 - beta2)
        denom = (v_new[n].sqrt() / bias_correction2_sqrt).add(ADAM_EPS)
        new_params[n] = keep_layout(p.addcdiv(m_new[n], denom, value=-step_size), params[n])
    return new_params, {"exp_avg": m_new, "exp_avg_sq": v_new}
