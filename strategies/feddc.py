"""FedDC server (Gao et al., CVPR 2022; the authors' code): FedDyn's server and SCAFFOLD's c.

Over the clients S_t that replied (N = all clients; H and c start at zero):
    H <- H + (1/N) sum_{S_t} (w_i - w_t);   w_{t+1} = mean_{S_t}(w_i) + H
(``strategies.parts.DriftMemory``: unweighted means, buffers the plain mean), and
    c <- c + (1/N) sum_{S_t} delta c_i
(``strategies.parts.ServerControlVariates``: c travels after the weights, delta c_i after the
reply's weights; the optimiser check refuses Adam). The two server parts FedDyn and SCAFFOLD
use, composed here; checkpoints hold H (FedDyn's records, h = -alpha H) and c. Server
metrics: ``feddc_H_norm`` (||H||, the mean drift over all clients) and ``cv_norm``.
"""

from __future__ import annotations

import numpy as np
from flwr.common import ndarrays_to_parameters

from protocol.keys import Key, non_negative
from protocol.layout import trainable_param_names
from protocol.traffic import CONTROL_VARIATES
from strategies.arrays import send_with_extras, split_replies, total_clients
from strategies.base import REPLIES_ONLY, DriftFedAvg, trainable_mask
from strategies.control_variates import cv_layout
from strategies.parts import DriftMemory, ServerControlVariates, refuse_nonlinear_optimiser


class FedDCStrategy(DriftFedAvg):
    """The replies' weights aggregated by FedDyn's server part, their delta c_i by SCAFFOLD's."""

    CONFIG_KEYS = {"feddc-alpha": Key(0.01, non_negative, ">= 0 (drift penalty alpha)")}
    TRAFFIC = CONTROL_VARIATES  # c down, delta_c up (protocol.traffic)
    REPLY_SUMS = None  # a plain mean over clients (UNIFORM_MEAN)
    UNIFORM_MEAN = True  # FedDyn's plain mean
    SCREENING = REPLIES_ONLY
    SCREENING_WHY = ("w = mean(w_k) + H with H accumulating the sum of the client drifts, and c moved by the "
                     "clients' delta c_i: a coordinate-wise median of the weights would match neither")

    def __init__(self, *, alpha: float, trainable: list[bool], cv_shapes: list[tuple], **kwargs):
        super().__init__(**kwargs)
        self.alpha = alpha
        self.memory = DriftMemory(trainable)
        self.cv = ServerControlVariates(cv_shapes, "total")  # SCAFFOLD's 1/N, as the authors' code
        self.num_state = len(trainable)
        self.num_clients: int | None = None

    @classmethod
    def resolve_config(cls, cfg: dict) -> dict:
        refuse_nonlinear_optimiser(cfg)
        return super().resolve_config(cfg)

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        shapes, _ = cv_layout(cfg, trainable_param_names)
        return cls(alpha=cfg["feddc-alpha"], trainable=trainable_mask(cfg), cv_shapes=shapes, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha})"

    def get_state(self) -> dict[str, list[np.ndarray]]:
        """Server state for checkpoints: c, and H once the first round is aggregated."""
        return {**self.memory.get_state(self.alpha), **self.cv.get_state()}

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        self.memory.set_state(state, self.alpha)
        self.cv.set_state(state)

    def configure_fit(self, server_round, parameters, client_manager):
        instructions = super().configure_fit(server_round, parameters, client_manager)
        self.num_clients = total_clients(client_manager)
        return send_with_extras(instructions, parameters, {"c": self.cv.c}, self.TRAFFIC.down, self.num_state)

    def aggregate_fit(self, server_round, results, failures):
        weight_results, extras = split_replies(results, self.num_state, {"delta_c": len(self.cv.c)}, "FedDC")
        clients = self.client_arrays(weight_results, failures)
        if clients is None:
            return None, {}
        new = self.memory.aggregate(clients, self.global_weights, self.num_clients)
        self.cv.update([e["delta_c"] for e in extras], self.num_clients)
        return ndarrays_to_parameters(new), {"cv_norm": self.cv.norm(), "feddc_H_norm": self.memory.norm()}
