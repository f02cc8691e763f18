"""FedSAM: sharpness-aware minimisation (Foret et al., ICLR 2021) as the local optimiser (Qu et
al., ICML 2022; Caldarola, Caputo, Ciccone, ECCV 2022).

- Client, per batch: g = ∇f(w; b); ε = ρ g / ‖g‖ (the norm over all trainable parameters);
  d = ∇f(w + ε; b), applied at w. w + ε is a copy of the weights (`tasks.functional.FEDSAM`):
  w itself never moves, and BN statistics count the unperturbed pass only (the
  [perturbation rules](#sharpness-and-perturbation)).
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`). State: none.
- Keys: `sam-rho` ρ (0.05, > 0; the papers use 0.05 to 0.5), read by the client.

Summary: client SAM gradient | server - | client state - | server state - | traffic -
"""

from __future__ import annotations

from clients.base import DriftClient
from protocol.keys import Key, positive
from tasks.functional import FEDSAM


class FedSAMClient(DriftClient):
    """FedSAM runs ``tasks.functional.FEDSAM`` (``LOCAL_UPDATE``): w + eps is a copy of the
    weights there, so w itself never moves and nothing has to be restored."""

    # A local step's cost relative to one SGD step, two passes: ascent, then descent; read by the
    # run-time estimate of `run_simulation.py --check` (runner/estimate.py).
    STEP_COST = 2.0
    LOCAL_UPDATE = FEDSAM
    # rho 0.05-0.5 in the literature; 0.05 is SAM's usual CIFAR value (FedSOL's table used 0.1)
    CONFIG_KEYS = {"sam-rho": Key(0.05, positive, "> 0 (SAM radius)")}
