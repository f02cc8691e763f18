"""FedDC: each client learns a local drift variable h_i that decouples its model from the global
one, penalised towards θ − h_i, and corrects its gradient with SCAFFOLD's control variates
(Gao, Fu, Li, Chen, Xu, Xu, "FedDC: Federated Learning with Non-IID Data via Local Drift
Decoupling and Correction", CVPR 2022).

- Client i, with θ = w_t the received model, its drift h_i and control variate c_i (zeros
  at first) and the server's c (received after the weights), every step:

  ```
  d = g + α (w − (θ − h_i)) + (c − c_i)          (clipped to norm feddc-clip-norm when > 0)
  ```

  the gradient of f_i(w) + (α/2) ‖w + h_i − θ‖² + ⟨w, c − c_i⟩; the run's weight decay and
  momentum act on d as usual. After the K steps: h_i ← h_i + (w_K − θ), and c_i, Δc_i as
  SCAFFOLD's (the [control-variate rules](#control-variates), option II,
  c_i⁺ = c_i − c + (θ − w_K) / (η K_eff)). The penalty is the proximal term anchored at
  θ − h_i (`tasks.functional.terms.proximal`), the correction SCAFFOLD's
  (`clients.control_variates`); both are in the loss in the authors' code, so a clip
  (`feddc-clip-norm`, `local-clip-norm`) clips all of d.
- Server (`strategies/feddc.py`), over the clients S_t that replied, N the number of clients:

  ```
  H       ← H + (1/N) Σ_{i∈S_t} (w_i − θ)        (= the mean of all N clients' h_i)
  θ_{t+1} = (1/|S_t|) Σ_{i∈S_t} w_i + H
  c       ← c + (1/N) Σ_{i∈S_t} Δc_i
  ```

  FedDyn's server (its H form) and SCAFFOLD's c update.
- State: h_i and c_i per client (every trainable parameter, `context.state`); H and c on the
  server (checkpointed). Traffic: c after the weights down, Δc_i after them up. Fit metrics
  `feddc_h_norm` (‖h_i‖) and `ci_norm`; server metrics `feddc_H_norm` and `cv_norm`.
- Keys: `feddc-alpha` α (0.01, ≥ 0; the code's CIFAR-10 value, 0.1 for MNIST), `feddc-clip-norm`
  (0 = off; the code clips at 10). Optimisers whose step is not linear in the gradient (Adam)
  are refused, as for SCAFFOLD.
- Readings (authors' code gaoliang13/FedDC, which made the paper's tables): the server is the
  code's FedDyn-style one, the mean of h_i over all N clients added to the participants'
  mean, not the paper's mean of w_i + h_i over the participants (the two agree under full
  participation; the tables used 15%); the correction is the code's SCAFFOLD option II
  recursion, read the product's way (the round's lr and the momentum-corrected count of
  the client's own steps, as the product's SCAFFOLD, so FedDC against SCAFFOLD stays like for
  like; the code divides by the initial lr and a nominal step count E⌈mean n/B⌉). Not
  reproduced: the code's size weights ω_i = n_i N / Σ n (1 on its equal-size partitions,
  `inner-dirichlet` with `size-sigma = 0`) and its Bernoulli client sampling; its clip at
  norm 10 on every method is the run-wide `local-clip-norm = 10` (off by default;
  `feddc-clip-norm` clips FedDC alone, the same operation on the same direction).
  The reported model is θ_{t+1}, the one the next round starts from. h_i, the penalty and H
  cover the trainable parameters; BatchNorm buffers take the plain mean.

Summary: client + α (w − θ + h_i) + c − c_i | server FedDyn's H + SCAFFOLD's c | client state
h_i, c_i | server state H, c | traffic c down, Δc_i up
"""

from __future__ import annotations

import torch

from clients.control_variates import (
    CORRECTION,
    control_variate_arrays,
    control_variate_begin,
    control_variate_end,
    control_variate_names,
)
from protocol.keys import Key, non_negative
from protocol.layout import trainable_param_names
from tasks.functional.core import Hyper, Tree, plain_direction, tree_norm
from tasks.functional.terms import proximal
from tasks.functional.update import Arrays, LocalUpdate


def feddc_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """SCAFFOLD's c, c_i and correction c - c_i; h_i (zeros at first) and the penalty's anchor
    theta - h_i, fixed for the round."""
    ctx = control_variate_begin(w_t, state, server, hp)
    h = state.get("h") or {n: torch.zeros_like(v) for n, v in ctx["c"].items()}
    return {**ctx, "h": h, "anchor": {n: w_t[n] - h[n] if n in h else w_t[n] for n in w_t}}


def feddc_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """h_i <- h_i + (w_K - w_t); SCAFFOLD's c_i+ and reply delta c_i; metrics ``feddc_h_norm``
    and ``ci_norm``."""
    cv_state, sends, metrics = control_variate_end(w_t, params, buffers, carry, steps, ctx, state, hp)
    h = {n: v + (params[n] - w_t[n]) for n, v in ctx["h"].items()}
    return {**cv_state, "h": h}, sends, {**metrics, "feddc_h_norm": tree_norm(h.values())}


CV = control_variate_arrays(trainable_param_names)  # c_i (record cv-ci), c down, delta c_i up
H = Arrays(control_variate_names(trainable_param_names), record="feddc-h")
# d = g + alpha (w - (theta - h_i)) + (c - c_i), all in the loss (the code's), so clipped whole.
# feddc-alpha is FedDCStrategy's (the server's FedDyn part keeps h = -alpha H for checkpoints).
UPDATE = LocalUpdate(
    "feddc", plain_direction, feddc_begin, feddc_end, terms=(proximal("feddc-alpha", anchor="anchor"), CORRECTION),
    keys={"feddc-clip-norm": Key(0.0, non_negative, ">= 0 (local gradient clipping norm; 0 = off)")},
    clip_key="feddc-clip-norm", reads=("feddc-alpha",), state={**CV["state"], "h": H}, receives=CV["receives"],
    sends=CV["sends"], module=__name__)
