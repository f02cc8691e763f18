"""FedNova: normalised averaging, so clients that take more local steps do not pull the average
towards their own objective (Wang et al., NeurIPS 2020).

- Client: plain local SGD; every client already reports its step count K (`num_steps`),
  which the server's normalised averaging needs.
- Server (`strategies/fednova.py`): with a_k client k's normaliser,

  ```
  d_k = (w_t − w_k) / a_k,   τ_eff = Σ_k p_k a_k,   w_{t+1} = w_t − τ_eff Σ_k p_k d_k
  ```

  With plain SGD a_k = K_k. With heavy-ball momentum β, the i-th gradient of the round enters
  w_k with weight Σ_{j<K−i} β^j, so a_k = Σ_{s=1..K_k} (1 − β^s) / (1 − β) (the paper's a-vector
  for momentum SGD). Server learning rate 1, no server momentum. Only trainable parameters are
  normalised; buffers (BN statistics) take the weighted mean.
- State: none. Keys: none of its own; it reads `momentum`. Server metric `fednova_tau_eff`.
- Refuses `optimizer = adam` / `adamw`: the normaliser assumes SGD.
- Reading: the paper's FedNova variant with a proximal term is not included.

Summary: client - | server normalised averaging | client state - | server state - | traffic K as
a fit metric
"""

from __future__ import annotations

from tasks.functional.core import plain_direction
from tasks.functional.update import LocalUpdate

# FedAvg's step; tau_k travels as the ``num_steps`` fit metric, which every round reports.
UPDATE = LocalUpdate("fednova", plain_direction, module=__name__)
