"""Loops shared by every method: mini-batches and evaluation."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator, min_size: int = 1
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One shuffled epoch of mini-batches; the order is fixed by ``generator``. A last batch
    of fewer than ``min_size`` samples is skipped (``min_train_batch``); the permutation is
    drawn in full either way, so the generator's stream does not depend on it."""
    order = torch.randperm(len(x), generator=generator)
    for start in range(0, len(x), batch_size):
        idx = order[start : start + batch_size]
        if len(idx) >= min_size:
            yield x[idx], y[idx]


def min_train_batch(model: nn.Module) -> int:
    """The smallest batch ``model`` can train on: 2 when it has a ``BatchNorm1d`` layer (after
    a Linear layer it sees one value per channel on a batch of one sample, and PyTorch raises
    'Expected more than 1 value per channel when training': a client whose data size was one
    more than a multiple of the batch size failed every round, lenet-bn on MNIST Dir(0.5)),
    else 1. ``BatchNorm2d`` after a convolution still has the image's pixels per channel, so
    conv-only BN models (cnn-bn, resnet18-bn) skip nothing, and neither does any model without
    BatchNorm. The skipped sample is a different one each epoch (the order is reshuffled)."""
    return 2 if any(isinstance(m, nn.BatchNorm1d) for m in model.modules()) else 1


@torch.no_grad()
def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None,
    per_class: bool = False,
):
    """Mean cross-entropy and accuracy of ``model`` on (x, y), on the model's device.

    With ``per_class`` it also returns each class's accuracy (numpy float64, one entry per
    logit; NaN for a class absent from ``y``), counted with ``bincount`` on the predictions
    already made, so it costs two small kernels per batch.

    Default batch: 1024 on a GPU; 128 on CPU, where larger batches spill the activations out
    of cache and evaluate more slowly (docs/performance.md, "What the code does for speed").
    """
    device = next(model.parameters()).device
    if batch_size is None:
        batch_size = 128 if device.type == "cpu" else 1024
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    hits = seen = None
    for start in range(0, len(x), batch_size):
        xb = x[start : start + batch_size].to(device, non_blocking=True)
        yb = y[start : start + batch_size].to(device, non_blocking=True)
        logits = model(xb)
        loss_sum += F.cross_entropy(logits, yb, reduction="sum")
        right = logits.argmax(1) == yb
        correct += right.sum()
        if per_class:
            if hits is None:
                hits = torch.zeros(logits.shape[1], device=device, dtype=torch.long)
                seen = torch.zeros_like(hits)
            seen += torch.bincount(yb, minlength=logits.shape[1])
            hits += torch.bincount(yb[right], minlength=logits.shape[1])
    model.train(was_training)
    n = max(len(x), 1)
    if not per_class:
        return loss_sum.item() / n, correct.item() / n
    if hits is None:
        return loss_sum.item() / n, correct.item() / n, np.zeros(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        classes = hits.cpu().numpy() / seen.cpu().numpy().astype(np.float64)
    return loss_sum.item() / n, correct.item() / n, classes


def accuracy_spread(accuracies) -> tuple[float, float, float, int]:
    """(mean, std, worst 10%, n) of per-client accuracies: the unweighted mean and population
    std over the clients (every client is scored: not a sample), and the mean of the worst 10%
    (the ceil(n / 10) lowest, at least one client). Non-finite values are left out; NaNs and
    n = 0 when none is left. The one definition of the clients' spread, for the clients' own
    local test splits (``fl_app.server.recording``) and for their label mixes
    (``runner.results.clientmix``)."""
    values = np.sort(np.asarray([a for a in accuracies if math.isfinite(a)], dtype=float))
    if values.size == 0:
        return math.nan, math.nan, math.nan, 0
    worst = values[: max(1, math.ceil(values.size / 10))]
    return float(values.mean()), float(values.std()), float(worst.mean()), int(values.size)


@functools.lru_cache(maxsize=16)
def min_batch_of(model_name: str, dataset: str) -> int:
    """``min_train_batch`` of model ``model_name`` built for ``dataset``: the fewest examples a
    client of a run with that model must have (``tasks.partitioning.check_data``)."""
    from tasks.datasets import input_shape
    from tasks.models import build_model

    return min_train_batch(build_model(model_name, input_shape(dataset)))
