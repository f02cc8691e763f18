"""The restricted-softmax hand case shared by tests/methods/test_fedrs.py and
tests/methods/test_fedlc.py: logits z = W x + b, W = 0 (3 x 2), b = ``B0`` = (0, 0, 1); one batch
``X`` (x1 = (1, 0), x2 = (0, 1)) with labels ``Y`` = (0, 1); the client's label ``COUNTS`` (16, 1, 0);
plain SGD lr 0.1, two steps. ``adjusted_round64`` writes the round out in float64 on adjusted
logits, ``hand_round`` runs it through a method's update and ``local_round``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fl_app.registry import get_method
from tasks.functional import Hyper, Round, local_round, module_state
from tasks.models import Classifier

X = np.array([[1.0, 0.0], [0.0, 1.0]])
Y = np.array([0, 1])
COUNTS = np.array([16, 1, 0])
B0 = np.array([0.0, 0.0, 1.0])


def adjusted_round64(scale: np.ndarray, offset: np.ndarray, lr: float = 0.1, steps: int = 2):
    """Softmax regression on the adjusted logits z' = scale * (x W^T + b) - offset, written out
    (dL/dz = scale * (softmax(z') - onehot(y)) / B; an infinite offset gives probability 0):
    (final W, final b, the steps' losses)."""
    W, b, losses = np.zeros((3, 2)), B0.copy(), []
    for _ in range(steps):
        z = scale * (X @ W.T + b) - offset
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        losses.append(float(-np.log(p[np.arange(len(Y)), Y]).mean()))
        p[np.arange(len(Y)), Y] -= 1
        dz = scale * p / len(Y)
        W, b = W - lr * dz.T @ X, b - lr * dz.sum(0)
    return W, b, losses


def hand_model() -> Classifier:
    """The hand case's model in float64: no body, head Linear(2, 3) at W = 0, b = (0, 0, 1)."""
    model = Classifier(nn.Identity(), nn.Linear(2, 3)).double()
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor(B0))
    return model


def hand_round(method: str, keys: dict):
    """The hand case through ``method``'s update and ``local_round`` (counts given as the
    ``prepare`` step leaves them in the round's state)."""
    model = hand_model()
    params, buffers = module_state(model)
    return local_round(Round(get_method(method).update, model, params, buffers, {"label_counts": torch.tensor(COUNTS)},
                       {"buffers": buffers}, Hyper(lr=0.1, keys=keys), torch.tensor(X), torch.tensor(Y), 2, 2,
                       torch.Generator().manual_seed(0)))
