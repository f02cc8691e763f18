"""The local updates of FedAvg, FedProx, SCAFFOLD, FedSAM and FedDyn as ``LocalUpdate``s (the
contract is in ``tasks.functional``'s docstring; each method's reading of its paper is in its
client module's docstring, clients/<method>.py).

Every formula is written with the same tensor operations, in the same order, as the
module-based training the clients ran before their conversion, so they give the same numbers as
before (bit for bit on CPU; scripts/same_metrics.py; tests/test_functional.py keeps that training
as its reference). Directions cover every
parameter: ``grad_and_loss`` returns a gradient (zeros where unused) for every parameter, and
every model of ``tasks.models`` uses all of its parameters in the forward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tasks.functional.core import Hyper, Tree, grad_and_loss, keep_layout, sam_eps, tree_norm
from tasks.optim import effective_steps

Begin = Callable[[Tree, dict, dict, Hyper], dict]
Direction = Callable[[nn.Module, Tree, Tree, torch.Tensor, torch.Tensor, Tree, dict, Hyper],
                     tuple[Tree, Tree, torch.Tensor]]
End = Callable[[Tree, Tree, int, dict, dict, Hyper], tuple[dict, dict, dict]]


def no_context(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    return {}


def no_state(w_t: Tree, params: Tree, steps: int, ctx: dict, state: dict, hp: Hyper):
    return state, {}, {}


@dataclass(frozen=True)
class LocalUpdate:
    """One method's local update (see the package docstring for the three functions).
    ``keys``: the run-config keys the method reads (``Hyper.keys``). A step's cost (two passes
    for SAM) is the client class's ``STEP_COST``, read by the run-time estimate."""

    name: str
    direction: Direction
    begin: Begin = no_context
    end: End = no_state
    keys: tuple[str, ...] = ()


# ------------------------------------------------------------------------------- FedAvg
def plain_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = g: the cross-entropy gradient."""
    grads, loss, new_buffers = grad_and_loss(model, params, buffers, x, y, hp)
    return grads, new_buffers, loss


FEDAVG = LocalUpdate("fedavg", plain_direction)


# ------------------------------------------------------------------------------ FedProx
def proximal_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = g + mu (w - w_t) on every parameter (mu = ``proximal-mu``; mu = 0 is FedAvg)."""
    grads, new_buffers, loss = plain_direction(model, params, buffers, x, y, w_t, ctx, hp)
    mu = hp.keys["proximal-mu"]
    if mu != 0:
        grads = {n: g.add(params[n] - w_t[n], alpha=mu) for n, g in grads.items()}
    return grads, new_buffers, loss


FEDPROX = LocalUpdate("fedprox", proximal_direction, keys=("proximal-mu",))


# ----------------------------------------------------------------------------- SCAFFOLD
def control_variate_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """c (``server["c"]``) and c_i (``state["ci"]``), zeros when absent (the first round), on
    the parameters that carry control variates (all of them unless ``server["c"]`` names fewer),
    and the step's correction c - c_i, constant over the round."""
    c = server.get("c") or {n: torch.zeros_like(w, memory_format=torch.contiguous_format) for n, w in w_t.items()}
    ci = state.get("ci") or {n: torch.zeros_like(v) for n, v in c.items()}
    return {"c": c, "ci": ci, "corr": {n: c[n] - ci[n] for n in c}}


def control_variate_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = g - c_i + c on the parameters with control variates, g elsewhere."""
    grads, new_buffers, loss = plain_direction(model, params, buffers, x, y, w_t, ctx, hp)
    corr = ctx["corr"]
    return {n: g.add(corr[n]) if n in corr else g for n, g in grads.items()}, new_buffers, loss


def control_variate_update(w_t: Tree, params: Tree, c: Tree, ci: Tree, steps: int, lr: float,
                           momentum: float) -> Tree:
    """SCAFFOLD option II: c_i+ = c_i - c + (w_t - w) / (lr K_eff), K_eff the momentum-corrected
    count of the round's ``steps`` (``tasks.optim.effective_steps``); c_i unchanged after no step.
    The one place of this rule: SCAFFOLD, FedPVR and FedGAM-CV end their rounds with it."""
    if steps == 0:  # no local step: nothing was learned about this client's direction
        return {n: v.clone() for n, v in ci.items()}
    scale = 1.0 / (lr * effective_steps(steps, momentum))
    return {n: ci[n] - c[n] + (w_t[n] - params[n]) * scale for n in ci}


def control_variate_end(w_t, params, steps, ctx, state, hp):
    """state c_i+, reply delta c_i = c_i+ - c_i, metric ``ci_norm`` = ||c_i+||."""
    ci_new = control_variate_update(w_t, params, ctx["c"], ctx["ci"], steps, hp.lr, hp.momentum)
    delta = {n: ci_new[n] - ctx["ci"][n] for n in ci_new}
    return {"ci": ci_new}, {"delta_c": delta}, {"ci_norm": tree_norm(ci_new.values())}


SCAFFOLD = LocalUpdate("scaffold", control_variate_direction, control_variate_begin, control_variate_end)


# ------------------------------------------------------------------------------- FedSAM
def sam_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """g = grad f(w); eps = rho g / (||g|| + NORM_EPS); d = grad f(w + eps), applied at w.
    The buffers are those of the first (unperturbed) pass: the second pass's are dropped, so
    BatchNorm statistics count each batch once; w + eps is a copy, w never moves."""
    grads, loss, new_buffers = grad_and_loss(model, params, buffers, x, y, hp)
    eps = dict(zip(grads, sam_eps(grads.values(), hp.keys["sam-rho"])))
    perturbed = {n: keep_layout(p + eps[n], p) for n, p in params.items()}
    sharp, _, _ = grad_and_loss(model, perturbed, new_buffers, x, y, hp)
    return sharp, new_buffers, loss


FEDSAM = LocalUpdate("fedsam", sam_direction, keys=("sam-rho",))


# ------------------------------------------------------------------------------- FedDyn
def feddyn_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """g_k (``state["grad"]``, zeros at first) and the offset g_k + alpha w_t, fixed for the round."""
    alpha = hp.keys["feddyn-alpha"]
    g = state.get("grad") or {n: torch.zeros_like(w) for n, w in w_t.items()}
    return {"grad": g, "offset": {n: g[n] + alpha * w_t[n] for n in w_t}}


def feddyn_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = g - (g_k + alpha w_t) + alpha w (nothing added at alpha = 0, where g_k stays 0)."""
    grads, new_buffers, loss = plain_direction(model, params, buffers, x, y, w_t, ctx, hp)
    alpha = hp.keys["feddyn-alpha"]
    if alpha != 0:
        grads = {n: g.sub(ctx["offset"][n]).add(params[n], alpha=alpha) for n, g in grads.items()}
    return grads, new_buffers, loss


def feddyn_end(w_t, params, steps, ctx, state, hp):
    """g_k <- g_k - alpha (w_k - w_t); metric ``feddyn_grad_norm`` = ||g_k||."""
    alpha = hp.keys["feddyn-alpha"]
    new = {n: g - alpha * (params[n] - w_t[n]) for n, g in ctx["grad"].items()}
    return {"grad": new}, {}, {"feddyn_grad_norm": torch.sqrt(sum((g**2).sum() for g in new.values()))}


FEDDYN = LocalUpdate("feddyn", feddyn_direction, feddyn_begin, feddyn_end, keys=("feddyn-alpha",))
