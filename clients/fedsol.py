"""FedSOL: the local gradient is taken at weights perturbed along the gradient of a proximal loss,
which makes local learning orthogonal to what would change the proximal objective (Lee, Jeong,
Kim, Oh, Yun, CVPR 2024).

- Client, per batch, with p = softmax(logits / T) and the global logits from a frozen eval-mode
  copy of w_g = w_t:
  1. L_p = KL(p_global ‖ p_local), averaged over the batch (batchmean); g_p = ∇L_p with respect
     to the perturbed parameters (the classifier head, `fedsol-perturb = "head"`, or all
     parameters, `"all"`);
  2. the radius Λ: with Δ = |w − w_g| (elementwise) for each perturbed tensor,
     - `fedsol-radius = "layer"` (default, the paper's Eq. 7): Λ = Δ / ‖Δ‖₂, the norm over the
       whole tensor;
     - `fedsol-radius = "axis"` (the authors' code): Λ = Δ normalised along the tensor's first
       axis, Λ[i, j, ...] = Δ[i, j, ...] / ‖Δ[:, j, ...]‖₂ (PyTorch's `F.normalize(Δ, dim=0)`;
       for a bias vector the two agree);
     - `fedsol-adaptive = false`: Λ = 1;

     Λ = 0 while w = w_g, so the round's first step is plain SGD;
  3. ε = ρ Λ ⊙ g_p / ‖g_p‖, the norm over the perturbed set (Eq. 8);
  4. d = ∇CE(w + ε; b) for every parameter, applied at w (Eq. 6; the weights go back to w by
     copy).
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`). State: none (the global copy is
  rebuilt each round).
- Fit metric `prox_loss` (mean L_p over the round); `train_loss` is the CE at the unperturbed
  weights.
- Keys: `fedsol-rho` ρ (1.0, > 0; the paper's best range is 0.5 to 2), `fedsol-temperature` T
  (3.0, > 0), `fedsol-perturb` (`head` | `all`, default `head`), `fedsol-radius` (`layer` |
  `axis`, default `layer`), `fedsol-adaptive` (true). The paper's optimiser is SGD with
  `momentum = 0.9`, `weight-decay = 1e-5`, `lr-decay = 0.99`.
- Readings: the paper's text perturbs the classifier head with a per-tensor radius (the
  defaults); the authors' code, which produced the paper's tables, perturbs every layer with the
  per-axis radius, ε = F.normalize(|w − w_g|, dim=0) ⊙ g_p ρ / (‖g_p‖ + 1e-12) with ‖g_p‖ over
  the whole model. Both are available: `fedsol-perturb = "all"` with `fedsol-radius = "axis"` is
  the code's perturbation. g_p is back-propagated from its closed form ∂L_p/∂logits =
  (p_local − p_global) / (T · batch size), which is exactly zero when the two models agree
  (autograd through the KL leaves about 1e-9 of rounding there, which the normalisation in step 3
  would blow up to a ρ-sized random perturbation). With head perturbation the body's forward
  pass is shared between the two passes (the body does not depend on the head, so the gradient
  is the same at lower cost).

Summary: client CE gradient at a proximal perturbation | server - | client state - | server
state - | traffic -
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from clients.base import DriftClient
from clients.perturbation import NORM_EPS, global_norm, perturbed
from tasks.keys import Key, positive

RADII = ("layer", "axis")


def fedsol_eps(
    weights: list[torch.Tensor],
    global_weights: list[torch.Tensor],
    prox_grads: list[torch.Tensor],
    rho: float,
    adaptive: bool = True,
    radius: str = "layer",
) -> list[torch.Tensor]:
    """eps = rho * Lambda (.) g_p / ||g_p||, ||g_p|| over all of ``prox_grads``.

    Lambda (``adaptive``; else 1) from d = |w - w_g|: ``radius = "layer"`` d / ||d|| per tensor
    (Eq. 7 of the paper's text); ``"axis"`` F.normalize(d, dim=0), i.e. d / max(||d||, 1e-12)
    with the norm over dim 0 (every column of a Linear weight, every (in, kh, kw) fibre of a
    conv weight; a bias as a whole), as the authors' code computes it.
    """
    if radius not in RADII:
        raise ValueError(f"fedsol radius {radius!r} is not one of {RADII}")
    scale = rho / (global_norm(prox_grads) + NORM_EPS)
    out = []
    for w, wg, g in zip(weights, global_weights, prox_grads):
        e = g.detach() * scale
        if adaptive:
            diff = (w.detach() - wg).abs()
            if radius == "axis":
                e = e * F.normalize(diff, p=2.0, dim=0, eps=NORM_EPS)
            else:
                e = e * (diff / (torch.linalg.vector_norm(diff) + NORM_EPS))
        out.append(e)
    return out


def proximal_kl(local_logits: torch.Tensor, global_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(p_global || p_local) with softened probabilities, averaged over the batch."""
    return F.kl_div(
        F.log_softmax(local_logits / temperature, dim=1),
        F.softmax(global_logits / temperature, dim=1),
        reduction="batchmean",
    )


class FedSOLClient(DriftClient):
    # A local step's cost relative to one SGD step, two passes: proximal, then perturbed; read by the
    # run-time estimate of `run_simulation.py --check` (fl_app/tooling/estimate.py).
    STEP_COST = 2.0
    CONFIG_KEYS = {
        "fedsol-rho": Key(1.0, positive, "> 0 (base perturbation strength rho)"),
        "fedsol-temperature": Key(3.0, positive, "> 0 (softmax temperature of the proximal KL)"),
        "fedsol-perturb": Key("head", choices=("head", "all")),
        "fedsol-adaptive": Key(True),
        # "layer": Lambda per tensor (the paper's text); "axis": F.normalize(|w - w_g|, dim=0)
        # (the authors' code; with fedsol-perturb = "all" it is the code's perturbation)
        "fedsol-radius": Key("layer", choices=RADII),
    }

    def begin_round(self, server_round: int) -> dict[str, Any] | None:
        self.global_model = self.frozen_copy()
        self.head_only = self.cfg["fedsol-perturb"] == "head"
        named = [n for n, _ in self.model.named_parameters()]
        head = {f"head.{n}" for n, _ in self.model.head.named_parameters()}
        self.perturb_index = [i for i, n in enumerate(named) if not self.head_only or n in head]
        self.prox_sum = torch.zeros((), device=self.device)
        return None

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = self.params()
        targets = [params[i] for i in self.perturb_index]
        if self.head_only:
            features = self.model.body(x)
            logits = self.model.head(features)
        else:
            logits = self.model(x)
        ce = F.cross_entropy(logits, y)
        temperature = self.cfg["fedsol-temperature"]
        with torch.no_grad():
            global_logits = self.global_model(x)
            prox = proximal_kl(logits, global_logits, temperature)
            # d L_p / d logits in closed form, (p_local - p_global) / (T B): exactly zero when
            # the two models' logits agree, so no rounding noise gets normalised into a
            # rho-sized perturbation (which autograd through kl_div would give at w == w_g)
            d_logits = (F.softmax(logits / temperature, dim=1) - F.softmax(global_logits / temperature, dim=1))
            d_logits /= temperature * len(x)
        grads = torch.autograd.grad(logits, targets, grad_outputs=d_logits, retain_graph=self.head_only,
                                    allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(targets, grads)]
        eps_targets = fedsol_eps(
            targets, [self.round_start[i] for i in self.perturb_index], grads,
            self.cfg["fedsol-rho"], self.cfg["fedsol-adaptive"], self.cfg["fedsol-radius"],
        )
        eps: list = [None] * len(params)
        for i, e in zip(self.perturb_index, eps_targets):
            eps[i] = e
        with perturbed(params, eps, self.model):
            if self.head_only:
                loss = F.cross_entropy(self.model.head(features), y)
            else:
                loss = F.cross_entropy(self.model(x), y)
            loss.backward()
        self.prox_sum += prox.detach()
        return ce.detach()

    def end_round(self, steps: int) -> dict[str, Any] | None:
        metrics = dict(super().end_round(steps) or {})
        metrics["prox_loss"] = self.prox_sum.item() / max(steps, 1)
        return metrics
