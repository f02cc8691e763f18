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

from clients.base import DriftClient
from tasks.keys import Key, non_negative, positive


def not_true(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The logits without each sample's true-class column: shape (B, C - 1)."""
    keep = torch.ones_like(logits, dtype=torch.bool)
    keep[torch.arange(len(y), device=y.device), y] = False
    return logits[keep].view(len(y), logits.shape[1] - 1)


def ntd_loss(local_logits: torch.Tensor, global_logits: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """tau^2 * KL(softmax(global_nt / tau) || softmax(local_nt / tau)), batch mean."""
    log_q_local = F.log_softmax(not_true(local_logits, y) / tau, dim=1)
    q_global = F.softmax(not_true(global_logits, y) / tau, dim=1)
    return F.kl_div(log_q_local, q_global, reduction="batchmean") * tau**2


class FedNTDClient(DriftClient):
    # A local step's cost relative to one SGD step, a forward pass of the global model beside the local one; read by the
    # run-time estimate of `run_simulation.py --check` (fl_app/tooling/estimate.py).
    STEP_COST = 1.3
    CONFIG_KEYS = {  # the paper's defaults beta = 1, tau = 1
        "ntd-beta": Key(1.0, non_negative, ">= 0"),
        "ntd-tau": Key(1.0, positive, "> 0"),
    }

    def begin_round(self, server_round: int):
        self.global_model = self.frozen_copy()
        return None

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(x)
        with torch.no_grad():
            global_logits = self.global_model(x)
        ce = F.cross_entropy(logits, y)
        return ce + self.cfg["ntd-beta"] * ntd_loss(logits, global_logits, y, self.cfg["ntd-tau"])
