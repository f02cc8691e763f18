"""FedAvg (McMahan et al. 2017): the n_k-weighted mean of client weights (Flower's FedAvg)."""

from strategies.base import DriftFedAvg


class FedAvgStrategy(DriftFedAvg):
    """Flower's FedAvg, unchanged."""
