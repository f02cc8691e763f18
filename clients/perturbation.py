"""SAM-style weight perturbation for the hook-based SAM step (``FedSAMClient.train_step``, the hook twin
tests/test_functional.py compares ``tasks.functional.FEDSAM`` with).

Every such method does: compute a perturbation eps, move the weights to w + eps, take a
gradient there, and go back to w. Going back is done by copying the saved w, never by
subtracting eps: (w + eps) - eps is not w in floating point, and the drift would accumulate
over thousands of local steps. ``perturbed`` also restores the model's buffers (BatchNorm
running statistics) when given a model, so an extra forward pass at perturbed weights does
not count twice in the running statistics (as SAM/GAM reference code does by disabling them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from tasks.functional.core import NORM_EPS
from tasks.functional.core import sam_eps as _sam_eps

__all__ = ["NORM_EPS", "global_norm", "perturbed", "sam_eps"]


def global_norm(tensors: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """Euclidean norm of the concatenation of ``tensors`` (None entries are skipped), from
    per-tensor norms: no concatenated copy of the whole parameter vector."""
    parts = [t.detach() for t in tensors if t is not None]
    if not parts:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(parts)))


def sam_eps(grads: Sequence[torch.Tensor | None], rho: float) -> list[torch.Tensor | None]:
    """SAM's ascent step eps = rho * g / (||g|| + NORM_EPS) on detached gradients: the one
    definition, ``tasks.functional.core.sam_eps`` (its norm equals ``global_norm`` bit for bit on
    CPU: the same per-tensor kernel)."""
    return _sam_eps([None if g is None else g.detach() for g in grads], rho)


@contextmanager
def perturbed(
    params: Sequence[torch.Tensor],
    eps: Sequence[torch.Tensor | None],
    model: nn.Module | None = None,
) -> Iterator[None]:
    """Inside the block the weights are w + eps; on exit they are exactly w again (by copy).

    ``eps[i] = None`` leaves ``params[i]`` untouched. With ``model``, its buffers (BN running
    statistics) are saved too and restored on exit.
    """
    if len(params) != len(eps):
        raise ValueError(f"{len(params)} parameters but {len(eps)} perturbations")
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
