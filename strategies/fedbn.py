"""FedBN (Li et al. 2021): everything but batch norm is averaged (n_k-weighted mean).

BN entries (parameters and running statistics) are client-local (see clients/fedbn.py).
The server never averages them into what it sends: the BN entries of the global model
stay at their initial values, so no client's BN state reaches another client (a client
joining late starts from the initial BN). Centralized test evaluation needs some BN
state; it uses the n_k-weighted mean of the round's client BN entries, for evaluation
only (never sent). Requires a model with BN layers: a model without BN (``cnn`` included)
is refused with a message naming its BN twin, never swapped silently, so a comparison that
says "the same model" runs the same model (set ``model = "cnn-bn"`` or ``"resnet18-bn"`` for FedBN, e.g. in an
experiment file's ``[methods.fedbn]``).
"""

from __future__ import annotations

import numpy as np
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from protocol.keys import ConfigError
from protocol.layout import bn_indices
from strategies.arrays import cast_like
from strategies.base import MEAN_OF_WEIGHTS, DriftFedAvg
from tasks.datasets import input_shape
from tasks.models import MODELS, build_model, probe_shape

# models without BN whose BN twin (named "<model>-bn") the refusal names
BN_VARIANT = {name[: -len("-bn")]: name for name in MODELS if name.endswith("-bn") and name[: -len("-bn")] in MODELS}


class FedBNStrategy(DriftFedAvg):
    """FedAvg on non-BN entries; BN entries of the sent model never change."""

    SCREENING = MEAN_OF_WEIGHTS  # the weighted mean of the non-BN entries (BN entries: screen_skip)
    REPLY_SUMS = ()  # the n_k-weighted mean (its BN part kept for evaluation only)

    def __init__(self, *, bn: list[int], **kwargs):
        super().__init__(**kwargs)
        self.bn = bn
        self.screen_skip = tuple(bn)  # BN entries are client-local: discarded, so not screened
        self.eval_bn: dict[int, np.ndarray] = {}

    @classmethod
    def local_entries(cls, model) -> tuple[int, ...]:
        """Every BN entry (parameters and running statistics) stays on the clients."""
        return tuple(bn_indices(model))

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        bn = bn_indices(build_model(cfg["model"], input_shape(cfg["dataset"])))
        if not bn and cfg["model"] in BN_VARIANT:
            twin = BN_VARIANT[cfg["model"]]
            raise ConfigError(
                f"run-config key 'model' = {cfg['model']!r} is invalid for strategy 'fedbn': FedBN"
                f" needs batch-norm layers and {cfg['model']!r} has none; set model = {twin!r} (the"
                f" {cfg['model']!r} with BatchNorm) for FedBN, e.g. --set model={twin} or"
                f" [methods.fedbn] model = {twin!r} in an experiment file"
            )
        if not bn:
            bn_models = ", ".join(n for n in MODELS if bn_indices(build_model(n, probe_shape(n))))
            raise ConfigError(
                f"run-config key 'model' = {cfg['model']!r} is invalid for strategy 'fedbn':"
                f" FedBN needs a model with batch-norm layers; valid choices: {bn_models}"
                " (with an image dataset)"
            )
        return cls(bn=bn, **kwargs)

    def get_state(self) -> dict[str, list[np.ndarray]]:
        """For checkpoints: the evaluation-only mean of the last round's client BN entries."""
        return {"fedbn-eval-bn": [self.eval_bn[i] for i in self.bn]} if self.eval_bn else {}

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        if "fedbn-eval-bn" in state:
            self.eval_bn = dict(zip(self.bn, state["fedbn-eval-bn"]))

    def aggregate_fit(self, server_round, results, failures):
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        if parameters is None:
            return parameters, metrics
        averaged = parameters_to_ndarrays(parameters)
        new = list(averaged)
        self.eval_bn = {}
        for i in self.bn:
            ref = self.global_weights[i]
            self.eval_bn[i] = cast_like(averaged[i], ref)
            new[i] = ref  # BN stays local: the sent BN entries never change
        return ndarrays_to_parameters(new), metrics

    def evaluate(self, server_round, parameters):
        if self.eval_bn:
            arrays = parameters_to_ndarrays(parameters)
            for i, value in self.eval_bn.items():
                arrays[i] = value
            parameters = ndarrays_to_parameters(arrays)
        return super().evaluate(server_round, parameters)
