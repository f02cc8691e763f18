"""FedSMOO: FedDyn's dynamic regulariser plus SAM whose perturbation is pulled towards one
global perturbation s through a per-client dual variable μ_i (Sun, Shen, Chen, Ding, Tao,
ICML 2023).

The paper: "Dynamic Regularized Sharpness Aware Minimization in Federated Learning: Approaching
Global Consistency and Smooth Landscape". α is the FedDyn coefficient (the paper's 1/β), ρ the
SAM radius, f the plain mini-batch cross-entropy; norms are over the whole trainable parameter
vector.

- Client state (in `context.state`, zeros at first, never reset): h_i, the running sum of the
  client's own updates (FedDyn's g_k = −α h_i), and μ_i. Two model-sized arrays per client.
- Server → client: the model, then s (one array per trainable parameter in state_dict order,
  zeros in round 1), as SCAFFOLD's c travels.
- Client, every step on batch b:

  ```
  g  = ∇f(w; b)
  v  = g − μ_i − s;          ŝ = ρ v / (‖v‖ + 1e-12)
  μ_i ← μ_i + (ŝ − s)
  g̃  = ∇f(w + ŝ; b)                       (same batch, weights restored by copy)
  d  = g̃ + α (h_i − w_t)                  (optionally clipped to norm smoo-clip-norm)
  gradient handed to the optimiser:  d + α w  =  g̃ + α (w − w_t + h_i)
  ```

  The run's weight decay is added as usual (α w is not added a second time as decay); momentum,
  if any, acts on this gradient.
- Client, after the K steps: h_i ← h_i + (w_K − w_t); s̃_i = μ_i − ŝ_last (μ_i after its last
  update). Client → server: w_K, then s̃_i (one array per trainable parameter).
- Server (`strategies/fedsmoo.py`), over the clients that replied, with H (zeros at first):

  ```
  H       ← H + (1/N) Σ_{i∈S_t} (w_i − w_t)
  w_{t+1} = (1/|S_t|) Σ_{i∈S_t} w_i + H
  s       = ρ Σ_i s̃_i / ‖Σ_i s̃_i‖          (s = 0 when the sum is 0)
  ```

  This is the FedDyn server (H = −h / α) written without dividing by α, so α = 0 is allowed.
- Keys: `smoo-rho` ρ (0.1, ≥ 0), `smoo-alpha` α (0.1, ≥ 0; the paper uses 0.01 for
  CIFAR-100), `smoo-s` (`paper` | `code` | `none`, default `paper`), `smoo-clip-norm` (0 = off).
- Options: `smoo-s = "paper"` is the algorithm above. `"code"` follows the authors' code
  (FL-Simulator): the client replies μ_i instead of s̃_i and the server sets
  s = ρ · mean_i μ_i / ‖mean_i μ_i‖. `"none"` holds s and μ_i at zero (the client replies zeros):
  plain SAM inside FedDyn. The authors' code also clips d at norm 10 (`smoo-clip-norm = 10`);
  the default leaves it off.
- Reused, not rewritten: SAM's ascent step is `tasks.functional.core.sam_eps`, the dual-pulled
  perturbation `clients.sharpness` (shared with FedSpeed), the dynamic regulariser FedDyn's
  (`clients.dynamic`: h_i is kept as FedDyn's g_k = −α h_i in `context.state`, α h_i is all
  the local step uses; its α w is added after the clip, as the authors' `weight_decay`), the
  transport of s is the control-variate one; the whole local update is `clients.fedsmoo.UPDATE`.
- Reductions: ρ = 0 gives exactly the FedDyn client and server (for α > 0); α = 0 with
  `smoo-s = "none"` gives exactly the FedSAM client's local update (the server still adds H, so
  the global model differs from FedSAM's from round 2 on; both reductions are tested in
  `tests/methods/test_fedsmoo.py`).
- Metrics: server `smoo_s_norm` (‖s‖) and `smoo_H_norm` (‖H‖ over the trainable entries); fit
  metrics `smoo_mu_norm` (‖μ_i‖) and `feddyn_grad_norm` (the norm of the FedDyn client's state,
  as for `feddyn`).
- Readings: the means are unweighted, as in FedDyn.

Summary: client SAM towards global s + FedDyn term | server FedDyn server + s | client state
h_i, μ_i | server state H, s | traffic s down, s̃_i up
"""

from __future__ import annotations

import torch

