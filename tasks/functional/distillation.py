"""The local updates of FedNTD and MOON as ``LocalUpdate``s: cross-entropy plus a term against a
frozen model (the global model w_t; for MOON also the client's previous local model), whose
outputs come from ``torch.func.functional_call`` on the model skeleton, so vmap batches them.
The methods' readings of their papers are in clients/fedntd.py and clients/moon.py.

Every loss is written with the same tensor operations, in the same order, as the module-based
training the clients ran before their conversion, so on CPU they give its numbers bit for bit
(tests/test_functional_distillation.py keeps that training as its reference; scripts/same_metrics.py).

Frozen models run in eval mode (``eval_forward``), as eval-mode frozen copies of a module do: for a
model with BatchNorm the global model uses the buffers it was sent (``server["buffers"]``, the
global model's running statistics) and MOON's previous model its own final buffers of the
client's last round (``state["prev_buffers"]``). Both are required when the model has buffers:
``functional_call(..., strict=True)`` refuses a missing one instead of reading the skeleton's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp

from tasks.functional.core import Hyper, Tree
from tasks.functional.methods import LocalUpdate


# ------------------------------------------------------------------------- shared pieces
def value_grads(objective: Callable[[Tree], tuple[tuple[torch.Tensor, ...], Tree]], params: Tree, hp: Hyper,
                wrt: Sequence[Sequence[str]] | None = None) -> tuple[list[Tree], list[torch.Tensor], Tree]:
    """(the gradient of each scalar objective, the objectives' values, the aux output) from ONE
    forward pass: ``objective(p) -> ((v_0, v_1, ...), aux)``; ``wrt[i]`` names the parameters
    v_i is differentiated by (default: every parameter, for each value).

    ``core.grad_and_loss`` generalised to any objective and several values (FedPGVC's penalty on
    the masked layers beside the mean loss on all): inside a cohort's vmap (``hp.vmapped``)
    through ``torch.func.vjp``, one backward per value with that value's cotangent 1 and the
    others' 0; otherwise through ``torch.autograd.grad`` on fresh leaf copies of ``params``, the
    kernels ``backward()`` runs (bit-identical to a module's ``backward()`` on CPU). ``params`` is not
    written; unused parameters get zero gradients.
    """
    if hp.vmapped:
        values, pullback, aux = vjp(objective, params, has_aux=True)
        wrt = [list(params)] * len(values) if wrt is None else wrt
        grads = []
        for i, names in enumerate(wrt):
            cotangent = tuple(torch.ones_like(v) if j == i else torch.zeros_like(v) for j, v in enumerate(values))
            (g,) = pullback(cotangent)
            grads.append({n: g[n] for n in names})
        return grads, [v.detach() for v in values], aux
    leaves = {n: p.detach().requires_grad_() for n, p in params.items()}
    values, aux = objective(leaves)
    wrt = [list(params)] * len(values) if wrt is None else wrt
    grads = []
    for i, (value, names) in enumerate(zip(values, wrt)):
        g = torch.autograd.grad(value, [leaves[n] for n in names], retain_graph=i < len(values) - 1,
                                allow_unused=True, materialize_grads=True)
        grads.append(dict(zip(names, g)))
    return grads, [v.detach() for v in values], aux


def submodule_state(tree: Tree, prefix: str) -> Tree:
    """The entries of ``tree`` under submodule ``prefix`` (``"body"``), keys without it: the
    dict ``functional_call`` takes for that submodule. The tensors are the same objects."""
    head = prefix + "."
    return {n[len(head):]: t for n, t in tree.items() if n.startswith(head)}


def call_part(model: nn.Module, part: str, params: Tree, buffers: Tree, x: torch.Tensor,
              strict: bool = False) -> torch.Tensor:
    """``model.<part>`` (``body`` or ``head``) on ``x`` at the given weights and buffers (full-model
    names); BatchNorm in training mode writes its statistics into ``buffers``' tensors."""
    return functional_call(getattr(model, part), (submodule_state(params, part), submodule_state(buffers, part)),
                           (x,), strict=strict)


def eval_forward(model: nn.Module, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``fn()`` (a ``functional_call`` on ``model``) with the skeleton in eval mode and no
    gradient, the mode restored after: a frozen model's output, as an eval-mode frozen copy of
    the module gives it (BatchNorm on its running statistics, which it does not update)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return fn()
    finally:
        model.train(was_training)


def clone_tree(tree: Tree) -> Tree:
    return {n: t.clone() for n, t in tree.items()}


# ------------------------------------------------------------------------------- FedNTD
def not_true(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The logits without each sample's true-class column: shape (B, C - 1), the other columns
    in their order. A gather (column j of the result is class j, or j + 1 from y on), so the
    shape does not depend on the data and vmap batches it."""
    cols = torch.arange(logits.shape[1] - 1, device=logits.device)
    index = cols + (cols >= y.unsqueeze(1)).to(cols.dtype)
    return logits.gather(1, index)


def ntd_loss(local_logits: torch.Tensor, global_logits: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """tau^2 * KL(softmax(global_nt / tau) || softmax(local_nt / tau)), batch mean.

    The KL is written out as ``F.kl_div(log_q, q, reduction="batchmean")`` computes it
    (xlogy(q, q) - q log_q, summed, divided by the batch size; equal to it bit for bit, value and
    gradient, on CPU), because vmap has no batching rule for ``kl_div`` and would loop over the
    clients."""
    log_q_local = F.log_softmax(not_true(local_logits, y) / tau, dim=1)
    q_global = F.softmax(not_true(global_logits, y) / tau, dim=1)
    return (torch.xlogy(q_global, q_global) - q_global * log_q_local).sum() / log_q_local.size(0) * tau**2


def global_buffers_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """The global model's buffers as sent (``server["buffers"]``; {} for a model without any)."""
    return {"global_buffers": server.get("buffers", {})}


def fedntd_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = grad [CE(z_l, y) + beta KL_nt(z_g, z_l)], z_g the eval-mode logits of w_t (no gradient),
    beta = ``ntd-beta``, tau = ``ntd-tau``; the loss is the whole objective."""
    global_logits = eval_forward(model, lambda: functional_call(model, (w_t, ctx["global_buffers"]), (x,), strict=True))
    beta, tau = hp.keys["ntd-beta"], hp.keys["ntd-tau"]

    def objective(p):
        new_buffers = clone_tree(buffers)
        logits = functional_call(model, (p, new_buffers), (x,))
        ce = F.cross_entropy(logits, y)
        return (ce + beta * ntd_loss(logits, global_logits, y, tau),), new_buffers

    (grads,), (loss,), new_buffers = value_grads(objective, params, hp)
    return grads, new_buffers, loss


FEDNTD = LocalUpdate("fedntd", fedntd_direction, global_buffers_begin, keys=("ntd-beta", "ntd-tau"))


# --------------------------------------------------------------------------------- MOON
def moon_contrastive(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float) -> torch.Tensor:
    """Batch mean of -log softmax([sim(z, z_g), sim(z, z_p)] / T)[0]."""
    pos = F.cosine_similarity(z, z_glob, dim=1)
    neg = F.cosine_similarity(z, z_prev, dim=1)
    logits = torch.stack([pos, neg], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


def moon_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """The global model's buffers (``server["buffers"]``), the previous local model
    (``state["prev_params"]``, ``state["prev_buffers"]``) and ``has_prev`` (1.0, or 0.0 the first
    time a client is sampled: no previous model, then w_t stands in for it and the contrastive
    term is multiplied by 0, so every client of a cohort runs the same function)."""
    global_buffers = server.get("buffers", {})
    has_prev = "prev_params" in state
    some = next(iter(w_t.values()))
    return {"global_buffers": global_buffers,
            "prev_params": state["prev_params"] if has_prev else w_t,
            "prev_buffers": state.get("prev_buffers", {}) if has_prev else global_buffers,
            "has_prev": torch.tensor(float(has_prev), dtype=some.dtype, device=some.device)}


def moon_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = grad [CE(head(z), y) + mu has_prev l_con(z, z_g, z_p)], z = body(x) at w, z_g and z_p
    the eval-mode bodies of w_t and of the previous model (no gradient); mu = ``moon-mu``,
    T = ``moon-temperature``. The representation z is the body's output (``model.body``)."""
    z_glob = eval_forward(model, lambda: call_part(model, "body", w_t, ctx["global_buffers"], x, strict=True))
    z_prev = eval_forward(model, lambda: call_part(model, "body", ctx["prev_params"], ctx["prev_buffers"], x,
                                                   strict=True))
    weight = hp.keys["moon-mu"] * ctx["has_prev"]  # mu, or 0 without a previous model

    def objective(p):
        new_buffers = clone_tree(buffers)
        z = call_part(model, "body", p, new_buffers, x)
        ce = F.cross_entropy(call_part(model, "head", p, new_buffers, z), y)
        return (ce + weight * moon_contrastive(z, z_glob, z_prev, hp.keys["moon-temperature"]),), new_buffers

    (grads,), (loss,), new_buffers = value_grads(objective, params, hp)
    return grads, new_buffers, loss


def moon_end(w_t, params, steps, ctx, state, hp):
    """The next round's previous model: this round's final weights (``prev_params``). Its
    buffers are the round's final buffers, which the driver returns beside the weights; the
    caller keeps them as ``prev_buffers`` (``end`` does not see buffers)."""
    return {"prev_params": params}, {}, {}


MOON = LocalUpdate("moon", moon_direction, moon_begin, moon_end, keys=("moon-mu", "moon-temperature"))
