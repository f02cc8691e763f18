"""Server optimisers (FedAvgM; FedAdam, FedYogi, FedAdagrad of Reddi et al., ICLR 2021) as
fl-drift methods: Flower's own strategies, unchanged maths, built from the run config.

Each of them treats Delta_t = mean_k(w_k) - w_t (the n_k-weighted mean, Flower's FedAvg) as a
pseudo-gradient and steps the global model with a server optimiser; the clients run FedAvg's
local update (``clients.fedavg.UPDATE``). What this module adds around Flower's classes:

- ``get_state`` / ``set_state``: the optimiser's state (FedAvgM's momentum vector, FedOpt's
  m_t and v_t) goes into the checkpoint, so a resumed run continues the same optimiser (Flower's
  FedAvgM asserts that its momentum exists from round 2 on: without it a resume would crash).
- ``configure_fit`` re-reads the global model w_t from what the server sends: Flower's
  classes keep their own copy of it (FedOpt's ``current_weights``, FedAvgM's
  ``initial_parameters``). In a plain run both are the same arrays; after the server discards a
  non-finite aggregate (``fl_app/server/recording.py``) or on resume only the model sent is right.
"""

from __future__ import annotations

import numpy as np
from flwr.common import Parameters, ndarrays_to_parameters, parameters_to_ndarrays

from protocol.keys import Key, positive
from strategies.base import FromConfig

# The global learning rate eta_g of FedAvgM and FedPGVC (one declaration, fl_app/registry.py):
# both step w <- w - eta_g * (w - mean_k w_k) (FedAvgM on its momentum), 1 = the plain mean.
SERVER_LR = Key(1.0, positive, "> 0 (global learning rate eta_g; 1 = plain mean)")

# FedAdam, FedYogi and FedAdagrad share these. Defaults: beta_1 = 0.9, beta_2 = 0.99 and
# tau = 1e-3 (Reddi et al.'s settings); eta = 0.01 (Flower's FedYogi default; their grids put
# the best server lr of the adaptive methods near 1e-2 to 1e-1.5).
FEDOPT_KEYS = {
    "fedopt-eta": Key(0.01, positive, "> 0 (server learning rate eta of FedAdam/FedYogi/FedAdagrad)"),
    "fedopt-beta-1": Key(0.9, lambda v: 0 <= v < 1, "in [0, 1) (first-moment decay beta_1)"),
    "fedopt-beta-2": Key(0.99, lambda v: 0 <= v < 1, "in [0, 1) (second-moment decay beta_2)"),
    "fedopt-tau": Key(1e-3, positive, "> 0 (adaptivity tau: added to sqrt(v_t))"),
}


class ServerOptimiser(FromConfig):
    """Mixin for a Flower server-optimiser strategy: checkpointed state, w_t kept in sync.

    ``STATE`` names the attributes (lists of arrays, or None before the first round) that
    carry the optimiser's state between rounds.
    """

    STATE: tuple[str, ...] = ()

    def get_state(self) -> dict[str, list[np.ndarray]]:
        return {name: [np.array(a) for a in getattr(self, name)] for name in self.STATE
                if getattr(self, name) is not None}

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        for name in self.STATE:
            if name in state:
                setattr(self, name, [np.array(a) for a in state[name]])

    def sync_global_model(self, parameters: Parameters) -> None:
        """Point the Flower class's own copy of w_t at the model the server sends."""
        raise NotImplementedError

    def configure_fit(self, server_round, parameters, client_manager):
        self.sync_global_model(parameters)
        return super().configure_fit(server_round, parameters, client_manager)


class FedOptFromConfig(ServerOptimiser):
    """FedAdam, FedYogi (Flower's ``FedOpt`` subclasses): eta, beta_1, beta_2, tau from the run
    config; the client learning rate is passed as Flower's ``eta_l`` (which it only stores)."""

    CONFIG_KEYS = FEDOPT_KEYS
    STATE = ("m_t", "v_t")
    # run-config key -> keyword of Flower's constructor
    KWARGS = {"fedopt-eta": "eta", "fedopt-beta-1": "beta_1", "fedopt-beta-2": "beta_2", "fedopt-tau": "tau"}

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        optimiser = {kw: cfg[key] for key, kw in cls.KWARGS.items() if key in cls.CONFIG_KEYS}
        if kwargs.get("initial_parameters") is None:
            # A build that only checks the config (run_simulation.py) has no model yet, and
            # Flower's FedOpt requires one; configure_fit sets w_t before every step anyway.
            kwargs["initial_parameters"] = ndarrays_to_parameters([])
        return cls(eta_l=cfg["learning-rate"], **optimiser, **kwargs)

    def sync_global_model(self, parameters: Parameters) -> None:
        self.current_weights = parameters_to_ndarrays(parameters)
