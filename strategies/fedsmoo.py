"""FedSMOO server (Sun, Shen, Chen, Ding, Tao, ICML 2023): FedDyn's server plus the global
perturbation s.

Over the clients P that replied in round t (N = all clients, H and s start at zero):
    H <- H + (1/N) sum_P (w_K - w_t);   w_{t+1} = mean_P(w_K) + H
(``strategies.parts.DriftMemory``, FedDyn's server part: its h = -alpha H, written without dividing by alpha,
so ``smoo-alpha`` = 0 is allowed; unweighted means), then
    s <- rho * sum_P r_i / ||sum_P r_i||    (s = 0 when the sum is 0),
with r_i the extra arrays of client i's reply: the paper's stil_i = mu_i - shat_i,K
(``smoo-s = paper``), or mu_i (``code``: the authors' FL-Simulator normalises the mean of the
mu_i, the same direction). ``none`` keeps s = 0. s is one array per trainable parameter in
state_dict order and travels after the model state arrays, as SCAFFOLD's c does
(``strategies.arrays.send_with_extras``); the global model never includes it.

Choices where the paper and the authors' code differ: the ``paper`` update is the default;
the authors' code also clips the local gradient at norm 10 (``smoo-clip-norm``, off by
default) and adds 1e-7 to the norm of mean mu_i (here: exact normalisation, 0 for a zero sum).
Server metrics: ``smoo_s_norm`` = ||s||, ``smoo_H_norm`` = ||H|| (trainable entries).
Checkpoints hold H and s (``get_state`` / ``set_state``).
"""

from __future__ import annotations

import numpy as np
from flwr.common import ndarrays_to_parameters

from protocol.keys import Key, non_negative
from protocol.layout import cv_names_in_state_order, trainable_param_names
from protocol.traffic import SMOO
from strategies.arrays import restored_like, send_with_extras, split_replies, total_clients
from strategies.base import REPLIES_ONLY, DriftFedAvg
from strategies.parts import DriftMemory
from tasks.datasets import input_shape
from tasks.models import build_model

S_MODES = ("paper", "code", "none")  # what a client replies and how s is formed

class FedSMOOStrategy(DriftFedAvg):
    """FedDyn's server part (``DriftMemory``) and the global perturbation s."""

    TRAFFIC = SMOO  # s after the weights down, stil after them up (protocol.traffic)
    REPLY_SUMS = None  # a plain mean over clients (UNIFORM_MEAN)
    SCREENING = REPLIES_ONLY
    SCREENING_WHY = ("w = mean(w_k) + H with H accumulating the sum of the client drifts, and s formed from the "
                     "clients' extra arrays: a coordinate-wise median of the weights would match neither")
    CONFIG_KEYS = {
        "smoo-rho": Key(0.1, non_negative, ">= 0 (SAM radius rho; 0 = FedDyn)"),
        "smoo-alpha": Key(0.1, non_negative, ">= 0 (FedDyn coefficient alpha; 0 = no dynamic regulariser)"),
        "smoo-s": Key("paper", choices=S_MODES),
    }

    UNIFORM_MEAN = True  # FedDyn's plain mean

    def __init__(self, *, alpha: float, rho: float, mode: str, trainable: list[bool],
                 s_shapes: list[tuple], **kwargs):
        super().__init__(**kwargs)
        self.alpha = alpha
        self.memory = DriftMemory(trainable)
        self.num_clients: int | None = None
        if mode not in S_MODES:
            raise ValueError(f"smoo-s {mode!r} is not one of {', '.join(S_MODES)}")
        self.rho = rho
        self.mode = mode
        self.num_state = len(trainable)
        self.s = [np.zeros(shape, dtype=np.float32) for shape in s_shapes]

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        model = build_model(cfg["model"], input_shape(cfg["dataset"]))
        state = model.state_dict()
        params = {n for n, _ in model.named_parameters()}
        names = cv_names_in_state_order(model, trainable_param_names(model, cfg))
        return cls(alpha=cfg["smoo-alpha"], rho=cfg["smoo-rho"], mode=cfg["smoo-s"],
                   trainable=[n in params for n in state],
                   s_shapes=[tuple(state[n].shape) for n in names], **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rho={self.rho}, alpha={self.alpha}, smoo-s={self.mode!r})"

    def get_state(self) -> dict[str, list[np.ndarray]]:
        """Server state for checkpoints: s, and H once the first round is aggregated."""
        state = {"smoo-s": [a.copy() for a in self.s]}
        if self.memory.H is not None:
            state["smoo-H"] = [a.copy() for a in self.memory.H]
        return state

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        if "smoo-s" in state:
            self.s = restored_like(state["smoo-s"], self.s, np.float32, "s")
        if "smoo-H" in state:
            self.memory.restore(state["smoo-H"])

    def configure_fit(self, server_round, parameters, client_manager):
        instructions = super().configure_fit(server_round, parameters, client_manager)
        self.num_clients = total_clients(client_manager)
        return send_with_extras(instructions, parameters, {"s": self.s}, self.TRAFFIC.down, self.num_state)

    def aggregate_fit(self, server_round, results, failures):
        if not results or (failures and not self.accept_failures):
            return None, {}
        weight_results, extras = split_replies(results, self.num_state, {"stil": len(self.s)}, "FedSMOO")
        replies = [e["stil"] for e in extras]
        clients = self.client_arrays(weight_results, failures)
        new = self.memory.aggregate(clients, self.global_weights, self.num_clients)
        if self.mode != "none":
            self.s = global_perturbation([[a.astype(np.float64) for a in r] for r in replies], self.rho)
        metrics = {
            "smoo_s_norm": float(np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in self.s))),
            "smoo_H_norm": self.memory.norm(),
        }
        return ndarrays_to_parameters(new), metrics


def global_perturbation(replies: list[list[np.ndarray]], rho: float) -> list[np.ndarray]:
    """s = rho * sum_i r_i / ||sum_i r_i|| over the whole vector (zeros for a zero sum), float32."""
    total = [sum(r[i] for r in replies) for i in range(len(replies[0]))]
    norm = float(np.sqrt(sum(float((a**2).sum()) for a in total)))
    scale = rho / norm if norm > 0 else 0.0
    return [(a * scale).astype(np.float32) for a in total]
