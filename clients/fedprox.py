"""FedProx: a proximal term keeps the local model near w_t (Li et al., MLSys 2020).

- Client: minimises f(w) + (μ/2) ‖w − w_t‖², so d = g + μ (w − w_t) on every trainable
  parameter.
- Server: the weighted mean (Flower's `FedProx` strategy, `strategies/fedprox.py`).
- State: none. The client reads μ from the run config, as every method reads its keys;
  Flower's `FedProx` strategy also sends it in every fit instruction (`proximal_mu`), a copy the
  client does not use.
- Keys: `proximal-mu` μ (0.01, ≥ 0; 0 is FedAvg).

Summary: client + μ (w − w_t) | server - | client state - | server state - | traffic μ in the
fit config
"""

from clients.base import DriftClient
from tasks.functional import FEDPROX


class FedProxClient(DriftClient):
    """Adds mu * (w - w_t) to every gradient (``tasks.functional.methods.proximal_direction``);
    mu is the run config's ``proximal-mu``, read like every other method's key (Flower's FedProx
    strategy also sends it as ``proximal_mu`` in the fit config; the client does not need that
    copy)."""

    LOCAL_UPDATE = FEDPROX
