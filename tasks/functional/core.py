"""The pieces every functional local update shares: hyper-parameters, the loss and its
gradient through ``torch.func``, norms over a dict of tensors."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value

Tree = dict[str, torch.Tensor]

# Added to every norm in a denominator (FedSOL's 1e-12; GAM's perturb_eps): the one value, for
# every local update of tasks.functional.
NORM_EPS = 1e-12


@dataclass(frozen=True)
class Hyper:
    """What a local update reads besides tensors: the round's learning rate, the optimiser
    (``tasks.optim``'s keys: ``sgd`` with ``momentum`` and ``weight_decay``, ``adam``,
    ``adamw``) and the method's own keys (``keys``, e.g. ``{"proximal-mu": 0.01}``)."""

    lr: float
    optimizer: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    keys: Mapping[str, float] = field(default_factory=dict)
    # Set by ``cohort_round`` for K > 1: the step runs inside ``vmap`` (``grad_and_loss``).
    vmapped: bool = False

    @classmethod
    def from_config(cls, cfg: Mapping, lr: float, key_names: Iterable[str] = ()) -> Hyper:
        """The run config's optimiser keys and the method keys ``key_names``, at rate ``lr``."""
        return cls(lr=float(lr), optimizer=cfg["optimizer"], momentum=float(cfg["momentum"]),
                   weight_decay=float(cfg["weight-decay"]), keys={k: cfg[k] for k in key_names})


def module_state(model: nn.Module) -> tuple[Tree, Tree]:
    """(parameters, buffers) of ``model`` as detached copies, each in its own memory layout
    (a channels-last weight stays channels-last, so the convolutions run the same kernels as
    the module's own forward)."""
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    return params, buffers


def cross_entropy(model: nn.Module, params: Tree, buffers: Tree, x: torch.Tensor,
                  y: torch.Tensor) -> tuple[torch.Tensor, Tree]:
    """(mean cross-entropy of ``model`` at ``params`` on (x, y), the buffers after the pass).

    BatchNorm in training mode writes its running statistics in place: into fresh copies of
    ``buffers`` here, returned as the new buffers, so the inputs are never mutated (and vmap
    sees per-client outputs, not writes into a shared tensor).
    """
    new_buffers = {n: b.clone() for n, b in buffers.items()}
    return F.cross_entropy(functional_call(model, (params, new_buffers), (x,)), y), new_buffers


def grad_and_loss(model: nn.Module, params: Tree, buffers: Tree, x: torch.Tensor, y: torch.Tensor,
                  hp: Hyper) -> tuple[Tree, torch.Tensor, Tree]:
    """(gradient of the batch loss with respect to every parameter, the loss, new buffers).

    Inside a cohort's vmap (``hp.vmapped``) through ``torch.func.grad_and_value``, which vmap
    batches. Otherwise through ``torch.autograd.grad`` on fresh leaf copies of ``params``: the
    same autograd kernels (on CPU bit-identical to ``.grad`` of the module-based client,
    tests/test_functional.py), without functorch's per-call wrapping (on the H100 a ``cnn``
    step at batch 50 took 2.6 ms through ``torch.func.grad``, 1.9 ms this way and 1.7-1.9 ms as
    the module's ``backward``). Neither writes into ``params`` or keeps state.
    """
    if hp.vmapped:
        def objective(p: Tree) -> tuple[torch.Tensor, Tree]:
            return cross_entropy(model, p, buffers, x, y)

        grads, (loss, new_buffers) = grad_and_value(objective, has_aux=True)(params)
        return grads, loss.detach(), new_buffers
    leaves = {n: p.detach().requires_grad_() for n, p in params.items()}
    loss, new_buffers = cross_entropy(model, leaves, buffers, x, y)
    grads = torch.autograd.grad(loss, tuple(leaves.values()), allow_unused=True, materialize_grads=True)
    return dict(zip(leaves, grads)), loss.detach(), new_buffers


def keep_layout(new: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``new`` with the strides of ``like`` (a copy only where they differ). An elementwise op
    may hand a channels-last weight with one input channel (``cnn``'s first convolution) back
    with other strides, which makes the next convolution pick another kernel and round
    differently from the module whose weights are updated in place; the cohort's contiguous
    weights never differ."""
    if new.stride() == like.stride():
        return new
    return torch.empty_strided(like.size(), like.stride(), dtype=like.dtype, device=like.device).copy_(new)


def sam_eps(grads: Iterable[torch.Tensor | None], rho: float) -> list[torch.Tensor | None]:
    """SAM's ascent step, the one definition of it: eps = rho g / (||g|| + NORM_EPS), the norm over
    all of ``grads`` (None entries skipped, and None in the result). Every SAM-style update uses
    it (FedSAM, FedGAM, FedSMOO). Plain tensor ops, so vmap batches it."""
    grads = list(grads)
    present = [g for g in grads if g is not None]
    if not present:
        return [None] * len(grads)
    scale = rho / (tree_norm(present) + NORM_EPS)
    return [None if g is None else g * scale for g in grads]


def tree_norm(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """Euclidean norm of the concatenation of ``tensors``, as the norm of the per-tensor norms
    (the value ``torch.linalg.vector_norm`` of ``torch._foreach_norm``'s norms gives, which on
    CPU runs this same per-tensor kernel; written with plain ops so vmap batches it)."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in tensors]))
