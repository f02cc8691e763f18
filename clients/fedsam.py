"""FedSAM: sharpness-aware minimisation (Foret et al., ICLR 2021) as the local optimiser (Qu et
al., ICML 2022; Caldarola, Caputo, Ciccone, ECCV 2022).

- Client, per batch: g = ∇f(w; b); ε = ρ g / ‖g‖ (the norm over all trainable parameters);
  d = ∇f(w + ε; b), applied at w. w + ε is a copy of the weights (`clients.fedsam.sam_direction`):
  w itself never moves, and BN statistics count the unperturbed pass only (the
  [perturbation rules](#sharpness-and-perturbation)).
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`). State: none.
- Keys: `sam-rho` ρ (0.05, > 0; the papers use 0.05 to 0.5), read by the client.

Summary: client SAM gradient | server - | client state - | server state - | traffic -
"""

from __future__ import annotations

from clients.sharpness import sam_gradient
from protocol.keys import Key, positive
from tasks.functional.update import LocalUpdate


def sam_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """SAM's gradient at radius ``sam-rho`` (``sam_gradient``)."""
    sharp, new_buffers, loss = sam_gradient(model, params, buffers, x, y, hp, hp.keys["sam-rho"])
    return sharp, new_buffers, carry, loss


UPDATE = LocalUpdate("fedsam", sam_direction, keys={"sam-rho": Key(0.05, positive, "> 0 (SAM radius)")},
                     step_cost=2.0, module=__name__)
