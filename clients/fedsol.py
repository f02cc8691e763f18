"""FedSOL: the local gradient is taken at weights perturbed along the gradient of a proximal loss,
which makes local learning orthogonal to what would change the proximal objective (Lee, Jeong,
Kim, Oh, Yun, CVPR 2024).

- Client, per batch, with p = softmax(logits / T) and the global logits from a frozen eval-mode
  copy of w_g = w_t:
  1. L_p = KL(p_global ‖ p_local), averaged over the batch (batchmean); g_p = ∇L_p with respect
     to the perturbed parameters (the classifier head, `fedsol-perturb = "head"`, or all
     parameters, `"all"`);
  2. the radius Λ: with Δ = |w − w_g| (elementwise) for each perturbed tensor,
     - `fedsol-radius = "layer"` (default, the paper's Eq. 7): Λ = Δ / ‖Δ‖₂, the norm over the
       whole tensor;
     - `fedsol-radius = "axis"` (the authors' code): Λ = Δ normalised along the tensor's first
       axis, Λ[i, j, ...] = Δ[i, j, ...] / ‖Δ[:, j, ...]‖₂ (PyTorch's `F.normalize(Δ, dim=0)`;
       for a bias vector the two agree);
     - `fedsol-adaptive = false`: Λ = 1;

     Λ = 0 while w = w_g, so the round's first step is plain SGD;
  3. ε = ρ Λ ⊙ g_p / ‖g_p‖, the norm over the perturbed set (Eq. 8);
  4. d = ∇CE(w + ε; b) for every parameter, applied at w (Eq. 6; the weights go back to w by
     copy).
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`). State: none (the global copy is
  rebuilt each round).
- Fit metric `prox_loss` (mean L_p over the round); `train_loss` is the CE at the unperturbed
  weights.
- Keys: `fedsol-rho` ρ (1.0, > 0; the paper's best range is 0.5 to 2), `fedsol-temperature` T
  (3.0, > 0), `fedsol-perturb` (`head` | `all`, default `head`), `fedsol-radius` (`layer` |
  `axis`, default `layer`), `fedsol-adaptive` (true). The paper's optimiser is SGD with
  `momentum = 0.9`, `weight-decay = 1e-5`, `lr-decay = 0.99`.
- Readings: the paper's text perturbs the classifier head with a per-tensor radius (the
  defaults); the authors' code, which produced the paper's tables, perturbs every layer with the
  per-axis radius, ε = F.normalize(|w − w_g|, dim=0) ⊙ g_p ρ / (‖g_p‖ + 1e-12) with ‖g_p‖ over
  the whole model. Both are available: `fedsol-perturb = "all"` with `fedsol-radius = "axis"` is
  the code's perturbation. g_p is back-propagated from its closed form ∂L_p/∂logits =
  (p_local − p_global) / (T · batch size), which is exactly zero when the two models agree
  (autograd through the KL leaves about 1e-9 of rounding there, which the normalisation in step 3
  would blow up to a ρ-sized random perturbation). With head perturbation the body's forward
  pass is shared between the two passes (the body does not depend on the head, so the gradient
  is the same at lower cost).

Summary: client CE gradient at a proximal perturbation | server - | client state - | server
state - | traffic -
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vjp

from protocol.keys import Key, positive
from tasks.functional.core import (
    NORM_EPS,
    Hyper,
    Tree,
    eval_logits,
    grad_and_loss,
    perturbed_copy,
    submodule_state,
    tree_norm,
)
from tasks.functional.update import LocalUpdate

RADII = ("layer", "axis")


def fedsol_eps(weights: Tree, global_weights: Tree, prox_grads: Tree, rho: float, adaptive: bool = True,
               radius: str = "layer") -> Tree:
    """eps = rho Lambda (.) g_p / (||g_p|| + NORM_EPS) on the tensors of ``prox_grads``, ||g_p||
    over all of them.

    Lambda (``adaptive``; else 1) from d = |w - w_g|: ``radius = "layer"`` d / (||d|| + NORM_EPS)
    per tensor (Eq. 7 of the paper's text); ``"axis"`` F.normalize(d, dim=0), d / max(||d||,
    NORM_EPS) with the norm over dim 0 (every column of a Linear weight, every (in, kh, kw)
    fibre of a conv weight; a bias as a whole), as the authors' code computes it. Lambda = 0
    where w = w_g, so the round's first step is plain SGD.
    """
    if radius not in RADII:
        raise ValueError(f"fedsol radius {radius!r} is invalid; valid choices: {', '.join(RADII)}")
    scale = rho / (tree_norm(prox_grads.values()) + NORM_EPS)
    out = {}
    for n, g in prox_grads.items():
        e = g * scale
        if adaptive:
            diff = (weights[n] - global_weights[n]).abs()
            if radius == "axis":
                e = e * F.normalize(diff, p=2.0, dim=0, eps=NORM_EPS)
            else:
                e = e * (diff / (torch.linalg.vector_norm(diff) + NORM_EPS))
        out[n] = e
    return out


def proximal_kl(local_logits: torch.Tensor, global_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """L_p = KL(p_global || p_local) of the softened probabilities, averaged over the batch:
    ``F.kl_div(log p_local, p_global, reduction="batchmean")`` written out as ATen computes it
    (xlogy(p, p) - p log q, summed, over B), since vmap has no batching rule for ``kl_div``."""
    log_local = F.log_softmax(local_logits / temperature, dim=1)
    p_global = F.softmax(global_logits / temperature, dim=1)
    return (torch.xlogy(p_global, p_global) - p_global * log_local).sum() / log_local.size(0)


def proximal_logit_grad(local_logits: torch.Tensor, global_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """dL_p/dlogits in closed form, (p_local - p_global) / (T B): exactly zero where the two
    models' logits agree, so no rounding noise gets normalised into a rho-sized perturbation
    (as autograd through ``kl_div`` would give at w = w_g)."""
    diff = F.softmax(local_logits / temperature, dim=1) - F.softmax(global_logits / temperature, dim=1)
    return diff / (temperature * len(local_logits))


def fedsol_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """The global model's buffers (``server["buffers"]``, those received with w_t; none for a
    model without buffers): its eval-mode forward at w_t gives the global logits."""
    return {"global_buffers": dict(server.get("buffers", {}))}


def fedsol_carry(w_t: Tree, ctx: dict, hp: Hyper) -> Tree:
    """The round's running sum of the proximal loss L_p, started at zero (the fit metric
    ``prox_loss`` is its mean, ``fedsol_end``)."""
    some = next(iter(w_t.values()))
    return {"prox_sum": torch.zeros((), dtype=some.dtype, device=some.device)}


def _head_pass(model, params, buffers, x, y, eps_of):
    """(logits at w, d, new buffers) with only the head perturbed: one body pass, its vjp fed the
    gradient of CE(head(w_head + eps; features)) with respect to the features."""
    def body(p: Tree) -> tuple[torch.Tensor, Tree]:
        new = {n: b.clone() for n, b in submodule_state(buffers, "body").items()}
        return functional_call(model.body, (p, new), (x,)), new

    def head(p: Tree, features: torch.Tensor) -> torch.Tensor:
        return functional_call(model.head, p, (features,))

    features, body_vjp, body_buffers = vjp(body, submodule_state(params, "body"), has_aux=True)
    head_params = submodule_state(params, "head")
    logits, head_vjp = vjp(lambda p: head(p, features), head_params)
    eps = eps_of(logits, {f"head.{n}": p for n, p in head_params.items()},
                 lambda d: ({f"head.{n}": g for n, g in head_vjp(d)[0].items()},))
    perturbed_head = submodule_state(perturbed_copy(params, eps), "head")
    g_head, g_features = grad(lambda p, f: F.cross_entropy(head(p, f), y), argnums=(0, 1))(perturbed_head, features)
    (g_body,) = body_vjp(g_features)
    sharp = {**{f"body.{n}": g for n, g in g_body.items()}, **{f"head.{n}": g for n, g in g_head.items()}}
    return logits, {n: sharp[n] for n in params}, {**buffers, **{f"body.{n}": b for n, b in body_buffers.items()}}


def _full_pass(model, params, buffers, x, y, hp, eps_of):
    """(logits at w, d, new buffers) with every parameter perturbed."""
    def forward(p: Tree) -> tuple[torch.Tensor, Tree]:
        new = {n: b.clone() for n, b in buffers.items()}
        return functional_call(model, (p, new), (x,)), new

    logits, forward_vjp, new_buffers = vjp(forward, params, has_aux=True)
    eps = eps_of(logits, params, forward_vjp)
    sharp, _, _ = grad_and_loss(model, perturbed_copy(params, eps), new_buffers, x, y, hp)
    return logits, sharp, new_buffers


def fedsol_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """FedSOL's step (Eqs. 6-8): g_p = dL_p/dw on the perturbed set (the head, ``fedsol-perturb =
    "head"``, or every parameter), eps = ``fedsol_eps``, d = grad CE(w + eps) for every parameter,
    applied at w; the loss returned is the CE at w, L_p is added to the carried ``prox_sum``.

    With the head perturbed, the body's forward pass is shared by both passes (the body does not
    depend on the head): its gradient comes back through the features, as in a module's ``backward()``.
    Gradients through ``torch.func.vjp`` / ``grad``, so vmap batches them; the global logits come
    from ``model`` in eval mode at (w_t, the global buffers)."""
    keys = hp.keys
    temperature = keys["fedsol-temperature"]
    global_logits = eval_logits(model, w_t, ctx["global_buffers"], x)

    def eps_of(logits: torch.Tensor, targets: Tree, vjp_fn) -> Tree:
        (g_p,) = vjp_fn(proximal_logit_grad(logits, global_logits, temperature))
        g_p = {n: g_p[n] for n in targets}
        return fedsol_eps(targets, w_t, g_p, keys["fedsol-rho"], keys["fedsol-adaptive"], keys["fedsol-radius"])

    if keys["fedsol-perturb"] == "head":
        logits, sharp, new_buffers = _head_pass(model, params, buffers, x, y, eps_of)
    else:
        logits, sharp, new_buffers = _full_pass(model, params, buffers, x, y, hp, eps_of)
    prox_sum = carry["prox_sum"] + proximal_kl(logits, global_logits, temperature)
    return sharp, new_buffers, {"prox_sum": prox_sum}, F.cross_entropy(logits, y).detach()


def fedsol_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """No state, nothing sent; the fit metric ``prox_loss``: the round's mean L_p (0 after no step)."""
    return {}, {}, {"prox_loss": carry["prox_sum"].item() / max(steps, 1)}


# Two passes a step: proximal, then perturbed. The global model's buffers are those received
# (``server["buffers"]``); the proximal-loss sum is the step's carry.
UPDATE = LocalUpdate("fedsol", fedsol_direction, fedsol_begin, fedsol_end, keys={
    "fedsol-rho": Key(1.0, positive, "> 0 (base perturbation strength rho)"),
    "fedsol-temperature": Key(3.0, positive, "> 0 (softmax temperature of the proximal KL)"),
    "fedsol-perturb": Key("head", choices=("head", "all")),
    "fedsol-adaptive": Key(True),
    # "layer": Lambda per tensor (the paper's text); "axis": F.normalize(|w - w_g|, dim=0)
    # (the authors' code; with fedsol-perturb = "all" it is the code's perturbation)
    "fedsol-radius": Key("layer", choices=RADII),
}, carry=fedsol_carry, step_cost=2.0, module=__name__)
