"""Small builders shared by the baseline tests (feddyn, fednova, fedbn, dp-fedavg, ...)."""

from __future__ import annotations

import numpy as np
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters


def fit_res(arrays: list[np.ndarray], num_examples: int, metrics: dict | None = None, **more) -> FitRes:
    """A successful client reply: its metrics given as a dict or as keyword arguments (not both)."""
    assert metrics is None or not more, "metrics as a dict or as keywords, not both"
    return FitRes(
        status=Status(code=Code.OK, message=""),
        parameters=ndarrays_to_parameters([np.asarray(a) for a in arrays]),
        num_examples=num_examples,
        metrics=more if metrics is None else metrics,
    )


def softmax_regression_grad(x: np.ndarray, y: np.ndarray, W: np.ndarray, b: np.ndarray):
    """Gradient of the mean cross-entropy of logits x W^T + b (closed form)."""
    logits = x @ W.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    p /= len(y)
    return p.T @ x, p.sum(0)


def softmax_regression_loss(x: np.ndarray, y: np.ndarray, W: np.ndarray, b: np.ndarray) -> float:
    """Mean cross-entropy of logits x W^T + b."""
    z = x @ W.T + b
    z = z - z.max(1, keepdims=True)
    return float((np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]).mean())


def client_batches(client, server_round: int) -> list[np.ndarray]:
    """The sample indices of each local step ``client`` takes in ``server_round``: its batch
    order (its generator for the round, its batch size and epochs, the model's smallest batch)."""
    from tasks.functional.rounds import batch_schedule
    from tasks.train import min_train_batch

    n = len(client.data[0])
    schedule = batch_schedule([n], client.cfg["batch-size"], client.cfg["local-epochs"],
                              [client.round_generator(server_round)], min_train_batch(client.model))
    return [idx.numpy() for idx in schedule[0]]


def sgd_round64(w_t: list[np.ndarray], order: list[np.ndarray], direction, lr: float, momentum: float = 0.0,
                weight_decay: float = 0.0) -> tuple[list[np.ndarray], float, int]:
    """One client's round in float64 with ``torch.optim.SGD``'s rule, written out: at each step
    d = ``direction(w, idx)`` (a list like w; ``idx`` the step's sample indices, also returning
    the loss at w), d += weight_decay w, buf = d at the first step else momentum buf + d,
    w -= lr buf. Returns (the final w, the mean of the steps' losses, the number of steps)."""
    w = [a.astype(np.float64) for a in w_t]
    bufs, losses = None, []
    for idx in order:
        d, loss = direction(w, idx)
        d = [di + weight_decay * wi for di, wi in zip(d, w)]
        bufs = d if bufs is None else [momentum * bi + di for bi, di in zip(bufs, d)]
        w = [wi - lr * bi for wi, bi in zip(w, bufs)]
        losses.append(loss)
    return w, float(np.mean(losses)), len(order)
