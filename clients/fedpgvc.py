"""FedPGVC: a gradient penalty on the last layers, where heterogeneity makes gradient norms vary
most ("Harnessing Heterogeneity: Improving Convergence Through Partial Variance Control in
Federated Learning", TMLR 2026).

- Client, per batch, from one forward pass with per-sample losses ℓ_b: every parameter gets
  g = ∇ mean_b ℓ_b (plain SGD outside the mask, Eq. 13); the parameters of the last
  `pgvc-layers` Linear layers (the mask) also get (Eq. 14)

  ```
  r = (1/B) Σ_b ℓ_b ∇ℓ_b  =  ∇ (1/2) mean_b ℓ_b²
  ```

  and step with g + r. The masked layers thus minimise mean(ℓ) + (1/2) mean(ℓ²), which
  up-weights high-loss samples, as the paper's distributionally robust (WDRO) motivation
  intends; the other layers take plain SGD steps.
- Server: w_{t+1} = (1 − η_g) w_t + η_g Σ_k p_k w_k, η_g = `server-lr`; η_g = 1 is the plain
  weighted mean (`strategies/fedpgvc.py`).
- State: none.
- Keys: `pgvc-layers` (2, ≥ 1: the last two Linear layers), `server-lr` η_g (1.0, > 0). Every
  experiment of the paper uses Adam (`optimizer = "adam"`). A model with fewer Linear layers
  than `pgvc-layers` is refused before training.
- Readings: the step g + r is the update the paper's convergence proof analyses (Appendix
  Eq. 20). The main text's update, w ← w − η r ⊙ g (Eq. 15), is not used: since r is roughly
  ℓ g, that step is about η ℓ g² ≥ 0 for every weight, so every masked weight would move the
  same way whatever the sign of its gradient, which is not a descent direction. The mean is
  n_k-weighted although Eq. 16 writes a plain mean, and η_g multiplies the mean as written above
  (Eq. 16 omits it), so that η_g = 1 is the paper's plain averaging.

Summary: client gradient penalty on the last layers | server optional server lr | client state
- | server state - | traffic -
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clients.base import DriftClient
from tasks.models import last_layers_param_names


class FedPGVCClient(DriftClient):
    """SGD with g on the body; g + rho on the last ``pgvc-layers`` Linear layers."""

    def masked_params(self) -> list[torch.nn.Parameter]:
        names = set(last_layers_param_names(self.model, self.cfg["pgvc-layers"]))
        return [p for n, p in self.model.named_parameters() if n in names]

    def begin_round(self, server_round: int) -> None:
        self.mask = self.masked_params()

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses = F.cross_entropy(self.model(x), y, reduction="none")
        loss = losses.mean()
        # rho: gradient of 0.5 * mean(loss_b^2) w.r.t. the masked parameters only (the last
        # layers, so this backward stops early); the graph is kept for the full backward.
        rho = torch.autograd.grad(0.5 * losses.pow(2).mean(), self.mask, retain_graph=True)
        loss.backward()
        with torch.no_grad():
            for p, r in zip(self.mask, rho):
                p.grad.add_(r)
        return loss.detach()
