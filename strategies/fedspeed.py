"""FedSpeed server (Sun et al., ICLR 2023; the authors' FL-Simulator): FedDyn's server.

Over the clients S_t that replied (N = all clients, H starts at zero):
    H <- H + (1/N) sum_{S_t} (w_i - w_t);   w_{t+1} = mean_{S_t}(w_i) + H
(``FedDynStrategy.dynamic_update``, written without dividing by the prox coefficient c, so c = 0
is allowed; unweighted means, buffers the plain mean). Only the weights travel. Checkpoints
hold H (FedDyn's ``get_state``); server metric ``fedspeed_H_norm`` (||H||, the mean drift over
all clients).
"""

from __future__ import annotations

from protocol.keys import Key, non_negative
from strategies.base import REPLIES_ONLY, trainable_mask
from strategies.feddyn import FedDynStrategy


class FedSpeedStrategy(FedDynStrategy):
    """FedDyn's server with FedSpeed's key for its coefficient."""

    CONFIG_KEYS = {"fedspeed-prox": Key(0.1, non_negative, ">= 0 (prox coefficient c = 1/lambda; the code's lamb)")}
    SCREENING = REPLIES_ONLY
    SCREENING_WHY = ("w = mean(w_k) + H with H accumulating the sum of the client drifts: a coordinate-wise median "
                     "of the weights would not match the H it updates")

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return cls(alpha=cfg["fedspeed-prox"], trainable=trainable_mask(cfg), **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(prox={self.alpha})"

    def aggregate_fit(self, server_round, results, failures):
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        if parameters is None:
            return parameters, metrics
        return parameters, {"fedspeed_H_norm": self.trainable_norm(self.H)}
