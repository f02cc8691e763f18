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

from typing import Any

import torch

from clients.base import DriftClient
from tasks.functional import FEDDYN, Hyper, RoundResult
from tasks.functional.methods import feddyn_begin, feddyn_end

STATE = "feddyn-grad"


class FedDynClient(DriftClient):
    """FedDyn runs ``tasks.functional.FEDDYN`` (``LOCAL_UPDATE``); the hooks below, whose
    begin and end are the same functions, serve FedSMOO, which changes the step (``LOCAL_UPDATE``
    is not inherited)."""

    LOCAL_UPDATE = FEDDYN
    ALPHA_KEY = "feddyn-alpha"  # FedSMOO reuses this client's dual with its own key

    def _named(self, tensors) -> dict[str, torch.Tensor]:
        return {n: t for (n, _), t in zip(self.model.named_parameters(), tensors)}

    def _hyper(self) -> Hyper:
        return Hyper(lr=self.lr, keys={"feddyn-alpha": self.cfg[self.ALPHA_KEY]})

    def _stored(self) -> dict:
        """{"grad": g_k by parameter name} from ``context.state``, or {} (g_k = 0) at first."""
        saved = self.load_state(STATE)
        if saved is None:
            return {}
        return {"grad": self._named(torch.as_tensor(a, device=self.device) for a in saved)}

    def begin_round(self, server_round: int):
        self.alpha = self.cfg[self.ALPHA_KEY]
        ctx = feddyn_begin(self._named(self.round_start), self._stored(), {}, self._hyper())
        self.prev_grad = list(ctx["grad"].values())
        # g_k + alpha w_t, fixed for the round (see adjust_gradients)
        self.offset = list(ctx["offset"].values())
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
        state, _, metrics = feddyn_end(self._named(self.round_start), self._named(p.detach() for p in self.params()),
                                       steps, {"grad": self._named(self.prev_grad)}, {}, self._hyper())
        return self._keep(state, metrics)

    def _keep(self, state: dict, metrics: dict) -> dict[str, Any]:
        """Store the new g_k in ``context.state`` (parameter order); the metrics as floats."""
        self.save_state(STATE, [g.cpu().numpy() for g in state["grad"].values()])
        return {k: float(v) for k, v in metrics.items()}

    # -------------------------------------------------- the functional path (FedDyn)
    def functional_inputs(self) -> tuple[dict, dict]:
        return self._stored(), {}

    def functional_outputs(self, result: RoundResult) -> None:
        self._keep(result.state, {})
