"""FedDyn (Acar et al. 2021, Algorithm 1): dynamic regularisation with a server state h.

Server, with S_t the clients of round t and N the total number of clients:
    h <- h - alpha * (1/N) * sum_{k in S_t} (w_k - w_t)
    w_{t+1} = (1/|S_t|) sum_{k in S_t} w_k - (1/alpha) * h
It is computed as H = -h/alpha (the mean accumulated client drift, ``strategies.parts.DriftMemory``,
which FedSMOO, FedSpeed and FedDC compose too):
    H <- H + (1/N) sum_{k in S_t} (w_k - w_t),   w_{t+1} = mean_{S_t}(w_k) + H,
the same update without dividing by alpha.
The mean is the paper's unweighted one (Algorithm 1), not the n_k-weighted mean. H covers
the trainable parameters only; buffers (BN running statistics) get the same plain mean
without correction, since no client gradient state exists for them.
N is the number of partitions the client manager learnt (else the number of connected
nodes), read when the round's clients are sampled.
"""

from __future__ import annotations

import numpy as np
from flwr.common import ndarrays_to_parameters

from protocol.keys import Key, positive
from strategies.arrays import total_clients
from strategies.base import REPLIES_ONLY, DriftFedAvg, trainable_mask
from strategies.parts import DriftMemory


class FedDynStrategy(DriftFedAvg):
    """Unweighted mean of the client weights plus H = -h/alpha; H accumulates client drift."""

    CONFIG_KEYS = {"feddyn-alpha": Key(0.01, positive, "> 0")}
    UNIFORM_MEAN = True  # Algorithm 1's plain mean
    SCREENING = REPLIES_ONLY
    REPLY_SUMS = None  # a plain mean over clients (UNIFORM_MEAN)
    SCREENING_WHY = ("w = mean(w_k) - h/alpha with h accumulating the sum of the client drifts: a "
                     "coordinate-wise median of the weights would not match the h it updates")

    def __init__(self, *, alpha: float, trainable: list[bool], **kwargs):
        super().__init__(**kwargs)
        self.alpha = alpha
        self.memory = DriftMemory(trainable)
        self.num_clients: int | None = None

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return cls(alpha=cfg["feddyn-alpha"], trainable=trainable_mask(cfg), **kwargs)

    @property
    def h(self) -> list[np.ndarray] | None:
        """The paper's server state h = -alpha H."""
        return None if self.memory.H is None else [-self.alpha * a for a in self.memory.H]

    def get_state(self) -> dict[str, list[np.ndarray]]:
        """Server state for checkpoints: H exactly, and the paper's h (absent before the first
        aggregation)."""
        return self.memory.get_state(self.alpha)

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
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
        return ndarrays_to_parameters(new), {"feddyn_h_norm": self.memory.norm(self.h)}
