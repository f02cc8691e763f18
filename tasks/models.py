"""The papers' models, selectable by name and sized from the dataset.

Every model is ``body`` (input -> representation vector) followed by ``head`` (the
classifier, the last Linear layer). Methods that need the representation (MOON) call
``model.body``; methods that treat the head specially (FedSOL, FedPGVC, FedPVR) find it as
``model.head``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class InputShape:
    channels: int  # 0 for flat feature vectors
    size: int  # image side, or the feature dimension for flat inputs
    classes: int


class Classifier(nn.Module):
    """body -> head; forward returns logits."""

    def __init__(self, body: nn.Module, head: nn.Linear):
        super().__init__()
        self.body = body
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _cnn(shape: InputShape, width: tuple[int, int] = (32, 64), hidden: int = 512, bn: bool = False) -> Classifier:
    """McMahan et al. (2017) CNN: two 5x5 conv (32, 64) + 2x2 pool, FC 512, head.

    'same' padding, so MNIST flattens 64*7*7 = 3136 and CIFAR 64*8*8 = 4096 (METHODS.md).
    """
    c1, c2 = width
    norm = (lambda c: nn.BatchNorm2d(c)) if bn else (lambda c: nn.Identity())
    flat = c2 * (shape.size // 4) ** 2
    body = nn.Sequential(
        nn.Conv2d(shape.channels, c1, 5, padding=2), norm(c1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2), norm(c2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, hidden), nn.ReLU(),
    )
    return Classifier(body, nn.Linear(hidden, shape.classes))


def _cnn_small(shape: InputShape) -> Classifier:
    """RI-FedAvg Architecture 2: one 5x5 conv with 16 filters + pool, FC 128, head."""
    flat = 16 * (shape.size // 2) ** 2
    body = nn.Sequential(
        nn.Conv2d(shape.channels, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(),
    )
    return Classifier(body, nn.Linear(128, shape.classes))


def _lenet(shape: InputShape) -> Classifier:
    """LeNet-5 (FedPGVC / FedGAM MNIST): conv 6, conv 16, FC 120, FC 84, head.

    28x28 inputs get padding 2 on the first conv so both sizes end at 16 x 5 x 5.
    """
    pad = 2 if shape.size == 28 else 0
    body = nn.Sequential(
        nn.Conv2d(shape.channels, 6, 5, padding=pad), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
    )
    return Classifier(body, nn.Linear(84, shape.classes))


def _mlp(shape: InputShape) -> Classifier:
    body = nn.Sequential(nn.Flatten(), nn.Linear(shape.size, 64), nn.ReLU())
    return Classifier(body, nn.Linear(64, shape.classes))


def _logreg(shape: InputShape) -> Classifier:
    """Multinomial logistic regression (the FedProx paper's synthetic-data model)."""
    return Classifier(nn.Flatten(), nn.Linear(shape.size, shape.classes))


BUILDERS = {
    "cnn": _cnn,
    "cnn-small": _cnn_small,
    "lenet": _lenet,
    "cnn-bn": lambda s: _cnn(s, bn=True),
    "mlp": _mlp,
    "logreg": _logreg,
}


def build_model(name: str, shape: InputShape, seed: int | None = None) -> Classifier:
    """Build a fresh model; with ``seed`` its initial weights are reproducible.

    Models with convolutions keep their weights channels-last (NHWC): on CPU, PyTorch then
    runs its convolutions through oneDNN's NHWC kernels, measured 1.3-1.5x faster per
    training step and 1.8x per forward than the default layout (docs/performance.md). The
    values and shapes are the same; ``get_weights`` hands out ordinary C-ordered arrays.
    """
    if name not in BUILDERS:
        raise ValueError(f"unknown model {name!r}; valid choices: {', '.join(BUILDERS)}")
    if seed is None:
        model = BUILDERS[name](shape)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = BUILDERS[name](shape)
    if any(isinstance(m, nn.Conv2d) for m in model.modules()):
        model = model.to(memory_format=torch.channels_last)
    return model


def parametrised_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules that own parameters directly (Conv, Linear, BN), in forward order."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if any(True for _ in m.parameters(recurse=False))
    ]


def last_layers_param_names(model: nn.Module, n_layers: int, kind: type = nn.Linear) -> list[str]:
    """Names of the parameters of the last ``n_layers`` layers of type ``kind``."""
    layers = [(n, m) for n, m in parametrised_layers(model) if isinstance(m, kind)]
    if not 1 <= n_layers <= len(layers):
        raise ValueError(
            f"asked for the last {n_layers} {kind.__name__} layers; the model has {len(layers)}"
        )
    names = []
    for layer_name, module in layers[-n_layers:]:
        names += [f"{layer_name}.{p}" for p, _ in module.named_parameters(recurse=False)]
    return names


def default_device() -> torch.device:
    """CUDA when present, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def get_weights(model: nn.Module) -> list:
    """Model state (parameters and buffers, in state_dict order) as numpy arrays.

    Copies: the arrays must not alias a model that is trained again later in this process.
    """
    return [t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format).numpy()
            for t in model.state_dict().values()]


def set_weights(model: nn.Module, arrays: list) -> None:
    """Load numpy arrays in state_dict order, checking count and shapes first."""
    state = model.state_dict()
    if len(arrays) != len(state):
        raise ValueError(f"got {len(arrays)} arrays for a model with {len(state)} state entries")
    new = {}
    for (name, ref), arr in zip(state.items(), arrays):
        if tuple(arr.shape) != tuple(ref.shape):
            raise ValueError(f"array for {name!r} has shape {arr.shape}, expected {tuple(ref.shape)}")
        new[name] = torch.as_tensor(arr, dtype=ref.dtype)
    model.load_state_dict(new, strict=True)
