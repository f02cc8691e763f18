"""FedPGVC: a gradient penalty on the last layers, where heterogeneity makes gradient norms
vary most ("Harnessing Heterogeneity: Improving Convergence Through Partial Variance Control
in Federated Learning", TMLR 2026).

A mask selects the parameters of the last ``pgvc-layers`` Linear layers. On every batch,
from ONE forward pass with per-sample losses loss_b:
- every parameter gets g = grad mean_b(loss_b) (plain SGD outside the mask, Eq. 13);
- masked parameters additionally get rho = (1/B) sum_b loss_b * grad loss_b (Eq. 14), the
  gradient of 0.5 * mean_b(loss_b^2), so they step with g + rho (the update analysed in the
  paper's convergence proof, Appendix Eq. 20). The masked layers thus minimise
  mean(loss) + 0.5 * mean(loss^2), up-weighting high-loss samples as the WDRO motivation
  intends.

The main text's Eq. 15, y <- y - eta * rho * g (element-wise), is NOT used: since
rho is roughly loss * g, the step is about eta * loss * g^2 >= 0 for every weight, i.e. every
masked weight moves in the same direction regardless of the gradient's sign, which is not a
descent direction.
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
