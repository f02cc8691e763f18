"""FedDyn: dynamic regularisation, a linear term that makes the stationary points of the local
objectives agree with those of the global one (Acar et al., ICLR 2021, Algorithm 1).

Local objective  L_k(w) - <g_k, w> + (alpha/2) ||w - w_t||^2, so every step uses
grad CE(w) - g_k + alpha (w - w_t). After local training (w_k = final local weights)
    g_k <- g_k - alpha (w_k - w_t)
which is the first-order condition of the local objective at w_k. g_k starts at zero and
lives in ``context.state`` (over the trainable parameters, in ``model.parameters()`` order).
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
