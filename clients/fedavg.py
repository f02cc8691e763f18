"""FedAvg: local SGD, weighted mean (McMahan et al., AISTATS 2017).

- Client: d = g at every step: plain local SGD, which the base client (`DriftClient`) is
  exactly.
- Server: w_{t+1} = Σ_k p_k w_k, Flower's FedAvg (`DriftFedAvg`, registered directly in
  `fl_app/registry.py`).
- State: none. Keys: none of its own (the general keys only).

Summary: client - | server - | client state - | server state - | traffic -
"""

from clients.base import DriftClient
from tasks.functional import FEDAVG


class FedAvgClient(DriftClient):
    """Local SGD with cross-entropy, no correction: ``tasks.functional.FEDAVG``."""

    LOCAL_UPDATE = FEDAVG
