"""CCVR server (Luo et al., NeurIPS 2021; the rules in ``clients/ccvr.py``): FedAvg's n_k-weighted
mean every round; in the calibration round (``protocol.calibration``, the run's last) it samples
every client (``ccvr-clients = "all"``), pools their class statistics (``pooled_statistics``),
draws virtual features (``virtual_features``) and retrains the head on them (``retrained_head``):
the part ``Calibration`` revises the aggregated model (``strategies.declared``'s ``REVISES``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from torch import nn

from protocol.calibration import STATISTICS, is_calibration_round
from protocol.keys import Key, at_least, positive
from protocol.traffic import CLASS_STATISTICS
from strategies.arrays import cast_like
from strategies.base import REPLIES_ONLY
from strategies.declared import DeclaredStrategy, ServerSide
from strategies.parts import Part, Replies

CLIENTS = ("all", "sampled")
WHY = ("the calibration round retrains the head on the replies' class statistics, which a median or trimmed mean "
       "of the weights does not screen")


def pooled_statistics(counts: Sequence[np.ndarray], means: Sequence[np.ndarray],
                      covs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N_c, mu_c, Sigma_c) per class over the clients' (N_{c,k}, mu_{c,k}, Sigma_{c,k}), float64
    (clients/ccvr.py's formulas); mu_c = 0 where N_c = 0 and Sigma_c = 0 where N_c < 2."""
    n_k = np.stack([np.asarray(c, dtype=np.float64) for c in counts])  # (K, C)
    mu_k = np.stack([np.asarray(m, dtype=np.float64) for m in means])  # (K, C, d)
    cov_k = np.stack([np.asarray(s, dtype=np.float64) for s in covs])  # (K, C, d, d)
    total = n_k.sum(axis=0)
    mean = np.einsum("kc,kcd->cd", n_k, mu_k) / np.maximum(total, 1)[:, None]
    scatter = (np.einsum("kc,kcde->cde", n_k - 1, cov_k) + np.einsum("kc,kcd,kce->cde", n_k, mu_k, mu_k)
               - total[:, None, None] * np.einsum("cd,ce->cde", mean, mean))
    cov = np.where((total >= 2)[:, None, None], scatter / np.maximum(total - 1, 1)[:, None, None], 0.0)
    return total, mean, cov


