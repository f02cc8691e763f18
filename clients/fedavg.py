"""FedAvg: local SGD, weighted mean (McMahan et al., AISTATS 2017).

Client: plain local SGD; the base client is exactly that.

Server: Flower's FedAvg, the n_k-weighted mean of the client weights (``DriftFedAvg``, registered
directly in fl_app/registry.py).
"""

from clients.base import DriftClient


class FedAvgClient(DriftClient):
    """Local SGD with cross-entropy, no correction."""
