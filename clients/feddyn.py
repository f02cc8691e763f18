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

STATE = "feddyn-grad"


class FedDynClient(DriftClient):
    ALPHA_KEY = "feddyn-alpha"  # FedSMOO reuses this client's dual with its own key

    def begin_round(self, server_round: int):
        self.alpha = self.cfg[self.ALPHA_KEY]
        saved = self.load_state(STATE)
        if saved is None:
            self.prev_grad = [torch.zeros_like(p) for p in self.params()]
        else:
            self.prev_grad = [torch.as_tensor(a, device=self.device) for a in saved]
        # g_k + alpha w_t, fixed for the round (see adjust_gradients)
        self.offset = [g + self.alpha * p0 for g, p0 in zip(self.prev_grad, self.round_start)]
        return None

    def adjust_gradients(self) -> None:
        """grad - (g_k + alpha w_t) + alpha w: the offset is fixed for the round, so a step
        costs two in-place passes over the weights, not a temporary (w - w_t) as well."""
        self.subtract_dual()
        self.add_alpha_weights()

    @torch.no_grad()
    def subtract_dual(self) -> None:
        """grad -= g_k + alpha w_t, i.e. grad + alpha (h_i - w_t) with h_i = -g_k/alpha the sum
        of the client's past updates (FedSMOO's form). Nothing to do at alpha = 0 (g_k = 0)."""
        if self.alpha == 0:
            return
        for p, c in zip(self.params(), self.offset):
            if p.grad is not None:
                p.grad.sub_(c)

    @torch.no_grad()
    def add_alpha_weights(self) -> None:
        """grad += alpha w."""
        if self.alpha == 0:
            return
        for p in self.params():
            if p.grad is not None:
                p.grad.add_(p.detach(), alpha=self.alpha)

    @torch.no_grad()
    def end_round(self, steps: int):
        new = [g - self.alpha * (p.detach() - p0)
               for g, p, p0 in zip(self.prev_grad, self.params(), self.round_start)]
        self.save_state(STATE, [g.cpu().numpy() for g in new])
        return {"feddyn_grad_norm": float(torch.sqrt(sum((g**2).sum() for g in new)))}
