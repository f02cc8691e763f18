"""The Strategy of the methods whose server is SCAFFOLD's, written once (SCAFFOLD, FedPVR,
FedGAM-CV subclass it with their keys and scope; FedDC composes the same part,
``strategies.parts.ServerControlVariates``, with FedDyn's): the n_k-weighted mean of the
weights and the server control variate c, which travels after the weights (``c`` down,
``delta_c`` up: ``protocol.traffic``). It reports ``cv_norm`` = ||c|| (after the update) as a
round metric; the model weights the server evaluates and stores never include c. The client
side is ``clients.control_variates``.
"""

from __future__ import annotations

import numpy as np
from flwr.common import Parameters
from flwr.server.client_manager import ClientManager

from protocol.layout import cv_names_in_state_order, trainable_param_names
from protocol.traffic import CONTROL_VARIATES, clients_in
from strategies.arrays import send_with_extras, split_replies, total_clients
from strategies.base import DriftFedAvg
from strategies.parts import ServerControlVariates, refuse_nonlinear_optimiser
from tasks.datasets import input_shape
from tasks.models import build_model


def cv_layout(cfg: dict, select) -> tuple[list[tuple], int]:
    """(the shapes of c, one per parameter ``select(model, cfg)`` names, in state_dict order; the
    number of state arrays) of the run's model."""
    model = build_model(cfg["model"], input_shape(cfg["dataset"]))
    state = model.state_dict()
    names = cv_names_in_state_order(model, select(model, cfg))
    return [tuple(state[n].shape) for n in names], len(state)


class ControlVariateStrategy(DriftFedAvg):
    """FedAvg of the weights plus the server control variate c."""

    TRAFFIC = CONTROL_VARIATES  # c after the weights down, delta_c after them up (protocol.traffic)
    REPLY_SUMS = ("delta_c",)  # the weighted mean and c's sum of delta c_i
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
        self.num_state = num_state
        self.cv = ServerControlVariates(cv_shapes, cv_divisor)
        self.num_total: int | None = None

    @classmethod
    def resolve_config(cls, cfg: dict) -> dict:
        """Refuse an optimiser whose step is not linear in the gradient (Adam, AdamW)."""
        refuse_nonlinear_optimiser(cfg)
        return super().resolve_config(cfg)

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        shapes, num_state = cv_layout(cfg, cls.cv_param_names)
        return cls(cv_shapes=shapes, num_state=num_state, cv_divisor=cls.divisor(cfg), **kwargs)

    @classmethod
    def divisor(cls, cfg: dict) -> str:
        """D of the c update: the method's own (``CV_DIVISOR``) unless it has a key for it."""
        return cls.CV_DIVISOR

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cv_divisor={self.cv.divisor!r})"

    def get_state(self) -> dict[str, list[np.ndarray]]:
        """Server state for checkpoints (``fl_app/server/checkpoint.py``): c."""
        return self.cv.get_state()

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        self.cv.set_state(state)

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager):
        instructions = super().configure_fit(server_round, parameters, client_manager)
        # after sampling, so a SeededClientManager has learned the partition count
        self.num_total = total_clients(client_manager)
        return send_with_extras(instructions, parameters, {"c": self.cv.c}, self.TRAFFIC.down, self.num_state)

    def aggregate_fit(self, server_round: int, results, failures):
        weight_results, extras = split_replies(results, self.num_state, {"delta_c": len(self.cv.c)},
                                               type(self).__name__)
        parameters, metrics = super().aggregate_fit(server_round, weight_results, failures)
        if parameters is None:
            return parameters, metrics
        self.cv.update([e["delta_c"] for e in extras], self.num_total,
                       participants=sum(clients_in(res.metrics) for _, res in results))
        return parameters, {**(metrics or {}), "cv_norm": self.cv.norm()}
