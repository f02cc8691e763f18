"""FedGELA's server: Flower's FedAvg, the n_k-weighted mean (clients/fedgela.py documents the
method). It refuses, before training, a model whose body has no parameters (``logreg``): FedGELA
trains the body alone against its fixed head, so such a model would have nothing to train."""

from protocol.keys import ConfigError
from strategies.base import MEAN_OF_WEIGHTS, DriftFedAvg
from tasks.datasets import input_shape
from tasks.models import FLAT_MODELS, IMAGE_MODELS, build_model


def trainable_body(name: str, dataset: str) -> bool:
    """Whether model ``name`` for ``dataset`` has a parameter in its body (the head's input)."""
    return any(p.requires_grad for p in build_model(name, input_shape(dataset)).body.parameters())


class FedGELAStrategy(DriftFedAvg):
    """FedAvg's weighted mean, for a model with a body to train."""

    SCREENING = MEAN_OF_WEIGHTS  # FedAvg's weighted mean of weights
    REPLY_SUMS = ()  # Flower's n_k-weighted mean of the weights, nothing else

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        if not trainable_body(cfg["model"], cfg["dataset"]):
            models = FLAT_MODELS if cfg["dataset"] == "synthetic" else IMAGE_MODELS
            valid = ", ".join(n for n in models if trainable_body(n, cfg["dataset"]))
            raise ConfigError(f"run-config key 'model' = {cfg['model']!r} is invalid for strategy 'fedgela': FedGELA"
                              f" trains the model's body against a fixed head and {cfg['model']!r} has no body"
                              f" parameters; valid choices: {valid}")
        return cls(**kwargs)
