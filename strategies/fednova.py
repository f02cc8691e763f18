"""FedNova (Wang et al. 2020): normalised averaging by each client's local step count.

With p_k = n_k / sum_{j in S_t} n_j and a_k = ||a_k||_1 the client's normaliser,
    d_k = (w_t - w_k) / a_k,  tau_eff = sum_k p_k a_k,  w_{t+1} = w_t - tau_eff * sum_k p_k d_k.
Plain SGD: a_k = tau_k (the client's ``num_steps``). Local SGD with momentum rho (PyTorch's
heavy ball, no dampening): the i-th of tau gradients enters w_k with weight
sum_{j<tau-i} rho^j, so a_k = sum_{s=1}^{tau_k} (1 - rho^s) / (1 - rho) (Wang et al.'s
a-vector for momentum SGD). Server learning rate 1, no server momentum. Only trainable
parameters are normalised; buffers (BN statistics) take the n_k-weighted mean.
"""

from __future__ import annotations

import numpy as np
from flwr.common import ndarrays_to_parameters

from protocol.keys import ConfigError
from strategies.arrays import cast_like
from strategies.base import REPLIES_ONLY, DriftFedAvg, trainable_mask


def normaliser(tau: int, momentum: float) -> float:
    """||a||_1 for ``tau`` local steps of SGD with heavy-ball ``momentum``."""
    if momentum == 0:
        return float(tau)
    s = np.arange(1, tau + 1)
    return float(((1 - momentum**s) / (1 - momentum)).sum())


class FedNovaStrategy(DriftFedAvg):
    """w_t - tau_eff * sum p_k (w_t - w_k) / a_k; needs ``num_steps`` from every client."""

    SCREENING = REPLIES_ONLY
    REPLY_SUMS = None  # each update normalised by its own client's step count
    SCREENING_WHY = ("its aggregation is a mean of updates normalised by each client's step count, "
                     "not a mean of the client weights")

    def __init__(self, *, momentum: float, trainable: list[bool], **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum
        self.trainable = trainable

    @classmethod
    def resolve_config(cls, cfg: dict) -> dict:
        """Refuse Adam/AdamW: a_k counts heavy-ball SGD steps and means nothing for Adam."""
        if cfg["optimizer"] != "sgd":
            raise ConfigError(
                f"run-config key 'optimizer' = {cfg['optimizer']!r} is invalid for strategy 'fednova':"
                " its normaliser a_k = sum_s (1 - rho^s)/(1 - rho) counts the steps of (momentum) SGD,"
                " and an Adam step has no such count; valid choices: sgd (with any momentum)"
            )
        return super().resolve_config(cfg)

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return cls(momentum=cfg["momentum"], trainable=trainable_mask(cfg), **kwargs)

    def aggregate_fit(self, server_round, results, failures):
        clients = self.client_arrays(results, failures)
        if clients is None:
            return None, {}
        w_t = self.global_weights
        n = np.array([res.num_examples for _, res in results], dtype=np.float64)
        p = n / n.sum()
        a = np.array([normaliser(int(res.metrics["num_steps"]), self.momentum) for _, res in results])
        tau_eff = float((p * a).sum())
        scale = np.divide(p, a, out=np.zeros_like(p), where=a > 0)  # p_k / a_k
        new = []
        for i, ref in enumerate(w_t):
            stacked = np.stack([c[i].astype(np.float64) for c in clients])
            if self.trainable[i]:
                d = np.tensordot(scale, ref.astype(np.float64) - stacked, axes=1)  # sum p_k d_k
                new.append(cast_like(ref - tau_eff * d, ref))
            else:
                new.append(cast_like(np.tensordot(p, stacked, axes=1), ref))
        return ndarrays_to_parameters(new), {"fednova_tau_eff": tau_eff}
