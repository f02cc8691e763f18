"""FedPGVC (TMLR 2026) server: w <- (1 - eta_g) w + eta_g * (1/K) sum_k w_k (Eq. 16).

The mean is the plain one over the round's K clients, as Eq. 16 and Algorithm 1 write it and as
the authors' code (``avg_weights``) computes it, not the n_k-weighted mean of FedAvg; the app's
drift columns weight clients the same way (``UNIFORM_MEAN``). eta_g = ``server-lr``; 1 (the
paper's setting, Sec. 4) is the plain mean itself. The paper's Eq. 16 omits eta_g on the mean;
the form used here is the one whose eta_g = 1 case is the paper's plain mean (docs/methods.md,
"fedpgvc"). Both readings (``pgvc-variant``) share this server; the key sits here because the
server refuses, before training, a model a reading cannot run on.
"""

from __future__ import annotations

import numpy as np
from flwr.common import FitRes, ndarrays_to_parameters, parameters_to_ndarrays

from protocol.keys import ConfigError, Key, at_least
from strategies.base import MEAN_OF_WEIGHTS, DriftFedAvg
from strategies.server_opt import SERVER_LR
from tasks.datasets import input_shape
from tasks.keras_layers import pgvc_code_layers
from tasks.models import MODELS, build_model, last_layers_param_names

# "text": the paper's equations (a penalty in every step); "authors": the released code
# (plain training, then a rescale of its masked layers). clients/fedpgvc.py has both.
VARIANTS = ("text", "authors")


class FedPGVCStrategy(DriftFedAvg):
    """Plain mean of client weights, mixed with the current global weights by eta_g."""

    SCREENING = MEAN_OF_WEIGHTS  # (1 - eta_g) w_t + eta_g times the plain mean of the weights
    REPLY_SUMS = None  # a plain mean over clients (UNIFORM_MEAN)
    UNIFORM_MEAN = True  # Eq. 16's (1/K) sum, as the authors' avg_weights
    CONFIG_KEYS = {
        "pgvc-variant": Key("text", choices=VARIANTS),
        "pgvc-layers": Key(2, at_least(1), ">= 1 (last Linear layers under the gradient penalty)"),
        "server-lr": SERVER_LR,
    }

    def __init__(self, *, server_lr: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.server_lr = server_lr

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        model = build_model(cfg["model"], input_shape(cfg["dataset"]))
        # fail at start, not in every client, when the model does not fit the reading
        if cfg["pgvc-variant"] == "authors":
            try:
                pgvc_code_layers(model)
            except ValueError as e:
                ok = ", ".join(name for name in MODELS if fits_code(name, cfg["dataset"]))
                raise ConfigError(
                    f"run-config key 'model' = {cfg['model']!r} is invalid with pgvc-variant = \"authors\":"
                    f" {e}; valid choices: {ok}"
                ) from e
        else:
            try:
                last_layers_param_names(model, cfg["pgvc-layers"])
            except ValueError as e:
                raise ConfigError(
                    f"run-config key 'pgvc-layers' = {cfg['pgvc-layers']} is invalid for model"
                    f" {cfg['model']!r}: {e}"
                ) from e
        return cls(server_lr=cfg["server-lr"], **kwargs)

    def aggregate_fit(self, server_round, results, failures):
        # every reply counts once: Flower's weighted mean with n_k = 1 is the plain mean
        plain = [(c, FitRes(r.status, r.parameters, 1, r.metrics)) for c, r in results]
        parameters, metrics = super().aggregate_fit(server_round, plain, failures)
        if parameters is None or self.server_lr == 1.0 or self.global_weights is None:
            return parameters, metrics
        mean = parameters_to_ndarrays(parameters)
        return ndarrays_to_parameters(mix(self.global_weights, mean, self.server_lr)), metrics


def fits_code(model_name: str, dataset: str) -> bool:
    """Whether ``pgvc-variant = "authors"`` can run model ``model_name`` on ``dataset``."""
    try:
        pgvc_code_layers(build_model(model_name, input_shape(dataset)))
    except ValueError:
        return False
    return True


def mix(global_weights: list[np.ndarray], mean: list[np.ndarray], eta_g: float) -> list[np.ndarray]:
    """(1 - eta_g) * w + eta_g * mean for floating arrays; integer buffers take the mean."""
    out = []
    for w, a in zip(global_weights, mean):
        if np.issubdtype(a.dtype, np.floating):
            out.append(((1 - eta_g) * w + eta_g * a).astype(a.dtype))
        else:
            out.append(a)
    return out
