"""FedDyn: dynamic regularisation, a linear term that makes the stationary points of the local
objectives agree with those of the global one (Acar et al., ICLR 2021, Algorithm 1).

- Client k, with its gradient memory g_k (zeros at first):

  ```
  local objective   f(w) − ⟨g_k, w⟩ + (α/2) ‖w − w_t‖²
  every step        d = g − g_k + α (w − w_t)
  after K steps     g_k ← g_k − α (w_k − w_t)
  ```

  (the update of g_k is the first-order condition of the local objective at w_k, the client's
  final weights).
- Server, with h (zeros at first), `strategies/feddyn.py`:

  ```
  h       ← h − α (1/N) Σ_{k∈S_t} (w_k − w_t)
  w_{t+1} = (1/|S_t|) Σ_{k∈S_t} w_k − h / α
  ```

- State: g_k per client (trainable parameters, in `model.parameters()` order, in
  `context.state`), h on the server. Nothing travels besides the model. Fit metric
  `feddyn_grad_norm` (‖g_k‖), server metric `feddyn_h_norm` (‖h‖).
- Keys: `feddyn-alpha` α (0.01, > 0).
- Readings: the mean is the paper's unweighted one. h covers the trainable parameters; buffers
  (BN statistics) take the plain mean without correction, since no client gradient memory
  exists for them. N is read when the round's clients are sampled.

Summary: client − g_k + α (w − w_t) | server unweighted mean + h correction | client state g_k |
server state h | traffic -
"""

from __future__ import annotations

import torch

from tasks.functional.core import Hyper, Tree, plain_direction
from tasks.functional.update import Arrays, LocalUpdate


def feddyn_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """g_k (``state["grad"]``, zeros at first) and the offset g_k + alpha w_t, fixed for the round."""
    alpha = hp.keys["feddyn-alpha"]
    g = state.get("grad") or {n: torch.zeros_like(w) for n, w in w_t.items()}
    return {"grad": g, "offset": {n: g[n] + alpha * w_t[n] for n in w_t}}


def feddyn_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = g - (g_k + alpha w_t) + alpha w (nothing added at alpha = 0, where g_k stays 0)."""
    grads, new_buffers, carry, loss = plain_direction(model, params, buffers, x, y, w_t, ctx, carry, hp)
    alpha = hp.keys["feddyn-alpha"]
    if alpha != 0:
        grads = {n: g.sub(ctx["offset"][n]).add(params[n], alpha=alpha) for n, g in grads.items()}
    return grads, new_buffers, carry, loss


def feddyn_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """g_k <- g_k - alpha (w_k - w_t); metric ``feddyn_grad_norm`` = ||g_k||."""
    alpha = hp.keys["feddyn-alpha"]
    new = {n: g - alpha * (params[n] - w_t[n]) for n, g in ctx["grad"].items()}
    return {"grad": new}, {}, {"feddyn_grad_norm": torch.sqrt(sum((g**2).sum() for g in new.values()))}


def all_param_names(model, cfg) -> list[str]:
    """Every parameter, in ``named_parameters`` order (FedDyn's g_k, FedSMOO's h_i)."""
    return [n for n, _ in model.named_parameters()]


GRAD = Arrays(all_param_names, record="feddyn-grad")  # g_k, kept per client (FedSMOO keeps it too)
UPDATE = LocalUpdate("feddyn", feddyn_direction, feddyn_begin, feddyn_end, reads=("feddyn-alpha",),
                     state={"grad": GRAD}, module=__name__)
