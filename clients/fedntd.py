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

from clients.base import DriftClient
from protocol.keys import Key, non_negative, positive
from tasks.functional.distillation import FEDNTD, not_true, ntd_loss

__all__ = ["FedNTDClient", "not_true", "ntd_loss"]


class FedNTDClient(DriftClient):
    """The round is ``tasks.functional.distillation.FEDNTD``; the global model's logits come from
    w_t and the buffers it was sent, in eval mode (a frozen copy of w_t)."""

    LOCAL_UPDATE = FEDNTD
    # A local step's cost relative to one SGD step, a forward pass of the global model beside the local one; read by the
    # run-time estimate of `run_simulation.py --check` (runner/estimate.py).
    STEP_COST = 1.3
    CONFIG_KEYS = {  # the paper's defaults beta = 1, tau = 1
        "ntd-beta": Key(1.0, non_negative, ">= 0"),
        "ntd-tau": Key(1.0, positive, "> 0"),
    }

    def functional_inputs(self) -> tuple[dict, dict]:
        """No client state; the server sent the global model's buffers beside its weights."""
        return {}, {"buffers": {n: b.detach().clone() for n, b in self.model.named_buffers()}}
