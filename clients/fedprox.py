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

from __future__ import annotations

from tasks.functional.core import plain_direction
from tasks.functional.terms import proximal
from tasks.functional.update import LocalUpdate

# d = g + mu (w - w_t); proximal-mu is declared on FedProxStrategy (Flower's FedProx sends it too).
UPDATE = LocalUpdate("fedprox", plain_direction, terms=(proximal("proximal-mu"),), reads=("proximal-mu",),
                     module=__name__)
