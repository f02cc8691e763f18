"""FedAvg (McMahan et al. 2017): plain local SGD; the base client is exactly that."""

from clients.base import DriftClient


class FedAvgClient(DriftClient):
    """Local SGD with cross-entropy, no correction."""
