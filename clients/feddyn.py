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
- Readings: the mean is the paper's unweighted one. With a clip (`local-clip-norm`), α w is
  added after it, as the authors' code adds it through SGD's `weight_decay` after
  `clip_grad_norm_` (`clients/dynamic.py`); −(g_k + α w_t) is clipped with the gradient.
  h covers the trainable parameters; buffers
  (BN statistics) take the plain mean without correction, since no client gradient memory
  exists for them. N is read when the round's clients are sampled.

Summary: client − g_k + α (w − w_t) | server unweighted mean + h correction | client state g_k |
server state h | traffic -
"""

from __future__ import annotations

from clients.dynamic import GRAD, dynamic_context, dynamic_terms, dynamic_update, grad_norm
from tasks.functional.core import Hyper, Tree, plain_direction
from tasks.functional.update import LocalUpdate


def feddyn_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """g_k (``state["grad"]``, zeros at first) and the offset g_k + alpha w_t, fixed for the round."""
    return dynamic_context(w_t, state.get("grad"), hp.keys["feddyn-alpha"])


def feddyn_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """g_k <- g_k - alpha (w_k - w_t); metric ``feddyn_grad_norm`` = ||g_k||."""
    new = dynamic_update(ctx["grad"], params, w_t, hp.keys["feddyn-alpha"])
    return {"grad": new}, {}, {"feddyn_grad_norm": grad_norm(new)}


# d = g - (g_k + alpha w_t), clipped, then + alpha w (the authors' weight_decay)
UPDATE = LocalUpdate("feddyn", plain_direction, feddyn_begin, feddyn_end, terms=dynamic_terms("feddyn-alpha"),
                     reads=("feddyn-alpha",), state={"grad": GRAD}, module=__name__)
