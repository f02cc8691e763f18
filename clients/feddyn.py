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

from clients.base import DriftClient
from tasks.functional import FEDDYN, RoundResult

STATE = "feddyn-grad"


class FedDynClient(DriftClient):
    """FedDyn runs ``tasks.functional.FEDDYN`` (``LOCAL_UPDATE``); this class keeps g_k in
    ``context.state`` between rounds (FedSMOO, a subclass, keeps its h_i there the same way)."""

    LOCAL_UPDATE = FEDDYN

    def _stored(self) -> dict:
        """{"grad": g_k by parameter name} from ``context.state``, or {} (g_k = 0) at first."""
        saved = self.load_state(STATE)
        if saved is None:
            return {}
        names = [n for n, _ in self.model.named_parameters()]
        return {"grad": {n: torch.as_tensor(a, device=self.device) for n, a in zip(names, saved)}}

    def functional_inputs(self) -> tuple[dict, dict]:
        return self._stored(), {}

    def functional_outputs(self, result: RoundResult) -> None:
        """Store the new g_k in ``context.state`` (parameter order)."""
        self.save_state(STATE, [g.cpu().numpy() for g in result.state["grad"].values()])
