"""FedAdam (Reddi et al., ICLR 2021): Adam on the mean update at the server (Flower's FedAdam)."""

from flwr.server.strategy import FedAdam

from strategies.server_opt import FedOptFromConfig


class FedAdamStrategy(FedOptFromConfig, FedAdam):
    """Flower's FedAdam; m_t and v_t checkpointed."""
