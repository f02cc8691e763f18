"""The pieces the methods' step functions share (each method's own maths is in
``clients/<method>.py``): hyper-parameters (``Hyper``), the loss and its gradient through
``torch.func`` (``grad_and_loss``; ``value_grads`` for several objectives from one forward
pass), a submodule's forward at given weights (``call_part``; in eval mode without a graph,
``eval_forward``, and the whole model's logits, ``eval_logits``), perturbed weights and SAM's
ascent step (``perturbed_copy``, ``sam_step``, ``sam_eps``), and arithmetic over dicts of
tensors (``clone_tree``, ``submodule_state``, ``tree_norm``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vjp

Tree = dict[str, torch.Tensor]

# Added to every norm in a denominator (FedSOL's 1e-12; GAM's perturb_eps): the one value, for
# every local update of tasks.functional.
NORM_EPS = 1e-12
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def value_grads(objective: Callable[[Tree], tuple[tuple[torch.Tensor, ...], Tree]], params: Tree, hp: Hyper,
                wrt: Sequence[Sequence[str]] | None = None) -> tuple[list[Tree], Tree, list[torch.Tensor]]:
    """(the gradient of each scalar objective, the aux output, the objectives' values) from ONE
    forward pass, in ``grad_and_loss``'s order: ``objective(p) -> ((v_0, v_1, ...), aux)``;
    ``wrt[i]`` names the parameters v_i is differentiated by (default: every parameter, for each
    value).

    ``core.grad_and_loss`` generalised to any objective and several values (FedPGVC's penalty on
    the masked layers beside the mean loss on all): inside a cohort's vmap (``hp.vmapped``)
    through ``torch.func.vjp``, one backward per value with that value's cotangent 1 and the
    others' 0; otherwise through ``torch.autograd.grad`` on fresh leaf copies of ``params``, the
    kernels ``backward()`` runs (bit-identical to a module's ``backward()`` on CPU). ``params`` is not
    written; unused parameters get zero gradients.
    """
    if hp.vmapped:
        values, pullback, aux = vjp(objective, params, has_aux=True)
        wrt = [list(params)] * len(values) if wrt is None else wrt
        grads = []
        for i, names in enumerate(wrt):
            cotangent = tuple(torch.ones_like(v) if j == i else torch.zeros_like(v) for j, v in enumerate(values))
            (g,) = pullback(cotangent)
            grads.append({n: g[n] for n in names})
        return grads, aux, [v.detach() for v in values]
    leaves = {n: p.detach().requires_grad_() for n, p in params.items()}
    values, aux = objective(leaves)
    wrt = [list(params)] * len(values) if wrt is None else wrt
    grads = []
    for i, (value, names) in enumerate(zip(values, wrt)):
        g = torch.autograd.grad(value, [leaves[n] for n in names], retain_graph=i < len(values) - 1,
                                allow_unused=True, materialize_grads=True)
        grads.append(dict(zip(names, g)))
    return grads, aux, [v.detach() for v in values]


def submodule_state(tree: Tree, prefix: str) -> Tree:
    """The entries of ``tree`` under submodule ``prefix`` (``"body"``), keys without it: the
    dict ``functional_call`` takes for that submodule. The tensors are the same objects."""
    head = prefix + "."
    return {n[len(head):]: t for n, t in tree.items() if n.startswith(head)}


def call_part(model: nn.Module, part: str, params: Tree, buffers: Tree, x: torch.Tensor,
              strict: bool = False) -> torch.Tensor:
    """``model.<part>`` (``body`` or ``head``) on ``x`` at the given weights and buffers (full-model
    names); BatchNorm in training mode writes its statistics into ``buffers``' tensors."""
    return functional_call(getattr(model, part), (submodule_state(params, part), submodule_state(buffers, part)),
                           (x,), strict=strict)


def eval_forward(model: nn.Module, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``fn()`` (a ``functional_call`` on ``model``) with the skeleton in eval mode and no
    gradient, the mode restored after: a frozen model's output, as an eval-mode frozen copy of
    the module gives it (BatchNorm on its running statistics, which it does not update)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return fn()
    finally:
        model.train(was_training)


def eval_logits(model: nn.Module, params: Tree, buffers: Tree, x: torch.Tensor) -> torch.Tensor:
    """``eval_forward`` of the whole model: its logits at (params, buffers) in eval mode
    (BatchNorm on its running statistics), without a graph (a frozen global model's)."""
    return eval_forward(model, lambda: functional_call(model, (params, buffers), (x,), strict=True))


def clone_tree(tree: Tree) -> Tree:
    return {n: t.clone() for n, t in tree.items()}


def perturbed_copy(params: Tree, eps: Tree) -> Tree:
    """w + eps as new tensors, each in the memory layout of its weight (``keep_layout``);
    a parameter without an entry in ``eps`` is passed through unchanged."""
    return {n: keep_layout(p + eps[n], p) if n in eps else p for n, p in params.items()}


def sam_step(grads: Tree, rho: float) -> Tree:
    """``core.sam_eps`` on a tree: rho g / (||g|| + NORM_EPS)."""
    return dict(zip(grads, sam_eps(grads.values(), rho)))


@dataclass(frozen=True)
class Hyper:
    """What a local update reads besides tensors: the round's learning rate, the optimiser
    (``tasks.optim``'s keys: ``sgd`` with ``momentum`` and ``weight_decay``, ``adam``,
    ``adamw``), the run-wide clip of each step's direction (``clip_norm``, run-config
    ``local-clip-norm``, 0 = off; ``tasks.functional.rounds.make_step``) and the method's own
    keys (``keys``, e.g. ``{"proximal-mu": 0.01}``)."""

    lr: float
    optimizer: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    keys: Mapping[str, float] = field(default_factory=dict)
    # Set by ``cohort_round`` for K > 1: the step runs inside ``vmap`` (``grad_and_loss``).
    vmapped: bool = False

    @classmethod
    def from_config(cls, cfg: Mapping, lr: float, key_names: Iterable[str] = ()) -> Hyper:
        """The run config's optimiser keys and the method keys ``key_names``, at rate ``lr``."""
        return cls(lr=float(lr), optimizer=cfg["optimizer"], momentum=float(cfg["momentum"]),
                   weight_decay=float(cfg["weight-decay"]), clip_norm=float(cfg["local-clip-norm"]),
                   keys={k: cfg[k] for k in key_names})


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
                  hp: Hyper) -> tuple[Tree, Tree, torch.Tensor]:
    """(gradient of the batch loss with respect to every parameter, new buffers, the loss): a
    direction's order, (d, buffers', carry', loss).

    Inside a cohort's vmap (``hp.vmapped``) through ``torch.func.grad_and_value``, which vmap
    batches. Otherwise through ``torch.autograd.grad`` on fresh leaf copies of ``params``: the
    same autograd kernels (on CPU bit-identical to ``.grad`` of the module-based client,
    tests/training/test_functional.py), without functorch's per-call wrapping (on the H100 a ``cnn``
    step at batch 50 took 2.6 ms through ``torch.func.grad``, 1.9 ms this way and 1.7-1.9 ms as
    the module's ``backward``). Neither writes into ``params`` or keeps state.
    """
    if hp.vmapped:
        def objective(p: Tree) -> tuple[torch.Tensor, Tree]:
            return cross_entropy(model, p, buffers, x, y)

        grads, (loss, new_buffers) = grad_and_value(objective, has_aux=True)(params)
        return grads, new_buffers, loss.detach()
    leaves = {n: p.detach().requires_grad_() for n, p in params.items()}
    loss, new_buffers = cross_entropy(model, leaves, buffers, x, y)
    grads = torch.autograd.grad(loss, tuple(leaves.values()), allow_unused=True, materialize_grads=True)
    return dict(zip(leaves, grads)), new_buffers, loss.detach()


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


def plain_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = g, the cross-entropy gradient: FedAvg's direction, and the base of every direction that
    corrects it (a ``LocalUpdate`` direction; buffers and carry passed through)."""
    grads, new_buffers, loss = grad_and_loss(model, params, buffers, x, y, hp)
    return grads, new_buffers, carry, loss


def clipped(d: Tree, clip: float) -> Tree:
    """``d`` scaled to norm at most ``clip`` over the whole tree, as ``clip_grad_norm_`` does
    (coefficient clip / (||d|| + CLIP_EPS), never above 1; no branch on a tensor, so vmap
    batches it). The one local-gradient clip: the run-wide ``local-clip-norm`` of every step
    (``tasks.functional.rounds.make_step``) and FedSMOO's, FedSpeed's and FedDC's own keys."""
    coef = torch.clamp(clip / (tree_norm(d.values()) + CLIP_EPS), max=1.0)
    return {n: g * coef for n, g in d.items()}
