"""FedNTD: not-true distillation, which keeps the global model's knowledge of the classes a client
lacks (Lee et al., NeurIPS 2022).

- Client: with z_l the local logits, z_g the logits of a frozen eval-mode copy of w_t, and
  q = softmax(z_nt / τ) over the not-true classes (each sample's true-class logit removed),

  ```
  loss = CE(z_l, y) + β τ² KL(q_g ‖ q_l)      (KL averaged over the batch: batchmean)
  ```

- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`): the change is all on the client.
  State: none.
- Keys: `ntd-beta` β (1.0, ≥ 0), `ntd-tau` τ (1.0, > 0), the paper's defaults.

Summary: client + β τ² KL on not-true classes | server - | client state - | server state - |
traffic -
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call

from protocol.keys import Key, non_negative, positive
from tasks.functional.core import Hyper, Tree, clone_tree, eval_logits, value_grads
from tasks.functional.update import LocalUpdate


def not_true(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The logits without each sample's true-class column: shape (B, C - 1), the other columns
    in their order. A gather (column j of the result is class j, or j + 1 from y on), so the
    shape does not depend on the data and vmap batches it."""
    cols = torch.arange(logits.shape[1] - 1, device=logits.device)
    index = cols + (cols >= y.unsqueeze(1)).to(cols.dtype)
    return logits.gather(1, index)


def ntd_loss(local_logits: torch.Tensor, global_logits: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """tau^2 * KL(softmax(global_nt / tau) || softmax(local_nt / tau)), batch mean.

    The KL is written out as ``F.kl_div(log_q, q, reduction="batchmean")`` computes it
    (xlogy(q, q) - q log_q, summed, divided by the batch size; equal to it bit for bit, value and
    gradient, on CPU), because vmap has no batching rule for ``kl_div`` and would loop over the
    clients."""
    log_q_local = F.log_softmax(not_true(local_logits, y) / tau, dim=1)
    q_global = F.softmax(not_true(global_logits, y) / tau, dim=1)
    return (torch.xlogy(q_global, q_global) - q_global * log_q_local).sum() / log_q_local.size(0) * tau**2


def global_buffers_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """The global model's buffers as sent (``server["buffers"]``; {} for a model without any)."""
    return {"global_buffers": server.get("buffers", {})}


def fedntd_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = grad [CE(z_l, y) + beta KL_nt(z_g, z_l)], z_g the eval-mode logits of w_t (no gradient),
    beta = ``ntd-beta``, tau = ``ntd-tau``; the loss is the whole objective."""
    global_logits = eval_logits(model, w_t, ctx["global_buffers"], x)
    beta, tau = hp.keys["ntd-beta"], hp.keys["ntd-tau"]

    def objective(p):
        new_buffers = clone_tree(buffers)
        logits = functional_call(model, (p, new_buffers), (x,))
        ce = F.cross_entropy(logits, y)
        return (ce + beta * ntd_loss(logits, global_logits, y, tau),), new_buffers

    (grads,), new_buffers, (loss,) = value_grads(objective, params, hp)
    return grads, new_buffers, carry, loss


UPDATE = LocalUpdate("fedntd", fedntd_direction, global_buffers_begin, keys={  # the paper's beta = 1, tau = 1
    "ntd-beta": Key(1.0, non_negative, ">= 0"),
    "ntd-tau": Key(1.0, positive, "> 0"),
}, step_cost=1.3, module=__name__)
