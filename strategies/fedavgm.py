"""FedAvgM (Hsu et al., 2019): server momentum on the mean update (Flower's FedAvgM).

v <- beta v + (w_t - mean_k w_k) (v = the first pseudo-gradient in round 1), then
w_{t+1} = w_t - eta v, with eta = ``server-lr`` and beta = ``server-momentum``. The steady-state
step is eta / (1 - beta) times the mean update, so a larger beta usually wants a smaller eta.
"""

from __future__ import annotations

from flwr.common import Parameters
from flwr.server.strategy import FedAvgM

from strategies.server_opt import SERVER_LR, ServerOptimiser
from tasks.keys import Key


class FedAvgMStrategy(ServerOptimiser, FedAvgM):
    """Flower's FedAvgM; momentum vector checkpointed."""

    CONFIG_KEYS = {
        "server-lr": SERVER_LR,
        "server-momentum": Key(0.9, lambda v: 0 <= v < 1, "in [0, 1) (FedAvgM server momentum beta)"),
    }
    STATE = ("momentum_vector",)

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return cls(server_learning_rate=cfg["server-lr"], server_momentum=cfg["server-momentum"], **kwargs)

    def sync_global_model(self, parameters: Parameters) -> None:
        self.initial_parameters = parameters  # Flower's FedAvgM steps from initial_parameters
