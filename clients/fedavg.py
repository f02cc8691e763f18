"""FedAvg: local SGD, weighted mean (McMahan et al., AISTATS 2017).

- Client: d = g at every step: plain local SGD (`clients.fedavg.plain_direction`; FedProx,
  FedDyn, SCAFFOLD and FedPVR add their term to it).
- Server: w_{t+1} = Σ_k p_k w_k, Flower's FedAvg (`DriftFedAvg`, registered directly in
  `fl_app/registry.py`).
- State: none. Keys: none of its own (the general keys only).

Summary: client - | server - | client state - | server state - | traffic -
"""

from __future__ import annotations

from tasks.functional.core import grad_and_loss
from tasks.functional.update import LocalUpdate


def plain_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = g: the cross-entropy gradient."""
    grads, loss, new_buffers = grad_and_loss(model, params, buffers, x, y, hp)
    return grads, new_buffers, carry, loss


UPDATE = LocalUpdate("fedavg", plain_direction, module=__name__)
