"""FedDC server (Gao et al., CVPR 2022; the authors' code): FedDyn's server and SCAFFOLD's c.

Over the clients S_t that replied (N = all clients; H and c start at zero):
    H <- H + (1/N) sum_{S_t} (w_i - w_t);   w_{t+1} = mean_{S_t}(w_i) + H
(``FedDynStrategy.dynamic_update``: unweighted means, buffers the plain mean), and
    c <- c + (1/N) sum_{S_t} delta c_i
(``ControlVariateStrategy``: c travels after the weights, delta c_i after the reply's weights;
the optimiser check refuses Adam). Both pieces are the existing classes', combined here by
inheritance; checkpoints hold H and c. Server metrics: ``feddc_H_norm`` (||H||, the mean drift
over all clients) and ``cv_norm``.
"""

from __future__ import annotations

import numpy as np

from protocol.keys import Key, non_negative
from strategies.base import REPLIES_ONLY, trainable_mask
from strategies.feddyn import FedDynStrategy
from strategies.scaffold import ControlVariateStrategy


class FedDCStrategy(ControlVariateStrategy, FedDynStrategy):
    """The replies' weights aggregated by FedDyn's server, their delta c_i by SCAFFOLD's."""

    CONFIG_KEYS = {"feddc-alpha": Key(0.01, non_negative, ">= 0 (drift penalty alpha)")}
    CV_DIVISOR = "total"  # SCAFFOLD's 1/N, as the authors' code
    UNIFORM_MEAN = True  # FedDyn's plain mean
    SCREENING = REPLIES_ONLY
    SCREENING_WHY = ("w = mean(w_k) + H with H accumulating the sum of the client drifts, and c moved by the "
                     "clients' delta c_i: a coordinate-wise median of the weights would match neither")

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return super().from_config(cfg, alpha=cfg["feddc-alpha"], trainable=trainable_mask(cfg), **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha})"

    def get_state(self) -> dict[str, list[np.ndarray]]:
        """Server state for checkpoints: c, and H once the first round is aggregated."""
        return {**FedDynStrategy.get_state(self), **ControlVariateStrategy.get_state(self)}

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        FedDynStrategy.set_state(self, state)
        ControlVariateStrategy.set_state(self, state)

    def aggregate_fit(self, server_round, results, failures):
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        if parameters is None:
            return parameters, metrics
        metrics = {k: v for k, v in metrics.items() if k != "feddyn_h_norm"}
        return parameters, {**metrics, "feddc_H_norm": self.trainable_norm(self.H)}
