"""FedAvgM (Hsu et al., 2019): server momentum on the mean update (Flower's FedAvgM).

- Client: FedAvg's (plain local SGD); the [server-optimiser rules](#server-optimisers) apply.
- Server: v ← β v + (w_t − Σ_k p_k w_k) (v = the first pseudo-gradient in round 1), then
  w_{t+1} = w_t − η v (no Nesterov), Flower's `FedAvgM`.
- State: v on the server (checkpointed). Clients: none.
- Keys: `server-lr` η (1.0, > 0; the key FedPGVC's η_g also uses, with the same meaning),
  `server-momentum` β (0.9, in [0, 1)). η = 1, β = 0 is FedAvg. The steady-state step is
  η/(1 − β) times the mean update, so a larger β usually wants a smaller η.

Summary: client - | server server momentum on the mean update | client state - | server state
momentum v | traffic -
"""

from __future__ import annotations

from flwr.common import Parameters
from flwr.server.strategy import FedAvgM

from protocol.keys import Key
from strategies.base import MEAN_OF_WEIGHTS
from strategies.server_opt import SERVER_LR, ServerOptimiser


class FedAvgMStrategy(ServerOptimiser, FedAvgM):
    """Flower's FedAvgM; momentum vector checkpointed."""

    CONFIG_KEYS = {
        "server-lr": SERVER_LR,
        "server-momentum": Key(0.9, lambda v: 0 <= v < 1, "in [0, 1) (FedAvgM server momentum beta)"),
    }
    STATE = ("momentum_vector",)
    SCREENING = MEAN_OF_WEIGHTS  # the step starts from Flower's weighted mean of the weights
    REPLY_SUMS = ()  # the step starts from Flower's n_k-weighted mean, nothing else per client

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return cls(server_learning_rate=cfg["server-lr"], server_momentum=cfg["server-momentum"], **kwargs)

    def sync_global_model(self, parameters: Parameters) -> None:
        self.initial_parameters = parameters  # Flower's FedAvgM steps from initial_parameters
