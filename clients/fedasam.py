"""FedASAM: adaptive SAM (Kwon et al., ICML 2021) as the local optimiser (Caldarola, Caputo,
Ciccone, ECCV 2022).

- Client, per batch: with T = |w| + η_A elementwise for weight tensors and T = 1 for biases,

  ```
  ε = ρ T² ⊙ g / ‖T ⊙ g‖,     d = ∇f(w + ε; b), applied at w
  ```

  otherwise as FedSAM.
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`). State: none.
- Keys: `asam-rho` ρ (0.5, > 0), `asam-eta` η_A (0.01, ≥ 0): the ASAM paper's (Kwon et al.)
  CIFAR values. They have their own keys because the run config is one flat namespace and
  ASAM's radius is about ten times SAM's. Every `asam-*` key is read by the client.
- Reading: biases are not rescaled (T = 1), as in the official ASAM code, which rescales only
  parameters named `weight`.

Summary: client adaptive SAM gradient | server - | client state - | server state - | traffic -
"""

from __future__ import annotations

from clients.fedsam import FedSAMClient
from protocol.keys import Key, non_negative, positive
from tasks.functional.sharpness import FEDASAM


class FedASAMClient(FedSAMClient):
    """FedSAM with ASAM's perturbation: ``tasks.functional.sharpness.FEDASAM``."""

    LOCAL_UPDATE = FEDASAM
    # replaces FedSAM's sam-rho: FEDASAM reads these two keys instead
    CONFIG_KEYS = {
        "asam-rho": Key(0.5, positive, "> 0 (ASAM radius)"),
        "asam-eta": Key(0.01, non_negative, ">= 0 (ASAM T_w = |w| + eta)"),
    }
