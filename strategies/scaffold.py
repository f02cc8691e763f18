"""SCAFFOLD (Karimireddy et al. 2020), option II control variates; and the server side of every
SCAFFOLD-style method, written once (``ControlVariateStrategy``: SCAFFOLD, FedPVR, FedGAM-CV; the
client side is ``clients.control_variates``).

Server: n_k-weighted mean of the weights (global step size 1) and
c <- c + (1/D) sum_{i in S_t} delta c_i with D = N, the number of clients in the federation
(``cv-divisor = "total"``, the SCAFFOLD paper), or D = |S_t|, the round's participants
(``cv-divisor = "participants"``, FedGAM-CV's Eq. 22): the option that lets an ablation
separate FedGAM-CV's divisor from its GAM term. Both are the same under full participation.
N is the partition count the client manager learned (``SeededClientManager.num_partitions``),
else the number of connected nodes.

The server holds c (zeros at the start, one array per parameter that carries a control
variate, state_dict order). ``configure_fit`` sends weights + c; each reply is weights +
delta c_i with the same count and shapes (so the server's reply check,
``fl_app.server.recording.check_reply``, holds). It reports ``cv_norm`` = ||c|| (after the
update) as a round metric. The model weights the server evaluates and stores never include c.
"""

from __future__ import annotations

import numpy as np
from flwr.common import Parameters
from flwr.server.client_manager import ClientManager

from protocol.keys import ConfigError, Key
from protocol.layout import cv_names_in_state_order, trainable_param_names
from protocol.traffic import CONTROL_VARIATES
from strategies.arrays import restored_like, send_with_extras, split_replies
from strategies.base import REPLIES_ONLY, DriftFedAvg
from tasks.datasets import input_shape
from tasks.models import build_model
from tasks.optim import linear_step_problem

DIVISORS = ("participants", "total")


class ControlVariateStrategy(DriftFedAvg):
    """FedAvg of the weights plus the server control variate c."""

    TRAFFIC = CONTROL_VARIATES  # c after the weights down, delta_c after them up (protocol.traffic)
    # Which parameters carry control variates: the same function as the names of the method's
    # LocalUpdate arrays (clients.control_variates.control_variate_arrays).
    cv_param_names = staticmethod(trainable_param_names)
    # "participants": D = |S_t| (FedGAM-CV Eq. 22); "total": D = N (SCAFFOLD, FedPVR).
    CV_DIVISOR = "total"
    # the reason its subclasses (each declaring SCREENING = REPLIES_ONLY) refuse median
    SCREENING_WHY = ("the server control variate c is updated by a sum of the clients' delta c_i; "
                     "a median of the weights alone would leave c open to one client")

    def __init__(self, *, cv_shapes: list[tuple], num_state: int, cv_divisor: str = "total", **kwargs):
        super().__init__(**kwargs)
        if cv_divisor not in DIVISORS:
            raise ValueError(f"cv_divisor {cv_divisor!r} is not one of {DIVISORS}")
        self.num_state = num_state
        self.cv_divisor = cv_divisor
        self.c = [np.zeros(s, dtype=np.float32) for s in cv_shapes]
        self.num_total: int | None = None

    @classmethod
    def resolve_config(cls, cfg: dict) -> dict:
        """Refuse an optimiser whose step is not linear in the gradient (Adam, AdamW)."""
        problem = linear_step_problem(cfg["optimizer"], cfg["strategy"])
        if problem:
            raise ConfigError(problem)
        return super().resolve_config(cfg)

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        divisor = cls.divisor(cfg)
        model = build_model(cfg["model"], input_shape(cfg["dataset"]))
        state = model.state_dict()
        names = cv_names_in_state_order(model, cls.cv_param_names(model, cfg))
        return cls(cv_shapes=[tuple(state[n].shape) for n in names], num_state=len(state), cv_divisor=divisor,
                   **kwargs)

    @classmethod
    def divisor(cls, cfg: dict) -> str:
        """D of the c update: the method's own (``CV_DIVISOR``) unless it has a key for it."""
        return cls.CV_DIVISOR

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cv_divisor={self.cv_divisor!r})"

    def get_state(self) -> dict[str, list[np.ndarray]]:
        """Server state for checkpoints (``fl_app/server/checkpoint.py``): c."""
        return {"cv-c": [a.copy() for a in self.c]}

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        if "cv-c" in state:
            self.c = restored_like(state["cv-c"], self.c, np.float32, "c")

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager):
        instructions = super().configure_fit(server_round, parameters, client_manager)
        # after sampling, so a SeededClientManager has learned the partition count
        self.num_total = getattr(client_manager, "num_partitions", None) or client_manager.num_available()
        return send_with_extras(instructions, parameters, {"c": self.c}, self.TRAFFIC.down, self.num_state)

    def aggregate_fit(self, server_round: int, results, failures):
        weight_results, extras = split_replies(results, self.num_state, {"delta_c": len(self.c)}, type(self).__name__)
        deltas = [e["delta_c"] for e in extras]
        parameters, metrics = super().aggregate_fit(server_round, weight_results, failures)
        if parameters is None:
            return parameters, metrics
        divisor = len(deltas) if self.cv_divisor == "participants" else (self.num_total or len(deltas))
        self.c = [
            (c.astype(np.float64) + sum(d[i].astype(np.float64) for d in deltas) / divisor).astype(np.float32)
            for i, c in enumerate(self.c)
        ]
        metrics = dict(metrics or {})
        metrics["cv_norm"] = float(np.sqrt(sum(float((c.astype(np.float64) ** 2).sum()) for c in self.c)))
        return parameters, metrics


class ScaffoldStrategy(ControlVariateStrategy):
    CV_DIVISOR = "total"
    SCREENING = REPLIES_ONLY  # c moves by the clients' delta c_i (SCREENING_WHY)
    CONFIG_KEYS = {
        "cv-divisor": Key("total", choices=DIVISORS),
    }

    @classmethod
    def divisor(cls, cfg: dict) -> str:
        return cfg.get("cv-divisor", cls.CV_DIVISOR)
