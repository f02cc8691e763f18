"""FedSpeed server (Sun et al., ICLR 2023; the authors' FL-Simulator): FedDyn's server.

Over the clients S_t that replied (N = all clients, H starts at zero):
    H <- H + (1/N) sum_{S_t} (w_i - w_t);   w_{t+1} = mean_{S_t}(w_i) + H
(``strategies.parts.DriftMemory``, FedDyn's server part, written without dividing by the prox coefficient c, so c = 0
is allowed; unweighted means, buffers the plain mean). Only the weights travel. Checkpoints
hold H (FedDyn's records); server metric ``fedspeed_H_norm`` (||H||, the mean drift over
all clients).
"""

from __future__ import annotations

from flwr.common import ndarrays_to_parameters

from protocol.keys import Key, non_negative
from strategies.arrays import total_clients
from strategies.base import REPLIES_ONLY, DriftFedAvg, trainable_mask
from strategies.parts import DriftMemory


class FedSpeedStrategy(DriftFedAvg):
    """FedDyn's server part (``DriftMemory``) with FedSpeed's key for its coefficient."""

    CONFIG_KEYS = {"fedspeed-prox": Key(0.1, non_negative, ">= 0 (prox coefficient c = 1/lambda; the code's lamb)")}
    UNIFORM_MEAN = True  # FedDyn's plain mean
    SCREENING = REPLIES_ONLY
    REPLY_SUMS = None  # a plain mean over clients (UNIFORM_MEAN)
    SCREENING_WHY = ("w = mean(w_k) + H with H accumulating the sum of the client drifts: a coordinate-wise median "
                     "of the weights would not match the H it updates")

    def __init__(self, *, alpha: float, trainable: list[bool], **kwargs):
        super().__init__(**kwargs)
        self.alpha = alpha
        self.memory = DriftMemory(trainable)
        self.num_clients: int | None = None

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return cls(alpha=cfg["fedspeed-prox"], trainable=trainable_mask(cfg), **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(prox={self.alpha})"

    def get_state(self) -> dict:
        return self.memory.get_state(self.alpha)

    def set_state(self, state: dict) -> None:
        self.memory.set_state(state, self.alpha)

    def configure_fit(self, server_round, parameters, client_manager):
        instructions = super().configure_fit(server_round, parameters, client_manager)
        self.num_clients = total_clients(client_manager)
        return instructions

    def aggregate_fit(self, server_round, results, failures):
        clients = self.client_arrays(results, failures)
        if clients is None:
            return None, {}
        new = self.memory.aggregate(clients, self.global_weights, self.num_clients)
        return ndarrays_to_parameters(new), {"fedspeed_H_norm": self.memory.norm()}
