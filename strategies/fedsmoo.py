"""FedSMOO server (Sun, Shen, Chen, Ding, Tao, ICML 2023): FedDyn's server plus the global
perturbation s.

Over the clients P that replied in round t (N = all clients, H and s start at zero):
    H <- H + (1/N) sum_P (w_K - w_t);   w_{t+1} = mean_P(w_K) + H
(``strategies.parts.Drift``, FedDyn's server part: its h = -alpha H, written without dividing by alpha,
so ``smoo-alpha`` = 0 is allowed; unweighted means), then
    s <- rho * sum_P r_i / ||sum_P r_i||    (s = 0 when the sum is 0),
with r_i the extra arrays of client i's reply: the paper's stil_i = mu_i - shat_i,K
(``smoo-s = paper``), or mu_i (``code``: the authors' FL-Simulator normalises the mean of the
mu_i, the same direction). ``none`` keeps s = 0. s is one array per trainable parameter in
state_dict order and travels after the model state arrays, as SCAFFOLD's c does
(``protocol.traffic.SMOO``: ``s`` down, ``stil`` up); the global model never includes it.

Choices where the paper and the authors' code differ: the ``paper`` update is the default;
the authors' code also clips the local gradient at norm 10 (``smoo-clip-norm``, off by
default) and adds 1e-7 to the norm of mean mu_i (here: exact normalisation, 0 for a zero sum).
Server metrics: ``smoo_s_norm`` = ||s||, ``smoo_H_norm`` = ||H|| (trainable entries).
Checkpoints hold s (``smoo-s``) and H (``smoo-H``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from torch import nn

from protocol.keys import Key, non_negative
from protocol.layout import trainable_param_names
from protocol.traffic import SMOO
from strategies.base import REPLIES_ONLY
from strategies.declared import DeclaredStrategy, ServerSide
from strategies.parts import Drift, Replies, TravellingState, cv_shapes, norm

S_MODES = ("paper", "code", "none")  # what a client replies and how s is formed


def global_perturbation(replies: list[list[np.ndarray]], rho: float) -> list[np.ndarray]:
    """s = rho * sum_i r_i / ||sum_i r_i|| over the whole vector (zeros for a zero sum), float32."""
    total = [sum(r[i] for r in replies) for i in range(len(replies[0]))]
    size = float(np.sqrt(sum(float((a**2).sum()) for a in total)))
    scale = rho / size if size > 0 else 0.0
    return [(a * scale).astype(np.float32) for a in total]


@dataclass(frozen=True)
class Perturbation:
    """Declares s: ``rho`` and ``mode`` the run-config keys of rho and of the reading."""

    rho: str = "smoo-rho"
    mode: str = "smoo-s"
    SENDS: ClassVar[tuple[str, ...]] = ("s",)
    READS: ClassVar[tuple[str, ...]] = ("stil",)
    AGGREGATES: ClassVar[bool] = False

    def keys_read(self) -> tuple[str, ...]:
        return (self.rho, self.mode)

    def check(self, cfg: dict) -> None:
        """Nothing refused."""

    def build(self, cfg: dict, model: nn.Module) -> GlobalPerturbation:
        return GlobalPerturbation(cv_shapes(model, cfg, trainable_param_names), cfg[self.rho], cfg[self.mode])


class GlobalPerturbation(TravellingState):
    """s, one float32 array per trainable parameter (module docstring)."""

    STATE, SENT, READ, RECORD = "s", "s", "stil", "smoo-s"

    def __init__(self, shapes: list[tuple], rho: float, mode: str):
        if mode not in S_MODES:
            raise ValueError(f"smoo-s {mode!r} is not one of {', '.join(S_MODES)}")
        self.rho, self.mode = rho, mode
        self.s = [np.zeros(shape, dtype=np.float32) for shape in shapes]

    def __repr__(self) -> str:
        return f"GlobalPerturbation(rho={self.rho}, smoo-s={self.mode!r})"

    def update(self, replies: Replies) -> None:
        if self.mode != "none":
            self.s = global_perturbation([[a.astype(np.float64) for a in r["stil"]] for r in replies.up], self.rho)

    def metrics(self) -> dict[str, float]:
        return {"smoo_s_norm": norm(self.s)}


class FedSMOOStrategy(DeclaredStrategy):
    """FedDyn's server part and the global perturbation s."""

    SERVER = ServerSide(
        "FedSMOO", screening=REPLIES_ONLY, reply_sums=None,  # a plain mean over clients
        keys={
            "smoo-rho": Key(0.1, non_negative, ">= 0 (SAM radius rho; 0 = FedDyn)"),
            "smoo-alpha": Key(0.1, non_negative, ">= 0 (FedDyn coefficient alpha; 0 = no dynamic regulariser)"),
            "smoo-s": Key("paper", choices=S_MODES),
        },
        traffic=SMOO,  # s after the weights down, stil after them up
        parts={"perturbation": Perturbation(),
               "memory": Drift(alpha="smoo-alpha", metric="smoo_H_norm", record="smoo", with_h=False)},
        screening_why=("w = mean(w_k) + H with H accumulating the sum of the client drifts, and s formed from the "
                       "clients' extra arrays: a coordinate-wise median of the weights would match neither"))