from clients.dynamic import GRAD, dynamic_context, dynamic_terms, dynamic_update, grad_norm
from clients.sharpness import dual_carry, dual_sam_gradient
from protocol.keys import Key, non_negative
from protocol.layout import cv_names_in_state_order, trainable_param_names
from protocol.traffic import SMOO
from tasks.functional.core import Hyper, Tree, tree_norm
from tasks.functional.update import Arrays, LocalUpdate


def smoo_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """FedDyn's g_k and offset g_k + alpha w_t (``state["grad"]`` = -alpha h_i), s
    (``server["s"]``, zeros when absent) and the round's starting dual mu_i (``state["mu"]``;
    zeros when none is kept, and always under ``smoo-s = "none"``)."""
    ctx = dynamic_context(w_t, state.get("grad"), hp.keys["smoo-alpha"])
    zeros = {n: torch.zeros_like(w, memory_format=torch.contiguous_format) for n, w in w_t.items()}
    mu = state.get("mu") if hp.keys["smoo-s"] != "none" else None
    return {**ctx, "s": server.get("s") or zeros, "mu": mu or zeros}


def smoo_carry(w_t: Tree, ctx: dict, hp: Hyper) -> Tree:
    """The dual mu_i (the kept one, ``ctx["mu"]``) and the last step's perturbation shat (zeros),
    both changing at every step."""
    return dual_carry(ctx["mu"])


def smoo_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """gtil, the gradient at w + shat with shat pulled towards s by the dual mu_i
    (``clients.sharpness.dual_sam_gradient``; ``smoo-s = "none"``: SAM's shat, mu_i stays 0).
    FedDyn's terms follow (``UPDATE.terms``): - (g_k + alpha w_t), the clips, + alpha w."""
    none = hp.keys["smoo-s"] == "none"
    d, new_buffers, mu, shat, loss = dual_sam_gradient(model, params, buffers, x, y, hp, hp.keys["smoo-rho"],
                                                       carry["mu"], None if none else ctx["s"])
    return d, new_buffers, {"mu": mu, "shat": shat}, loss


def smoo_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """FedDyn's g_k <- g_k - alpha (w_K - w_t), i.e. h_i <- h_i + (w_K - w_t), and mu_i kept
    (not under ``smoo-s = "none"``); sent: ``paper`` stil_i = mu_i - shat_last, ``code`` mu_i,
    ``none`` zeros; metrics ``feddyn_grad_norm`` and ``smoo_mu_norm``."""
    grad = dynamic_update(ctx["grad"], params, w_t, hp.keys["smoo-alpha"])
    mode, mu, shat = hp.keys["smoo-s"], carry["mu"], carry["shat"]
    if mode == "paper":
        sent = {n: m - shat[n] for n, m in mu.items()}
    elif mode == "code":
        sent = mu
    else:
        sent = {n: torch.zeros_like(m) for n, m in mu.items()}
    new_state = {"grad": grad, **({"mu": mu} if mode != "none" else {})}
    return new_state, {"stil": sent}, {"feddyn_grad_norm": grad_norm(grad), "smoo_mu_norm": tree_norm(mu.values())}


def smoo_names(model, cfg) -> list[str]:
    """The trainable parameters in state_dict order (the order s, mu_i and the reply travel in),
    which must also be the order of ``named_parameters`` (true for every module without shared
    or frozen parameters): refused otherwise, in one line."""
    names = cv_names_in_state_order(model, trainable_param_names(model, cfg))
    if names != [n for n, _ in model.named_parameters()]:
        raise ValueError("FedSMOO needs every model parameter trainable and in state_dict order")
    return names


S = Arrays(smoo_names)
# smoo-rho, smoo-alpha and smoo-s, read by the server too, are FedSMOOStrategy's keys.
UPDATE = LocalUpdate(
    "fedsmoo", smoo_direction, smoo_begin, smoo_end, terms=dynamic_terms("smoo-alpha"), clip_key="smoo-clip-norm",
    keys={"smoo-clip-norm": Key(0.0, non_negative, ">= 0 (local gradient clipping norm; 0 = off)")},
    reads=("smoo-rho", "smoo-alpha", "smoo-s"),
    state={"grad": GRAD, "mu": Arrays(smoo_names, record="smoo-mu")},  # h_i as FedDyn's g_k; the dual mu_i
    receives=dict.fromkeys(SMOO.down, S), sends=dict.fromkeys(SMOO.up, S), carry=smoo_carry, step_cost=2.0,
    module=__name__)
