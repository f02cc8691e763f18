"""FedGAM: gradient-norm-aware minimisation (GAM, Zhang et al., CVPR 2023) in the local update
(Xu, Ma, Dai, Wu, Zhou, Mathematics 2024, Algorithm 1).

- Client, `gam-variant = "paper"` (default, the paper's Eq. 19), two passes on the same batch:

  ```
  g = ∇f(w; b),     G = g + α ρ ∇f(w + ρ g/‖g‖; b)
  ```

  At the defaults α ρ = 0.004, so the step is close to plain SGD; this is what Eq. 19 says.
- Client, `gam-variant = "reference"`: the GAM optimiser step of Zhang et al. that the paper's
  public code calls (our reading of its non-adaptive form, four passes on the same batch;
  `gam-rho` plays GAM's grad_rho and α is not used). With r1 = `gam-rho`, r2 = `gam-norm-rho`,
  b1..b3 = `gam-beta1..3`, γ = `gam-gamma`:

  ```
  g0 = ∇f(w);              g1 = ∇f(w + r1 g0/‖g0‖)
  w2 = w + r2 (g1 − g0)/‖g1 − g0‖;                g2 = ∇f(w2)
  g3 = ∇f(w2 + r1 g2/‖g2‖)
  u  = b1 g1 + b3 g3,      m = g0 + |b2| g2
  G  = u − γ (m − (⟨m, u⟩/‖u‖²) u)     (u minus γ times the part of m orthogonal to u)
  ```

  (g1 − g0 is the gradient of the gradient norm, up to scale; u is the update direction) and
  the base optimiser (the run's SGD) steps with G at w.
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`). State: none. Every `gam-*` key is
  read by the client.
- Keys: `gam-rho` ρ (0.02, > 0), `gam-alpha` α (0.2, ≥ 0), `gam-variant` (`paper` |
  `reference`, default `paper`), `gam-norm-rho` (0.2), `gam-beta1` (1.0), `gam-beta2` (−1.0),
  `gam-beta3` (1.0), `gam-gamma` (0.03): the paper's and GAM's defaults.
- Readings: the paper's Algorithm 1 averages with a plain mean; the weighted mean is used here,
  as for every method that does not need another. BatchNorm statistics are updated by the first
  (unperturbed) pass only.

Summary: client GAM gradient | server - | client state - | server state - | traffic -
"""

from __future__ import annotations

from clients.base import DriftClient
from protocol.keys import Key, non_negative, positive
from tasks.functional.sharpness import FEDGAM


class FedGAMClient(DriftClient):
    """The GAM gradient of either variant as the step's direction: ``tasks.functional.sharpness.FEDGAM``."""

    # A local step's cost relative to one SGD step, two or more forward-backward passes a step; read by the
    # run-time estimate of `run_simulation.py --check` (runner/estimate.py).
    STEP_COST = 2.0
    LOCAL_UPDATE = FEDGAM
    # Shared with FedGAM-CV (docs/methods.md defaults: rho 0.02, alpha 0.2; the "reference" GAM
    # step: grad_norm_rho 0.2, betas 1, -1, 1, grad_gamma 0.03)
    CONFIG_KEYS = {
        "gam-rho": Key(0.02, positive, "> 0 (perturbation radius rho)"),
        "gam-alpha": Key(0.2, non_negative, ">= 0 (FedGAM trade-off alpha)"),
        "gam-variant": Key("paper", choices=("paper", "reference")),
        "gam-norm-rho": Key(0.2, positive, "> 0 (reference GAM: grad_norm_rho)"),
        "gam-beta1": Key(1.0),
        "gam-beta2": Key(-1.0),
        "gam-beta3": Key(1.0),
        "gam-gamma": Key(0.03, non_negative, ">= 0 (reference GAM: grad_gamma)"),
    }
