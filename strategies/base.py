"""What every method's strategy shares: construction from the run config and the fit config."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.common import Parameters, parameters_to_ndarrays
from flwr.server.strategy import FedAvg

from protocol.keys import Key
from protocol.layout import trainable_mask as model_trainable_mask
from tasks.datasets import input_shape
from tasks.models import build_model


def fit_config(server_round: int) -> dict:
    """Sent to every client with its fit instruction."""
    return {"server-round": server_round}


def configured_model(cfg: dict):
    """A fresh instance of the configured model (shapes and entry names only; never trained)."""
    return build_model(cfg["model"], input_shape(cfg["dataset"]))


def trainable_mask(cfg: dict) -> list[bool]:
    """For each state_dict entry of the configured model: is it a trainable parameter?"""
    return model_trainable_mask(configured_model(cfg))


def fedavg_kwargs(cfg: dict, initial_parameters: Parameters, evaluate_fn: Callable) -> dict:
    """Keyword arguments of Flower's FedAvg shared by every method.

    Evaluation is centralized (``evaluate_fn`` on the server's test split); with
    ``client-test-fraction`` > 0 every client also scores the global model on its local test
    split (``fraction_evaluate`` 1: all connected clients; the rounds are chosen by
    ``fl_app.server.server.DriftServer.evaluate_on_clients``), else no client is asked.
    """
    return dict(
        fraction_fit=cfg["fraction-fit"],
        fraction_evaluate=1.0 if cfg["client-test-fraction"] > 0 else 0.0,
        min_fit_clients=cfg["min-fit-clients"],
        min_evaluate_clients=1,
        min_available_clients=cfg["min-available-clients"],
        evaluate_fn=evaluate_fn,
        on_fit_config_fn=fit_config,
        accept_failures=True,
        initial_parameters=initial_parameters,
    )


def build_strategy(strategy_cls: type, cfg: dict, initial_parameters: Parameters | None = None,
                   evaluate_fn: Callable | None = None):
    """A method's Flower strategy for ``cfg``: its registered class's ``from_config`` with the
    FedAvg arguments every method shares. A method's own refusals of the config raise here
    (the ServerApp builds the strategy before anything of the run is written)."""
    shared = fedavg_kwargs(cfg, initial_parameters, evaluate_fn)
    return strategy_cls.from_config(cfg, **shared)


REPLIES_ONLY = ("clip", "reject")
"""``SCREENING`` of a server whose aggregation is not a mean of the client weights: the update
screening modes (``fl_app/server/screening.py``) that act on the replies before any aggregation,
so every method can have them."""
MEAN_OF_WEIGHTS = ("clip", "reject", "median", "trimmed-mean")
"""``SCREENING`` of a server whose new model depends on the replies only through their mean (the
mean itself, or a step from w_t towards it): ``median`` and ``trimmed-mean`` replace that mean."""


class FromConfig:
    """Mixin: the run-config keys a method adds, and how to build it from a run config."""

    CONFIG_KEYS: dict[str, Key] = {}
    """The run-config keys the server reads (name -> ``protocol.keys.Key``); a key only the client
    reads goes in the ``keys`` of the method's ``LocalUpdate`` (``clients/<method>.py``), which
    names a key declared here in its ``reads``. ``fl_app.registry.spec`` merges them all."""
    SCREENING: tuple[str, ...] = REPLIES_ONLY
    """The update screening modes the server supports besides ``none``: ``REPLIES_ONLY`` or
    ``MEAN_OF_WEIGHTS`` (or none, ``()``). Every registered strategy class declares it in its own
    body, so that support for ``median`` is a decision, not an inherited default
    (``tests/server/test_screening.py``)."""
    SCREENING_WHY: str = "its aggregation is not a mean of the client weights"
    """Why a screening mode outside ``SCREENING`` is refused (the refusal's one line names it)."""
    REPLY_SUMS: tuple[str, ...] | None = None
    """Whether one reply may stand for several clients (``protocol.traffic``: a cohort node's
    n_k-weighted mean of its clients' weights and sum of their ``up`` groups): the ``up`` groups
    the server sums, ``()`` for none, when its aggregation reads the replies only through the
    n_k-weighted mean of their weights (Flower's FedAvg: ``num_examples`` weighs each reply) and
    the plain sums of those groups, counting clients by ``protocol.traffic.clients_in``; ``None``
    when it needs every client's own reply (a plain mean over clients, a per-client
    normalisation, a rule over each update). Every registered strategy class declares it in its
    own body, as ``SCREENING`` (``tests/server/test_summed_replies.py``)."""
    screen_skip: tuple[int, ...] = ()
    """Positions of state arrays the server does not aggregate (client-local): not screened."""
    UNIFORM_MEAN: bool = False
    """How the server weights client k when it averages the replies: False, p_k = n_k / sum n
    (Flower's FedAvg); True, p_k = 1/K (the plain mean: FedDyn's Algorithm 1, DP-FedAvg's noise
    calibration). The app's drift columns (``fl_app/server/drift.py``) weight clients the same way."""

    @classmethod
    def local_entries(cls, model) -> tuple[int, ...]:
        """Positions (state_dict order of ``model``) of entries that stay on the clients and are
        never aggregated, so the app leaves them out of the drift columns. Default: none."""
        return ()

    @classmethod
    def resolve_config(cls, cfg: dict) -> dict:
        """Adjust a validated config for this method (runs wherever the config is validated:
        runner, ServerApp and ClientApp alike, so all sides agree). Default: unchanged."""
        return cfg

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        """The strategy for the validated run config ``cfg``; ``kwargs``: Flower's FedAvg
        arguments every method shares (``fedavg_kwargs``). A method with keys of its own
        overrides it to read them from ``cfg``."""
        return cls(**kwargs)


class DriftFedAvg(FromConfig, FedAvg):
    """Flower's FedAvg (n_k-weighted mean), buildable from the run config.

    Keeps the round's global weights w_t (``self.global_weights``), which several methods'
    aggregation needs (FedDyn, FedNova, FedBN, FedPGVC).
    """

    global_weights: list[np.ndarray] | None = None
    """w_t: the weights this round's fit instructions carry (set by ``configure_fit``)."""
    SCREENING = MEAN_OF_WEIGHTS  # FedAvg's weighted mean of weights
    REPLY_SUMS = ()  # Flower's n_k-weighted mean of the weights, nothing else

    def configure_fit(self, server_round, parameters, client_manager):
        self.global_weights = parameters_to_ndarrays(parameters)
        return super().configure_fit(server_round, parameters, client_manager)

    def client_arrays(self, results, failures) -> list[list[np.ndarray]] | None:
        """Each result's arrays, or None when this round must not aggregate (FedAvg's rules:
        no results, or failures while ``accept_failures`` is off)."""
        if not results or (failures and not self.accept_failures):
            return None
        return [parameters_to_ndarrays(res.parameters) for _, res in results]
