"""FedDyn (Acar et al. 2021, Algorithm 1): dynamic regularisation with a server state h.

Server, with S_t the clients of round t and N the total number of clients:
    h <- h - alpha * (1/N) * sum_{k in S_t} (w_k - w_t)
    w_{t+1} = (1/|S_t|) sum_{k in S_t} w_k - (1/alpha) * h
It is computed as H = -h/alpha (the mean accumulated client drift, ``dynamic_update``):
    H <- H + (1/N) sum_{k in S_t} (w_k - w_t),   w_{t+1} = mean_{S_t}(w_k) + H,
the same update without dividing by alpha, which FedSMOO shares (and there alpha may be 0).
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
from strategies.arrays import cast_like, total_clients
from strategies.base import REPLIES_ONLY, DriftFedAvg, trainable_mask


class FedDynStrategy(DriftFedAvg):
    """Unweighted mean of the client weights plus H = -h/alpha; H accumulates client drift."""

    CONFIG_KEYS = {"feddyn-alpha": Key(0.01, positive, "> 0")}
    UNIFORM_MEAN = True  # Algorithm 1's plain mean (FedSMOO, a subclass, shares it)
    SCREENING = REPLIES_ONLY
    SCREENING_WHY = ("w = mean(w_k) - h/alpha with h accumulating the sum of the client drifts: a "
                     "coordinate-wise median of the weights would not match the h it updates")

    def __init__(self, *, alpha: float, trainable: list[bool], **kwargs):
        super().__init__(**kwargs)
        self.alpha = alpha
        self.trainable = trainable
        self.H: list[np.ndarray] | None = None  # float64, one array per state_dict entry
        self.num_clients: int | None = None

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return cls(alpha=cfg["feddyn-alpha"], trainable=trainable_mask(cfg), **kwargs)

    @property
    def h(self) -> list[np.ndarray] | None:
        """The paper's server state h = -alpha H."""
        return None if self.H is None else [-self.alpha * a for a in self.H]

    def get_state(self) -> dict[str, list[np.ndarray]]:
        """Server state for checkpoints: H exactly, and the paper's h (absent before the first
        aggregation)."""
        if self.H is None:
            return {}
        return {"feddyn-h": self.h, "feddyn-H": [a.copy() for a in self.H]}

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        if "feddyn-H" in state:
            self.H = [np.asarray(a, dtype=np.float64) for a in state["feddyn-H"]]
        elif "feddyn-h" in state:
            self.H = [-np.asarray(a, dtype=np.float64) / self.alpha for a in state["feddyn-h"]]

    def configure_fit(self, server_round, parameters, client_manager):
        instructions = super().configure_fit(server_round, parameters, client_manager)
        self.num_clients = total_clients(client_manager)
        return instructions

    def dynamic_update(self, clients: list[list[np.ndarray]]) -> list[np.ndarray]:
        """H <- H + (1/N) sum_k (w_k - w_t), then the new global model mean_k(w_k) + H
        (trainable entries; buffers: the plain mean), each array in its own dtype."""
        w_t = self.global_weights
        n_total = max(self.num_clients or len(clients), len(clients))
        if self.H is None:
            self.H = [np.zeros(a.shape, dtype=np.float64) for a in w_t]
        new = []
        for i, ref in enumerate(w_t):
            stacked = np.stack([c[i].astype(np.float64) for c in clients])
            mean = stacked.mean(axis=0)
            if self.trainable[i]:
                drift = (stacked - ref.astype(np.float64)).sum(axis=0)
                self.H[i] = self.H[i] + drift / n_total
                new.append(cast_like(mean + self.H[i], ref))
            else:
                new.append(cast_like(mean, ref))
        return new

    def trainable_norm(self, arrays: list[np.ndarray]) -> float:
        """Euclidean norm over the trainable entries of ``arrays`` (state_dict order)."""
        return float(np.sqrt(sum(float((a**2).sum()) for a, m in zip(arrays, self.trainable) if m)))

    def aggregate_fit(self, server_round, results, failures):
        clients = self.client_arrays(results, failures)
        if clients is None:
            return None, {}
        new = self.dynamic_update(clients)
        return ndarrays_to_parameters(new), {"feddyn_h_norm": self.trainable_norm(self.h)}
