"""FedLC: logit calibration, which subtracts from each logit a margin that grows as the client's
count of that class shrinks, so that local training stops overfitting to the client's rare
and missing classes (Zhang, Li, Li, Xu, Wu, Ding, Wu, ICML 2022).

- Client, with n_c the client's training examples of class c (counted once, before the
  round's loop, on the data it trains on), z = f(w; x) the logits and τ ≥ 0:

  ```
  δ_c  = τ n_c^(−1/4)          (+∞ for a class the client lacks: it leaves the client's softmax)
  loss = CE(z − δ, y)           (batch mean), d = ∇loss
  ```

  To reach the same loss a sample of a rare class y needs z_y − z_i ≥ δ_y − δ_i (a pairwise
  label margin, large for rare y), while the logits of the client's frequent classes are pushed
  down against plain CE. τ = 0 is FedAvg exactly. Evaluation uses the raw logits; `train_loss`
  is the calibrated CE (the objective).
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`). State: none: the counts are
  recomputed from the client's data every round and never leave it; nothing travels besides
  the model.
- Keys: `fedlc-tau` τ (0.1, ≥ 0): the paper gives no value; 0.1 is the FedDecorr authors'
  FedLC run and fluke's config (FL-bench's default 1.0, Flower's FedLC baseline 0.5).
- Readings: no official code exists; FL-bench, PFLlib, fluke, the FedDecorr authors' FedLC
  baseline and Flower's baseline implement it. The paper's loss as printed,
  `−log(exp(z′_y) / Σ_{i≠y} exp(z′_i))`, leaves the true class out of the denominator: it is
  unbounded below (it falls without limit as z_y grows) and FL-bench's author reports that
  training with it collapsed. Every implementation uses the standard softmax over all classes on
  the calibrated logits z′ = z − δ (the logit-adjustment form of the paper's "pairwise label
  margin"): so here. The counts are the client's own (the paper, FL-bench, fluke, the FedDecorr
  authors); PFLlib uses the global counts summed over all clients, one offset for every client.
  A missing class (n_c = 0) gets δ_c = +∞, the formula's limit, as in fluke and the FedDecorr
  authors' code (0^(−1/4) = ∞): its head row gets no gradient from this client; FL-bench floors
  the count at 1e-8 (an offset of 100τ, a difference of order e^(−100τ) in the softmax). At τ = 0
  the calibration is skipped, not multiplied by 0 (0 · ∞ would be NaN for a missing class).
  A consequence of that limit: a client holding a single class has only that class in its
  softmax, so at any τ > 0 its loss and its gradient are 0: its weights still move by the
  run's `weight-decay` (SGD's decay, applied as the implementations' optimisers apply it; at
  the default 0 they stay w_t) and a BatchNorm model's statistics by its batches.

Summary: client CE on calibrated logits z − τ n_c^(−1/4) | server - | client state - | server
state - | traffic -
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call

from protocol.keys import Key, non_negative
from tasks.functional.core import Hyper, Tree, clone_tree, plain_direction, value_grads
from tasks.functional.labels import count_labels, counts_of
from tasks.functional.update import LocalUpdate


def calibration(counts: torch.Tensor, tau: float) -> torch.Tensor:
    """delta_c = tau n_c^(-1/4) per class, +inf where n_c = 0 (0^(-1/4) is never computed: the
    count is clamped to 1 there first). Plain tensor ops, no branch on the counts' values."""
    present = counts > 0
    offset = tau * counts.clamp_min(1) ** -0.25
    return torch.where(present, offset, torch.full_like(offset, float("inf")))


def fedlc_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """The round's offsets delta (``calibration`` of the client's label counts, one per class, in
    the weights' dtype and device), fixed for the round."""
    like = next(iter(w_t.values()))
    return {"offset": calibration(counts_of(state, like), hp.keys["fedlc-tau"])}


def fedlc_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = grad CE(z - delta, y), z the logits at w (``fedlc_begin``'s delta); at tau = 0
    FedAvg's step itself."""
    if hp.keys["fedlc-tau"] == 0:
        return plain_direction(model, params, buffers, x, y, w_t, ctx, carry, hp)

    def objective(p):
        new_buffers = clone_tree(buffers)
        logits = functional_call(model, (p, new_buffers), (x,))
        return (F.cross_entropy(logits - ctx["offset"], y),), new_buffers

    (grads,), new_buffers, (loss,) = value_grads(objective, params, hp)
    return grads, new_buffers, carry, loss


UPDATE = LocalUpdate("fedlc", fedlc_direction, fedlc_begin, keys={  # tau: the FedDecorr authors' run and fluke
    "fedlc-tau": Key(0.1, non_negative, ">= 0 (calibration strength tau; 0 = FedAvg)"),
}, prepare=count_labels, module=__name__)
