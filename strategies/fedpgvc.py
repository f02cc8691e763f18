"""FedPGVC (TMLR 2026) server: w <- (1 - eta_g) w + eta_g * weighted_mean_k(w_k) (Eq. 16).

eta_g = ``server-lr``; 1 (the paper's setting, Sec. 4) is plain FedAvg. The mean is the
n_k-weighted one (fl-drift's default) although Eq. 16 writes 1/K. The paper's Eq. 16
omits eta_g on the mean; the form used here, w <- (1 - eta_g) w + eta_g * mean, is the one
whose eta_g = 1 case is the paper's plain mean (docs/methods.md, "fedpgvc").
"""

from __future__ import annotations

import numpy as np
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from strategies.base import MEAN_OF_WEIGHTS, DriftFedAvg
from strategies.server_opt import SERVER_LR
from tasks.datasets import input_shape
from tasks.keys import ConfigError, Key, at_least
from tasks.models import build_model, last_layers_param_names


class FedPGVCStrategy(DriftFedAvg):
    """Weighted mean of client weights, mixed with the current global weights by eta_g."""

    SCREENING = MEAN_OF_WEIGHTS  # (1 - eta_g) w_t + eta_g times the weighted mean of the weights
    CONFIG_KEYS = {
        "pgvc-layers": Key(2, at_least(1), ">= 1 (last Linear layers under the gradient penalty)"),
        "server-lr": SERVER_LR,
    }

    def __init__(self, *, server_lr: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.server_lr = server_lr

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        model = build_model(cfg["model"], input_shape(cfg["dataset"]))
        try:  # fail at start, not in every client, when the model has too few Linear layers
            last_layers_param_names(model, cfg["pgvc-layers"])
        except ValueError as e:
            raise ConfigError(
                f"run-config key 'pgvc-layers' = {cfg['pgvc-layers']} is invalid for model"
                f" {cfg['model']!r}: {e}"
            ) from e
        return cls(server_lr=cfg["server-lr"], **kwargs)

    def aggregate_fit(self, server_round, results, failures):
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        if parameters is None or self.server_lr == 1.0 or self.global_weights is None:
            return parameters, metrics
        mean = parameters_to_ndarrays(parameters)
        return ndarrays_to_parameters(mix(self.global_weights, mean, self.server_lr)), metrics


def mix(global_weights: list[np.ndarray], mean: list[np.ndarray], eta_g: float) -> list[np.ndarray]:
    """(1 - eta_g) * w + eta_g * mean for floating arrays; integer buffers take the mean."""
    out = []
    for w, a in zip(global_weights, mean):
        if np.issubdtype(a.dtype, np.floating):
            out.append(((1 - eta_g) * w + eta_g * a).astype(a.dtype))
        else:
            out.append(a)
    return out
