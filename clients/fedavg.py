"""FedAvg: local SGD, weighted mean (McMahan et al., AISTATS 2017).

- Client: d = g at every step: plain local SGD (`tasks.functional.core.plain_direction`;
  FedProx, FedDyn, SCAFFOLD and FedPVR add their term to it).
- Server: w_{t+1} = Σ_k p_k w_k, Flower's FedAvg (`DriftFedAvg`, registered directly in
  `fl_app/registry.py`).
- State: none. Keys: none of its own (the general keys only).

Summary: client - | server - | client state - | server state - | traffic -
"""

from __future__ import annotations

from tasks.functional.core import plain_direction
from tasks.functional.update import LocalUpdate

UPDATE = LocalUpdate("fedavg", plain_direction, module=__name__)