def virtual_features(mean: np.ndarray, cov: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` draws of N(mean, cov): mean + eps (V sqrt(L))^T, cov = V L V^T (its symmetric part;
    negative rounding eigenvalues set to 0), eps standard normal from ``rng``."""
    values, vectors = np.linalg.eigh((cov + cov.T) / 2)
    root = vectors * np.sqrt(np.clip(values, 0.0, None))
    return mean + rng.standard_normal((count, len(mean))) @ root.T


def retrained_head(weight: np.ndarray, bias: np.ndarray | None, z: np.ndarray, y: np.ndarray, epochs: int,
                   batch_size: int, lr: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """The head (weight C x d, bias C or None) after ``epochs`` passes of plain SGD on the mean
    cross-entropy of (z, y), batches of ``batch_size`` in an order ``rng`` shuffles each pass,
    float64: logits z W^T + b, gradient (softmax - onehot) / B."""
    w = weight.astype(np.float64)
    b = None if bias is None else bias.astype(np.float64)
    onehot = np.eye(w.shape[0])[y]
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch_size):
            idx = order[start:start + batch_size]
            logits = z[idx] @ w.T + (0.0 if b is None else b)
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            g = (p / p.sum(axis=1, keepdims=True) - onehot[idx]) / len(idx)
            w = w - lr * g.T @ z[idx]
            if b is not None:
                b = b - lr * g.sum(axis=0)
    return w, b


@dataclass(frozen=True)
class Calibration:
    """Declares CCVR's calibration (module docstring): reads ``class_stats``, revises the model."""

    SENDS: ClassVar[tuple[str, ...]] = ()
    READS: ClassVar[tuple[str, ...]] = ("class_stats",)
    AGGREGATES: ClassVar[bool] = False
    REVISES: ClassVar[bool] = True

    def keys_read(self) -> tuple[str, ...]:
        return ("ccvr-samples", "ccvr-epochs", "ccvr-lr")

    def check(self, cfg: dict) -> None:
        """Nothing refused."""

    def build(self, cfg: dict, model: nn.Module) -> HeadCalibration:
        names = list(model.state_dict())
        bias = names.index("head.bias") if "head.bias" in names else None
        return HeadCalibration(names.index("head.weight"), bias, cfg["num-server-rounds"], cfg["ccvr-samples"],
                               cfg["ccvr-epochs"], cfg["ccvr-lr"], cfg["batch-size"], cfg["seed"])


class HeadCalibration(Part):
    """CCVR's calibration of the head (module docstring): the head's positions among the state
    arrays, the calibration round and the retraining's settings."""

    def __init__(self, weight: int, bias: int | None, num_rounds: int, samples: int, epochs: int, lr: float,
                 batch_size: int, seed: int):
        self.weight, self.bias, self.num_rounds = weight, bias, num_rounds
        self.samples, self.epochs, self.lr, self.batch_size, self.seed = samples, epochs, lr, batch_size, seed
        self.drawn, self.change = 0, 0.0

    def __repr__(self) -> str:
        return f"HeadCalibration(round {self.num_rounds}, {self.samples} per class)"

    def up_sizes(self) -> dict[str, int]:
        return {"class_stats": len(STATISTICS)}

    def revise(self, weights: list[np.ndarray], replies: Replies) -> list[np.ndarray]:
        """In the calibration round, ``weights`` with the head retrained on virtual features of
        the pooled statistics (a generator seeded by (seed, round) draws and shuffles them);
        otherwise as they came."""
        self.drawn, self.change = 0, 0.0
        if not is_calibration_round(replies.server_round, self.num_rounds):
            return weights
        stats = [dict(zip(STATISTICS, groups["class_stats"])) for groups in replies.up]
        total, mean, cov = pooled_statistics(*([s[name] for s in stats] for name in STATISTICS))
        rng = np.random.default_rng([self.seed, replies.server_round])
        classes = [c for c in range(len(total)) if total[c] >= 2]
        if not classes:
            return weights
        z = np.concatenate([virtual_features(mean[c], cov[c], self.samples, rng) for c in classes])
        y = np.repeat(classes, self.samples)
        old_w = weights[self.weight]
        old_b = None if self.bias is None else weights[self.bias]
        w, b = retrained_head(old_w, old_b, z, y, self.epochs, self.batch_size, self.lr, rng)
        new = list(weights)
        new[self.weight] = cast_like(w, old_w)
        if self.bias is not None:
            new[self.bias] = cast_like(b, old_b)
        self.drawn = len(y)
        self.change = float(np.sqrt(((w - old_w) ** 2).sum() + (0.0 if b is None else ((b - old_b) ** 2).sum())))
        return new

    def metrics(self) -> dict[str, float]:
        return {"ccvr_virtual_features": float(self.drawn), "ccvr_head_change": self.change}


class CCVRStrategy(DeclaredStrategy):
    """FedAvg's rounds; the last samples every client (``ccvr-clients = "all"``) and calibrates."""

    SERVER = ServerSide(
        "CCVR", screening=REPLIES_ONLY, reply_sums=None, traffic=CLASS_STATISTICS, screening_why=WHY,
        keys={"ccvr-samples": Key(100, at_least(1), ">= 1 (virtual features drawn per class)"),
              "ccvr-epochs": Key(1, at_least(1), ">= 1 (passes of the head's retraining)"),
              "ccvr-lr": Key(0.01, positive, "> 0 (learning rate of the head's retraining)"),
              "ccvr-clients": Key("all", choices=CLIENTS)},
        parts={"calibration": Calibration()})

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        strategy = super().from_config(cfg, **kwargs)
        strategy.every_client = cfg["ccvr-clients"] == "all"
        return strategy

    def configure_fit(self, server_round, parameters, client_manager):
        self.calibrating = self.every_client and is_calibration_round(server_round, self.calibration.num_rounds)
        return super().configure_fit(server_round, parameters, client_manager)

    def num_fit_clients(self, num_available_clients: int) -> tuple[int, int]:
        """Every available client in the calibration round (``ccvr-clients = "all"``), else FedAvg's."""
        if getattr(self, "calibrating", False):
            return num_available_clients, self.min_available_clients
        return super().num_fit_clients(num_available_clients)
