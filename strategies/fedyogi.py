"""FedYogi (Reddi et al., ICLR 2021): Yogi on the mean update at the server (Flower's FedYogi)."""

from flwr.server.strategy import FedYogi

from strategies.server_opt import FedOptFromConfig


class FedYogiStrategy(FedOptFromConfig, FedYogi):
    """Flower's FedYogi; m_t and v_t checkpointed."""
