"""Small builders shared by the baseline tests (feddyn, fednova, fedbn, dp-fedavg, ...)."""

from __future__ import annotations

import numpy as np
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters


def fit_res(arrays: list[np.ndarray], num_examples: int, **metrics) -> FitRes:
    return FitRes(
        status=Status(code=Code.OK, message=""),
        parameters=ndarrays_to_parameters([np.asarray(a) for a in arrays]),
        num_examples=num_examples,
        metrics=metrics,
    )


def softmax_regression_grad(x: np.ndarray, y: np.ndarray, W: np.ndarray, b: np.ndarray):
    """Gradient of the mean cross-entropy of logits x W^T + b (closed form)."""
    logits = x @ W.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    p /= len(y)
    return p.T @ x, p.sum(0)
