"""The module-based local training the clients ran before every method became a functional
``LocalUpdate``, kept here (and only here) as an independent reference for the tests: the
weights live in one ``nn.Module``, a step fills ``.grad`` (and may edit it), ``torch.optim``
applies it in place; a SAM-style step moves the weights to w + eps in place and restores them
by copy (``perturbed``). The functional updates give these numbers bit for bit on CPU (the same
autograd kernels and the same tensor operations, in the same order)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from tasks.models import get_weights, set_weights
from tasks.optim import build_optimizer


def foreach_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Euclidean norm of the concatenation of ``tensors``, from per-tensor norms."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm([t.detach() for t in tensors])))


def module_sam_eps(grads: Sequence[torch.Tensor], rho: float) -> list[torch.Tensor]:
    """SAM's ascent step rho g / (||g|| + 1e-12) on detached gradients."""
    scale = rho / (foreach_norm(grads) + 1e-12)
    return [g.detach() * scale for g in grads]


@contextmanager
def perturbed(params: Sequence[torch.Tensor], eps: Sequence[torch.Tensor | None],
              model: nn.Module | None = None) -> Iterator[None]:
    """Inside the block the weights are w + eps (``None``: that weight untouched); on exit they
    are exactly w again, by copy (never by subtracting eps: (w + eps) - eps is not w in floating
    point), and with ``model`` its buffers (BN running statistics) are restored too."""
    saved = [(p, p.detach().clone()) for p, e in zip(params, eps) if e is not None]
    buffers = [(b, b.detach().clone()) for b in model.buffers()] if model is not None else []
    try:
        with torch.no_grad():
            for p, e in zip(params, eps):
                if e is not None:
                    p.add_(e)
        yield
    finally:
        with torch.no_grad():
            for p, w in saved:
                p.copy_(w)
            for b, v in buffers:
                b.copy_(v)


def frozen(model: nn.Module) -> nn.Module:
    """An eval-mode copy of ``model`` with its weights and buffers, no gradients."""
    copy_ = copy.deepcopy(model).eval()
    for p in copy_.parameters():
        p.requires_grad_(False)
    return copy_


def module_fit(model: nn.Module, weights: list[np.ndarray], x: torch.Tensor, y: torch.Tensor,
               order: list[np.ndarray], cfg: dict, lr: float,
               step: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[list[np.ndarray], dict]:
    """One client's round as the module-based clients ran it: ``weights`` loaded into ``model``
    (training mode), a fresh ``torch.optim`` optimiser of the run (``cfg``) at ``lr``, and at each
    step (``order``: its sample indices) ``step(model, xb, yb)`` fills ``.grad`` and returns the
    batch loss, then the optimiser steps. Returns (the final weights, {train_loss, num_steps})."""
    set_weights(model, weights)
    model.train()
    optimizer = build_optimizer(list(model.parameters()), cfg, lr)
    loss_sum = torch.zeros(())
    for idx in order:
        optimizer.zero_grad(set_to_none=True)
        loss_sum += step(model, x[torch.as_tensor(idx)], y[torch.as_tensor(idx)])
        optimizer.step()
    return get_weights(model), {"train_loss": loss_sum.item() / max(len(order), 1), "num_steps": len(order)}


def module_round(step: Callable, model: nn.Module, x: torch.Tensor, y: torch.Tensor, hp, batch_size: int,
                 epochs: int, seed: int, ctx) -> float:
    """The module-based loop: batches in a seeded random order each epoch, ``step(model, xb, yb,
    hp.keys, ctx)`` fills ``.grad`` (and may correct it) and returns the batch loss, then
    ``torch.optim.SGD`` steps in place; the mean batch loss."""
    opt = torch.optim.SGD(model.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    loss_sum, steps = torch.zeros(()), 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), batch_size):
            xb, yb = x[order[start:start + batch_size]], y[order[start:start + batch_size]]
            opt.zero_grad(set_to_none=True)
            loss_sum += step(model, xb, yb, hp.keys, ctx)
            opt.step()
            steps += 1
    return loss_sum.item() / steps
