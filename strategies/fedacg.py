"""FedACG server (Kim, Kim, Han, CVPR 2024): global momentum m and the look-ahead model sent.

Round t, with the global model theta (what the server evaluates and checkpoints) and m (zeros
at first), on the trainable entries:
    sent:   theta~ = theta + lambda m                (buffers: sent as they are)
    after:  theta' = (1/|S_t|) sum_{S_t} w_i          (every entry; integer buffers rounded)
            m      = lambda m + (theta' - theta~)
m is kept in float64 and checkpointed (``get_state`` / ``set_state``); theta~ is recomputed from
theta and m, so a resumed run sends what an uninterrupted one would. A round whose new model is
not finite leaves m unchanged (the server then keeps its model, ``fl_app/server/server.py``).
"""

from __future__ import annotations

import numpy as np
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from protocol.keys import Key
from protocol.layout import all_finite
from strategies.arrays import cast_like
from strategies.base import MEAN_OF_WEIGHTS, DriftFedAvg, trainable_mask


class FedACGStrategy(DriftFedAvg):
    """Unweighted mean of the replies; global momentum m; sends theta + lambda m."""

    CONFIG_KEYS = {
        "fedacg-lambda": Key(0.85, lambda v: 0 <= v < 1, "in [0, 1) (server momentum and look-ahead lambda)"),
    }
    UNIFORM_MEAN = True  # the paper's and the code's (1/|S_t|) sum
    SCREENING = MEAN_OF_WEIGHTS  # theta' and m depend on the replies through their mean only
    REPLY_SUMS = None  # a plain mean over clients (UNIFORM_MEAN)

    def __init__(self, *, lam: float, trainable: list[bool], **kwargs):
        super().__init__(**kwargs)
        self.lam = lam
        self.trainable = trainable
        self.m: list[np.ndarray] | None = None  # float64, one array per state_dict entry (0 on buffers)

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return cls(lam=cfg["fedacg-lambda"], trainable=trainable_mask(cfg), **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lambda={self.lam})"

    def get_state(self) -> dict[str, list[np.ndarray]]:
        """Server state for checkpoints: m (absent before the first aggregation)."""
        return {} if self.m is None else {"fedacg-m": [a.copy() for a in self.m]}

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        if "fedacg-m" in state:
            m = [np.asarray(a, dtype=np.float64) for a in state["fedacg-m"]]
            if len(m) != len(self.trainable):
                raise ValueError(f"checkpointed FedACG momentum has {len(m)} arrays, expected {len(self.trainable)}")
            self.m = m

    def lookahead(self, theta: list[np.ndarray]) -> list[np.ndarray]:
        """theta + lambda m on the trainable entries (theta itself before any momentum)."""
        if self.m is None:
            return theta
        if [a.shape for a in self.m] != [a.shape for a in theta]:
            raise ValueError("the checkpointed FedACG momentum does not match this model")
        return [cast_like(a.astype(np.float64) + self.lam * m, a) if t else a
                for a, m, t in zip(theta, self.m, self.trainable)]

    def configure_fit(self, server_round, parameters, client_manager):
        """Sample as FedAvg does and send the look-ahead model (``global_weights`` = theta~)."""
        sent = self.lookahead(parameters_to_ndarrays(parameters))
        return super().configure_fit(server_round, ndarrays_to_parameters(sent), client_manager)

    def aggregate_fit(self, server_round, results, failures):
        clients = self.client_arrays(results, failures)
        if clients is None:
            return None, {}
        sent = self.global_weights
        new, m = [], []
        for i, ref in enumerate(sent):
            mean = np.mean([c[i].astype(np.float64) for c in clients], axis=0)
            new.append(cast_like(mean, ref))
            previous = self.m[i] if self.m is not None else np.zeros(ref.shape)
            m.append(self.lam * previous + (mean - ref.astype(np.float64)) if self.trainable[i]
                     else np.zeros(ref.shape))
        if all_finite(m):
            self.m = m
        norm = float(np.sqrt(sum(float((a**2).sum()) for a in (self.m or []))))
        return ndarrays_to_parameters(new), {"fedacg_m_norm": norm}
