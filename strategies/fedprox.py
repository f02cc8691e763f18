"""FedProx (Li et al. 2020): Flower's FedProx strategy, which sends mu to the clients."""

from flwr.server.strategy import FedProx

from protocol.keys import Key, non_negative
from strategies.base import MEAN_OF_WEIGHTS, FromConfig


class FedProxStrategy(FromConfig, FedProx):
    """Weighted mean like FedAvg; adds ``proximal_mu`` to every fit config."""

    CONFIG_KEYS = {"proximal-mu": Key(0.01, non_negative, ">= 0")}
    SCREENING = MEAN_OF_WEIGHTS  # FedAvg's weighted mean of weights
    REPLY_SUMS = ()  # Flower's n_k-weighted mean of the weights

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return cls(proximal_mu=cfg["proximal-mu"], **kwargs)
