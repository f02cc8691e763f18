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

from clients.gam import GAM_KEYS, gam_gradient
from protocol.keys import Key, non_negative
from tasks.functional.update import LocalUpdate


def gam_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = G (``gam_gradient`` with alpha = ``gam-alpha``)."""
    grads, new_buffers, loss = gam_gradient(model, params, buffers, x, y, hp, hp.keys["gam-alpha"])
    return grads, new_buffers, carry, loss


# d = G with FedGAM's alpha; the GAM keys are shared with FedGAM-CV (clients/gam.py).
UPDATE = LocalUpdate("fedgam", gam_direction,
                     keys={"gam-alpha": Key(0.2, non_negative, ">= 0 (FedGAM trade-off alpha)"), **GAM_KEYS},
                     step_cost=2.0, module=__name__)
