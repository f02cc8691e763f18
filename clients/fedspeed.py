"""FedSpeed: each local step takes a SAM-style gradient at a perturbed point and adds FedDyn's
prox-correction, so clients can train longer between rounds without drifting (Sun, Shen, Huang,
Ding, Tao, "FedSpeed: Larger Local Interval, Less Communication Round, and Higher
Generalization Accuracy", ICLR 2023).

- Client, with w_t the received model, h_i its accumulated drift (zeros at first, never reset),
  c the prox coefficient (the paper's 1/λ, the code's `lamb`), every step on batch b:

  ```
  g  = ∇f(w; b);   e = ρ g / (‖g‖ + 1e-12);   g̃ = ∇f(w + e; b)      (same batch)
  g̃ ← (1 − m) g + m g̃                                              (m = fedspeed-merge; 1: g̃ alone)
  D  = g̃ + c (h_i − w_t)                     (clipped to norm fedspeed-clip-norm when > 0)
  gradient handed to the optimiser:  D + c w  =  g̃ + c (w − w_t + h_i)
  ```

  then the run's weight decay and momentum as usual. After the K steps:
  h_i ← h_i + (w_K − w_t). The loss reported is f at w.
- Server (`strategies/fedspeed.py`), over the clients S_t that replied, N the number of clients:
  H ← H + (1/N) Σ_{S_t} (w_i − w_t), w_{t+1} = (1/|S_t|) Σ_{S_t} w_i + H (FedDyn's server in its
  H form; unweighted means, buffers the plain mean). Server metric `fedspeed_H_norm`.
- State: h_i per client (kept as FedDyn's g_k = −c h_i, record `feddyn-grad`, as FedSMOO keeps
  it), H on the server (checkpointed). Traffic: the weights only. Fit metric
  `feddyn_grad_norm` (‖g_k‖ = c ‖h_i‖).
- Keys: `fedspeed-rho` ρ (0.1, ≥ 0), `fedspeed-prox` c (0.1, ≥ 0; the code's `lamb`, named so
  it is not read as the paper's λ = 1/c), `fedspeed-merge` m (1.0, in [0, 1]; 1 is the code),
  `fedspeed-clip-norm` (0 = off; the code clips at 10).
- Reused, not rewritten: the perturbed gradient is FedSMOO's (`clients.sharpness`) without s
  (s = μ_i = 0, so the perturbation is SAM's) plus the merge weight, the regulariser FedDyn's
  (`clients.dynamic`: −(g_k + c w_t) before the clip, c w after it, as the code's
  `weight_decay`); the server is FedDyn's. So FedSpeed as the
  code runs it is FedSMOO with `smoo-s = none` without s travelling; ρ = 0 gives the FedDyn
  client (`feddyn-alpha = c`), c = 0 the FedSAM client (`sam-rho = ρ`).
- Readings (authors' code woodenchild95/FL-Simulator, which made the README's table): no merge
  (m = 1: the code's ESAM step returns g̃ alone, the paper mixes g and g̃; `fedspeed-merge`
  runs the text); the server's H is the mean of h_i over all N clients, not the paper's mean
  of the uploaded w_K + h_i over the participants (the same under full participation; the
  paper-text server is not implemented); the clip at norm 10, applied by the code to every
  method, is off by default (`local-clip-norm = 10` clips every row, `fedspeed-clip-norm`
  FedSpeed alone); the SAM norm's ε
  is the product's 1e-12 (the code's 1e-7); BatchNorm statistics are those of the first pass
  (the code's second pass updates them again; its GroupNorm ResNet-18 has none); the code's
  Bernoulli client sampling is not reproduced.

Summary: client SAM gradient + c (w − w_t + h_i) | server FedDyn's H | client state h_i |
server state H | traffic -
"""

from __future__ import annotations

import torch

from clients.dynamic import GRAD, dynamic_context, dynamic_terms, dynamic_update, grad_norm
from clients.sharpness import dual_carry, dual_sam_gradient
from protocol.keys import Key, non_negative
from tasks.functional.core import Hyper, Tree
from tasks.functional.update import LocalUpdate


def speed_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """FedDyn's g_k = -c h_i and offset g_k + c w_t (c = ``fedspeed-prox``), and the dual held at
    zero (FedSMOO's ``none``)."""
    ctx = dynamic_context(w_t, state.get("grad"), hp.keys["fedspeed-prox"])
    return {**ctx, "mu": {n: torch.zeros_like(w, memory_format=torch.contiguous_format) for n, w in w_t.items()}}


def speed_carry(w_t: Tree, ctx: dict, hp: Hyper) -> Tree:
    """The dual and the last perturbation, both held at zero (kept for FedSMOO's shape of carry)."""
    return dual_carry(ctx["mu"])


def speed_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """gtil = the gradient at SAM's perturbed point, merged as (1 - m) g + m gtil
    (``clients.sharpness.dual_sam_gradient`` without s); FedDyn's terms follow."""
    keys = hp.keys
    d, new_buffers, mu, shat, loss = dual_sam_gradient(model, params, buffers, x, y, hp, keys["fedspeed-rho"],
                                                       carry["mu"], None, keys["fedspeed-merge"])
    return d, new_buffers, {"mu": mu, "shat": shat}, loss


def speed_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """h_i <- h_i + (w_K - w_t) (FedDyn's g_k <- g_k - c (w_K - w_t)); nothing sent; metric
    ``feddyn_grad_norm``."""
    grad = dynamic_update(ctx["grad"], params, w_t, hp.keys["fedspeed-prox"])
    return {"grad": grad}, {}, {"feddyn_grad_norm": grad_norm(grad)}


# fedspeed-prox, which the server's FedDyn part reads too, is FedSpeedStrategy's key.
UPDATE = LocalUpdate(
    "fedspeed", speed_direction, speed_begin, speed_end, terms=dynamic_terms("fedspeed-prox"),
    clip_key="fedspeed-clip-norm",
    keys={
        "fedspeed-rho": Key(0.1, non_negative, ">= 0 (SAM radius rho; 0 = FedDyn)"),
        "fedspeed-merge": Key(1.0, lambda v: 0 <= v <= 1, "in [0, 1] (weight of the perturbed gradient; 1 = the code)"),
        "fedspeed-clip-norm": Key(0.0, non_negative, ">= 0 (local gradient clipping norm; 0 = off)"),
    },
    reads=("fedspeed-prox",), state={"grad": GRAD}, carry=speed_carry, step_cost=2.0, module=__name__)
