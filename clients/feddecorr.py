"""FedDecorr: a penalty on the correlations between the dimensions of the local representations,
which keeps local training on skewed data from collapsing them into a few dimensions (Shi,
Liang, Zhang, Tan, Bai, ICLR 2023).

- Client, with Z ∈ R^{N×d} the body's outputs on the batch (the representation the head reads,
  `model.body`), each column standardised over the batch, Ẑ_j = (Z_j − mean Z_j) /
  sqrt(ε + var Z_j) (unbiased variance, ε = 1e-8), and G = Ẑᵀ Ẑ:

  ```
  L_dec = (1/N) · mean_{i≠j} G_ij²         (0 for a batch of one sample)
  loss  = CE(head(Z), y) + β L_dec,  d = ∇loss
  ```

  The term reaches the body's parameters only; `train_loss` is the whole objective. β = 0
  is FedAvg exactly.
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`). State: none; nothing travels
  besides the model.
- Keys: `feddecorr-beta` β (0.1, ≥ 0): the authors' scripts use 0.1 for CIFAR-10 and
  TinyImageNet, 0.05 for CIFAR-100.
- Readings: the penalty is the authors' code's (bytedance/FedDecorr `loss.py`), which made the
  paper's tables and for which β was tuned: G = Ẑᵀ Ẑ not divided by N (its diagonal is about
  N − 1), the mean over the d(d − 1) off-diagonal entries, then divided by N. The paper's text
  writes it as (1/d²) ‖K‖²_F of the batch's correlation matrix K (≈ G / (N − 1)), over all
  entries: the same minimiser, with a gradient (N − 1)²/N · d/(d − 1) times smaller (about 62
  at N = 64), so the text's form at the code's β would be far weaker. ε sits inside the square
  root, as in the code: a dimension with zero variance (a dead ReLU unit) standardises to 0, not
  NaN. The paper adds the term to FedAvg, FedAvgM, FedProx and MOON; `feddecorr` is FedAvg plus
  the term. A model whose body has no parameters (`logreg`) gets no gradient from the term and
  trains as FedAvg. Precision: a dimension whose batch variance is small beside its mean loses
  most of its float32 digits when centred and is then divided by sqrt(ε + var), so the term's
  gradient amplifies rounding: on cnn-small with batches of 4 to 16, one ulp of the input moves
  a client's round by 1e-5 to 1e-1 relative, and a batched cohort's summation order moves it
  as much (measured on MNIST, 2 clients x 20 steps of 64: 0.1-1 relative). The term is the
  authors' (their loss.py), so it is kept; instead a cohort node trains FedDecorr's clients one
  at a time (``unbatched``) at the per-client path's torch threads (``client-threads``: another
  thread count alone moves a 503-step round by 0.22 relative) and replies in full, so that a
  cohort run is its per-client run bit for bit (docs/running.md); in float64 a batched cohort
  agrees to about 1e-10.

Summary: client + β decorrelation of the batch's representations | server - | client state - |
server state - | traffic -
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from protocol.keys import Key, non_negative
from tasks.functional.core import call_part, clone_tree, plain_direction, value_grads
from tasks.functional.update import LocalUpdate

DECORR_EPS = 1e-8  # the authors' eps inside sqrt(eps + var)


def off_diagonal(mat: torch.Tensor) -> torch.Tensor:
    """The off-diagonal entries of a square matrix, row by row, as one vector: views of it only
    (no mask built from values), so vmap batches it."""
    d = mat.shape[0]
    return mat.flatten()[:-1].view(d - 1, d + 1)[:, 1:].flatten()


def decorrelation_loss(z: torch.Tensor) -> torch.Tensor:
    """L_dec of the batch representations ``z`` (N x d): each column centred and divided by
    sqrt(DECORR_EPS + unbiased variance), G = z^T z, the mean of the squared off-diagonal
    entries of G divided by N; 0 for N = 1 (a branch on the static shape, so vmap-safe)."""
    n = z.shape[0]
    if n == 1:
        return z.new_zeros(())
    centred = z - z.mean(dim=0, keepdim=True)
    standardised = centred / torch.sqrt(DECORR_EPS + centred.var(dim=0, keepdim=True))
    gram = standardised.T @ standardised
    return off_diagonal(gram).pow(2).mean() / n


def feddecorr_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = grad [CE(head(z), y) + beta L_dec(z)], z = body(x) at w in training mode (beta =
    ``feddecorr-beta``); the loss is the whole objective. At beta = 0 FedAvg's step itself."""
    beta = hp.keys["feddecorr-beta"]
    if beta == 0:
        return plain_direction(model, params, buffers, x, y, w_t, ctx, carry, hp)

    def objective(p):
        new_buffers = clone_tree(buffers)
        z = call_part(model, "body", p, new_buffers, x)
        ce = F.cross_entropy(call_part(model, "head", p, new_buffers, z), y)
        return (ce + beta * decorrelation_loss(z),), new_buffers

    (grads,), new_buffers, (loss,) = value_grads(objective, params, hp)
    return grads, new_buffers, carry, loss


UPDATE = LocalUpdate("feddecorr", feddecorr_direction, keys={  # beta: the authors' CIFAR-10 scripts
    "feddecorr-beta": Key(0.1, non_negative, ">= 0 (weight beta of the decorrelation term; 0 = FedAvg)"),
}, step_cost=1.1, unbatched=True, module=__name__)  # bench/methods.py, cnn-small B = 32: 1.08 and 1.15 of FedAvg
