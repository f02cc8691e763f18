"""FedRS: restricted softmax, which scales down the logits of the classes a client has no
examples of, so that its local training hardly moves those classes' weights (Li and Zhan,
KDD 2021).

- Client, with n_c the client's training examples of class c (counted once, before the
  round's loop, on the data it trains on), z = f(w; x) the logits and α ∈ [0, 1]:

  ```
  s_c  = 1 if n_c > 0 else α                  (fedrs-scaling = "hard": the paper's)
  s_c  = α + (1 − α) n_c / max_j n_j          (fedrs-scaling = "count": the first author's code)
  loss = CE(s ⊙ z, y)                          (batch mean), d = ∇loss
  ```

  For a class c the client lacks, the gradient into its head row is s_c p′_c h / B (p′ the
  softmax of the restricted logits): α damps it, α → 0 stops it. α = 1 is FedAvg exactly.
  Evaluation uses the raw logits; `train_loss` is the restricted CE (the objective).
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`). State: none: the counts are
  recomputed from the client's data every round and never leave it; nothing travels besides
  the model.
- Keys: `fedrs-alpha` α (0.5, in [0, 1]: the middle of the authors' search grid 0.1, 0.5, 0.9
  and the FedDecorr authors' FedRS run; fluke's config 0.1, Flower's FedLC baseline 0.9),
  `fedrs-scaling` (`hard` | `count`, default `hard`).
- Readings: the paper restricts only the missing classes (hard 0/1 membership), as fluke, the
  FedDecorr authors' FedRS baseline and Flower's FedLC baseline do: the default. The first
  author's code (lxcnju/FedRepo `algorithms/fedrs.py`, published after the paper) scales every
  class by α + (1 − α) n_c / max n, so rarer observed classes are damped too: `fedrs-scaling =
  "count"`, applied once per round (a version of that code recomputed the factor from its own
  output at every step, which drives it to 1, i.e. FedAvg, within a few steps; a later
  version applies it once). Both agree on missing classes (factor α), so it is not
  established which one the paper's tables used. FedRepo's head has no bias and scales
  h Wᵀ; the heads here have a bias and the whole logit w_cᵀh + b_c is scaled (fluke, the
  FedDecorr authors, Flower). "Missing" is n_c = 0 (the paper, FedRepo; fluke's configurable
  threshold is not a key here). FedRepo clips the gradient norm at 100 (rarely binding):
  `local-clip-norm = 100` does it run-wide (experiments/fedrs-cifar10-c2.toml sets it). It
  counts local steps (at least 5) rather than epochs: not reproduced.

Summary: client CE on restricted logits s ⊙ z | server - | client state - | server state - |
traffic -
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call

from protocol.keys import Key
from tasks.functional.core import Hyper, Tree, clone_tree, plain_direction, value_grads
from tasks.functional.labels import count_labels, counts_of
from tasks.functional.update import LocalUpdate

SCALINGS = ("hard", "count")


def restriction(counts: torch.Tensor, alpha: float, scaling: str) -> torch.Tensor:
    """s_c per class: ``hard``, 1 for an observed class and alpha for a missing one;
    ``count``, alpha + (1 - alpha) n_c / max_j n_j (alpha for a missing class). Plain tensor
    ops, no branch on the counts' values (the client has data, so max_j n_j >= 1)."""
    if scaling == "hard":
        return torch.where(counts > 0, torch.ones_like(counts), torch.full_like(counts, alpha))
    return alpha + (1 - alpha) * counts / counts.max().clamp_min(1)


def fedrs_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """The round's restriction factors s (``restriction`` of the client's label counts, one
    per class, in the weights' dtype and device), fixed for the round."""
    like = next(iter(w_t.values()))
    return {"scale": restriction(counts_of(state, like), hp.keys["fedrs-alpha"], hp.keys["fedrs-scaling"])}


def fedrs_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = grad CE(s * z, y), z the logits at w (``fedrs_begin``'s s, one factor per class);
    with hard scaling at alpha = 1 (every s_c = 1) FedAvg's step itself."""
    if hp.keys["fedrs-alpha"] == 1 and hp.keys["fedrs-scaling"] == "hard":
        return plain_direction(model, params, buffers, x, y, w_t, ctx, carry, hp)

    def objective(p):
        new_buffers = clone_tree(buffers)
        logits = functional_call(model, (p, new_buffers), (x,))
        return (F.cross_entropy(logits * ctx["scale"], y),), new_buffers

    (grads,), new_buffers, (loss,) = value_grads(objective, params, hp)
    return grads, new_buffers, carry, loss


UPDATE = LocalUpdate("fedrs", fedrs_direction, fedrs_begin, keys={  # alpha: the authors' grid 0.1, 0.5, 0.9
    "fedrs-alpha": Key(0.5, lambda v: 0 <= v <= 1, "in [0, 1] (restriction of missing classes' logits; 1 = FedAvg)"),
    "fedrs-scaling": Key("hard", choices=SCALINGS),
}, prepare=count_labels, module=__name__)
