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

from protocol.keys import Key, positive
from tasks.functional.core import grad_and_loss, keep_layout, sam_eps
from tasks.functional.update import LocalUpdate


def sam_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """g = grad f(w); eps = rho g / (||g|| + NORM_EPS); d = grad f(w + eps), applied at w.
    The buffers are those of the first (unperturbed) pass: the second pass's are dropped, so
    BatchNorm statistics count each batch once; w + eps is a copy, w never moves."""
    grads, new_buffers, loss = grad_and_loss(model, params, buffers, x, y, hp)
    eps = dict(zip(grads, sam_eps(grads.values(), hp.keys["sam-rho"])))
    perturbed = {n: keep_layout(p + eps[n], p) for n, p in params.items()}
    sharp, _, _ = grad_and_loss(model, perturbed, new_buffers, x, y, hp)
    return sharp, new_buffers, carry, loss


UPDATE = LocalUpdate("fedsam", sam_direction, keys={"sam-rho": Key(0.05, positive, "> 0 (SAM radius)")},
                     step_cost=2.0, module=__name__)
