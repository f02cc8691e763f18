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

import dataclasses
from typing import Any

import numpy as np

from clients.base import DriftClient, FunctionalRound
from protocol.keys import Key, positive
from tasks.functional import RoundResult
from tasks.functional.sharpness import FEDSOL, RADII, fedsol_buffers, fedsol_metrics


class FedSOLClient(DriftClient):
    """``tasks.functional.sharpness.FEDSOL``; the global model's buffers go in as what the server
    sent (the received model's), the fit metric ``prox_loss`` comes out of the round's buffers."""

    # A local step's cost relative to one SGD step, two passes: proximal, then perturbed; read by the
    # run-time estimate of `run_simulation.py --check` (runner/estimate.py).
    STEP_COST = 2.0
    LOCAL_UPDATE = FEDSOL
    CONFIG_KEYS = {
        "fedsol-rho": Key(1.0, positive, "> 0 (base perturbation strength rho)"),
        "fedsol-temperature": Key(3.0, positive, "> 0 (softmax temperature of the proximal KL)"),
        "fedsol-perturb": Key("head", choices=("head", "all")),
        "fedsol-adaptive": Key(True),
        # "layer": Lambda per tensor (the paper's text); "axis": F.normalize(|w - w_g|, dim=0)
        # (the authors' code; with fedsol-perturb = "all" it is the code's perturbation)
        "fedsol-radius": Key("layer", choices=RADII),
    }

    def prepare_functional(self, parameters: list[np.ndarray], config: dict) -> FunctionalRound:
        """``DriftClient``'s round, its buffers starting the proximal-loss sum at zero (``PROX_SUM``):
        on both paths, so a cohort whose first step is masked finds each client's entry to keep."""
        job = super().prepare_functional(parameters, config)
        return dataclasses.replace(job, buffers=fedsol_buffers(job.buffers, self.device))

    def functional_inputs(self) -> tuple[dict, dict]:
        return {}, {"buffers": {n: b.detach().clone() for n, b in self.model.named_buffers()}}

    def functional_outputs(self, result: RoundResult) -> dict[str, Any]:
        return fedsol_metrics(result.buffers, result.metrics["num_steps"])
