"""FedGELA: the classifier is a simplex equiangular tight frame fixed for the whole federation and
scaled, on each client, by that client's class distribution, so that locally missing classes keep
their share of the feature space globally and lend it to the locally present ones (Fan, Zhang,
Yao, Han, Zhang, Wang, "Federated Learning with Bilateral Curation for Partially Class-Disjoint
Data", NeurIPS 2023).

- The fixed classifier, from the run's `seed`, the model's feature width d (the head's input) and
  its C classes (d ≥ C): P (d × C) the orthonormal columns of the QR factorisation of a d × C
  matrix of uniform [0, 1) draws (float64, `torch.Generator` seeded by `seed`), and

  ```
  M = sqrt(C / (C − 1)) P (I − 11ᵀ / C)        (unit columns, pairwise cosine −1/(C − 1))
  ```

  The model's head is M (weight Mᵀ, bias 0) and never trains: it gets no gradient, and the
  reply's head is set back to M after the local steps (`fedgela_finish`), whatever the run's
  weight decay did to it. The global model therefore evaluates with the logits z = Mᵀ h.
- Client, with h = body(x) the representation (the head's input), n_c the client's training
  examples of class c and n their sum (counted before the round, as FedRS and FedLC count them):

  ```
  φ_c  = C n_c / n                   (fedgela-adaptation = "class-share"; mean 1, 0 for a missing class)
  φ_c  = 1                           (fedgela-adaptation = "none": the fixed ETF alone)
  loss = CE(φ ⊙ (Mᵀ h) / τ, y)       (batch mean), d = ∇loss: the body alone trains
  ```

  A missing class's logit is 0 (not −∞): it stays in the client's softmax. `train_loss` is that
  adapted loss; τ scales the training logits only (the global model's are Mᵀ h, as the code
  evaluates it).
- Server: the weighted mean (Flower's FedAvg, `strategies/fedgela.py`, which refuses a model
  whose body has no parameters, `logreg`, before training). Every reply's head is M, so the
  mean's head is M within float32 rounding; the bodies are averaged. No state on either side;
  nothing travels besides the model (the counts never leave the client; M is recomputed by every
  client from the run's seed). The initial model's head, before the first aggregation, is the
  model's random one.
- Keys: `fedgela-temperature` τ (0.2, > 0): the code's `--temperature` default (its README's
  CIFAR-10 command sets 1e-05); `fedgela-adaptation` (`class-share` | `none`, default
  `class-share`).
- Readings: the authors' code (MediaBrain-SJTU/FedGELA `FedGELA.py`) runs by default: `get_etf`
  (QR of uniform draws, the ETF formula above), `produce_Ew` (φ = C n_c / n, 0 for a missing
  class), the local loss NLL(log_softmax(h (φ ⊙ M) / τ)) and the global evaluation's CE of h M
  (no τ). The README's "temperature ... Ew in our paper" reads τ as the ETF's length E_W (the
  training logits' scale 1/τ). The paper's text beyond its abstract (a
  simplex ETF fixed globally, "locally adapted to the personal distributions" by curating the
  ETF's length with the local class distribution) was not available to this change, so no
  second reading of its equations is offered; `fedgela-adaptation = "none"` is the fixed ETF
  without the local adaptation (the ablation the method's name separates: Global ETF, Local
  Adaptation). The code's representation is a two-layer projection (Linear, ReLU, Linear) on the
  backbone, then a `proxies` module its release does not include; here h is the model's own body
  output (after its last ReLU for the CNNs), no projection is added. The code weights the
  server's mean by each client's number of batches, here by its examples (equal up to the last
  batch). The code's optimiser (SGD, momentum 0.9, weight decay 1e-4) and gradient clip at norm
  20 are the run's keys (`momentum`, `weight-decay`, `local-clip-norm`). The personalised model
  (φ ⊙ M on each client's test split) is not evaluated: the runs here report the global model.
- Paper and authors' code. Read: the paper's abstract (arXiv 2405.18972: the classifier
  "globally fixed as a simplex ETF while locally adapted to the personal distributions") and
  the code; the paper's equations and its E_W and τ settings were not available to this change,
  so the code's reading above is the only one. Further differences from the code, the same
  maths: its ETF is a tensor outside the model (never in the state dict, never averaged), here
  the model's head, frozen and reset after each round, so the logits agree; it draws M from
  NumPy's global generator after its seeding, here from a torch generator seeded by `seed`
  (another M of the same law); it samples `party_per_round` clients uniformly, a fixed-size
  sample as Flower's.

Summary: client CE on φ ⊙ (ETF h) / τ, head fixed | server - | client state - | server state - |
traffic -
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from protocol.keys import Key, positive
from tasks.functional.core import Hyper, Tree, call_part, clone_tree, value_grads
from tasks.functional.labels import count_labels, counts_of
from tasks.functional.update import LocalUpdate, Round

ADAPTATIONS = ("class-share", "none")


def simplex_etf(dim: int, classes: int, seed: int) -> torch.Tensor:
    """M (dim x classes, float64): sqrt(C / (C - 1)) P (I - 11^T / C), P the Q factor of a dim x C
    matrix of uniform [0, 1) draws from a generator seeded by ``seed`` (the authors' ``get_etf``).
    Its columns have norm 1 and pairwise inner products -1 / (C - 1). dim < C (no C orthonormal
    columns) and C < 2 are refused in one line."""
    if classes < 2 or dim < classes:
        raise ValueError(f"fedgela: a simplex ETF of {classes} classes needs at least 2 classes and a feature width "
                         f">= {classes}; the model's head has {dim} inputs")
    draws = torch.rand(dim, classes, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    p, _ = torch.linalg.qr(draws)
    centring = torch.eye(classes, dtype=torch.float64) - torch.full((classes, classes), 1.0 / classes,
                                                                     dtype=torch.float64)
    return (classes / (classes - 1)) ** 0.5 * p @ centring


def fixed_head(weight: torch.Tensor, seed: int) -> torch.Tensor:
    """The fixed head's weight M^T (classes x dim: ``weight``'s shape, dtype and device)."""
    classes, dim = weight.shape
    return simplex_etf(dim, classes, seed).T.to(dtype=weight.dtype, device=weight.device)


def adaptation(counts: torch.Tensor, mode: str) -> torch.Tensor:
    """phi per class: C n_c / n (``class-share``; 0 for a missing class) or 1 (``none``)."""
    if mode == "none":
        return torch.ones_like(counts)
    return len(counts) * counts / counts.sum().clamp_min(1)


def fedgela_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """The round's constants: the fixed head's weight (``fixed_head``, from the run's seed) and
    phi / tau (``adaptation`` of the client's label counts), in the weights' dtype and device."""
    weight = w_t["head.weight"]
    return {"head": fixed_head(weight, hp.keys["seed"]),
            "phi": adaptation(counts_of(state, weight), hp.keys["fedgela-adaptation"]) / hp.keys["fedgela-temperature"]}


def adapted_logits(features: torch.Tensor, head: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(h M) * scale: the fixed head's logits, each class's scaled by its phi / tau."""
    return (features @ head.T) * scale


def fedgela_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = grad CE(phi * (M^T h) / tau, y), h = body(x) at w; the head is not in the graph (its
    gradient is zero); the loss is the adapted CE."""
    def objective(p):
        new_buffers = clone_tree(buffers)
        features = call_part(model, "body", p, new_buffers, x)
        return (F.cross_entropy(adapted_logits(features, ctx["head"], ctx["phi"]), y),), new_buffers

    (grads,), new_buffers, (loss,) = value_grads(objective, params, hp)
    return grads, new_buffers, carry, loss


def fedgela_finish(job: Round, result):
    """The reply's head set to the fixed head (weight M^T, bias 0), whatever weight decay did to it."""
    weight = result.params["head.weight"]
    params = {**result.params, "head.weight": fixed_head(weight, job.hp.keys["seed"])}
    if "head.bias" in params:
        params["head.bias"] = torch.zeros_like(params["head.bias"])
    return replace(result, params=params)


UPDATE = LocalUpdate("fedgela", fedgela_direction, fedgela_begin, keys={  # tau: the code's --temperature default
    "fedgela-temperature": Key(0.2, positive, "> 0 (tau: the local logits are phi * (M^T h) / tau)"),
    "fedgela-adaptation": Key("class-share", choices=ADAPTATIONS),
}, reads=("seed",), prepare=count_labels, finish=fedgela_finish, module=__name__)
