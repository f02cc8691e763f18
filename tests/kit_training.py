"""The kit of the local-training tests: hand computations and independent references that a
round of a method is checked against.

- the one-weight-matrix model of the research notes' hand computations (the tests of FedACG,
  FedDC, FedSpeed, SCAFFOLD's two readings and the local clip): ``nn.Linear(1, 2, bias=False)``
  in float64 on the one example x = [1], y = 0, whose logits are its two weights w, so the
  gradient of the cross-entropy is softmax(w) - e_0 and every number of a round can be written
  out (/work/notes/v2/<method>.md): ``weight``, ``linear_round``, ``values``;
- the restricted-softmax hand case of the FedRS and FedLC tests: logits z = W x + b, W = 0
  (3 x 2), b = ``FEDRS_B0`` = (0, 0, 1); one batch ``FEDRS_X`` (x1 = (1, 0), x2 = (0, 1)) with
  labels ``FEDRS_Y`` = (0, 1); the client's label ``FEDRS_COUNTS`` (16, 1, 0); plain SGD lr 0.1,
  two steps: ``adjusted_round64`` writes the round out in float64 on adjusted logits,
  ``fedrs_hand_round`` runs it through a method's update and ``local_round``;
- softmax regression written out for the baselines' tests: ``softmax_regression_grad``,
  ``softmax_regression_loss``, ``sgd_round64`` (``torch.optim.SGD``'s rule in float64), and
  ``client_batches`` (the sample indices of a client's steps);
- the module-based local training the clients ran before every method became a functional
  ``LocalUpdate``, kept here (and only here) as an independent reference: the weights live in
  one ``nn.Module``, a step fills ``.grad`` (and may edit it), ``torch.optim`` applies it in
  place; a SAM-style step moves the weights to w + eps in place and restores them by copy
  (``perturbed``). The functional updates give these numbers bit for bit on CPU (the same
  autograd kernels and the same tensor operations, in the same order): ``module_fit``,
  ``module_round``, ``module_sam_eps``, ``foreach_norm``, ``frozen``;
- a cohort of K clients in one ``cohort_round`` against K separate ``local_round`` calls, over
  the updates ``COHORT_UPDATES`` of ``COHORT_NAMES`` (those tests/training/test_functional.py's
  module loop writes out the corrections of) with the hyperparameters ``COHORT_KEYS`` on the
  small input ``COHORT_SHAPE``: ``cohort_inputs``, ``compare_cohort``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from fl_app.registry import get_method
from tasks.catalogue import InputShape
from tasks.functional import Hyper, Round, cohort_round, local_round, module_state
from tasks.functional.rounds import stack_trees, unstack_tree
from tasks.functional.update import LocalUpdate
from tasks.models import Classifier, build_model, get_weights, set_weights
from tasks.optim import OPTIMIZERS
from tests.kit import assert_cohort_client_equals

# ---------------------------------------------------------------------- the hand-computation model
X1 = torch.tensor([[1.0]], dtype=torch.float64)
Y1 = torch.tensor([0])


def build_optimizer(params, cfg: dict, lr: float) -> torch.optim.Optimizer:
    """The run's local optimiser as ``torch.optim``'s own, over ``params`` at learning rate ``lr``: the
    reference the product's functional optimisers (``tasks.functional.optim``) are held equal to."""
    name = cfg["optimizer"]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg["momentum"], weight_decay=cfg["weight-decay"])
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg["weight-decay"])
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=cfg["weight-decay"])
    raise ValueError(f"run-config key 'optimizer' = {name!r} is invalid; valid choices: {', '.join(OPTIMIZERS)}")


def weight(values) -> dict[str, torch.Tensor]:
    """A tree over the linear model's one entry, ``weight`` (2 x 1, float64), from two numbers."""
    return {"weight": torch.tensor(values, dtype=torch.float64).reshape(2, 1)}


def linear_round(update: LocalUpdate, keys: dict, w_t, *, lr: float = 0.5, epochs: int = 2, state=None,
                 server=None, **options):
    """One round of ``update`` on the hand-computation model from w_t (two numbers): batch 1,
    ``epochs`` steps, SGD without momentum or weight decay unless ``options`` (more ``Hyper``
    fields: ``weight_decay``, ``clip_norm``, ...) say otherwise (``local_round``)."""
    model = nn.Linear(1, 2, bias=False).double()
    hp = Hyper(lr=lr, keys=keys, **options)
    return local_round(Round(update, model, weight(w_t), {}, state or {}, {"buffers": {}, **(server or {})}, hp, X1, Y1,
                       1, epochs, torch.Generator().manual_seed(0)))


def values(tree: dict) -> list[float]:
    """The two numbers of a tree over ``weight``."""
    return tree["weight"].flatten().tolist()


# ---------------------------------------------------------------- the restricted-softmax hand case
FEDRS_X = np.array([[1.0, 0.0], [0.0, 1.0]])
FEDRS_Y = np.array([0, 1])
FEDRS_COUNTS = np.array([16, 1, 0])
FEDRS_B0 = np.array([0.0, 0.0, 1.0])


def adjusted_round64(scale: np.ndarray, offset: np.ndarray, lr: float = 0.1, steps: int = 2):
    """Softmax regression on the adjusted logits z' = scale * (x W^T + b) - offset, written out
    (dL/dz = scale * (softmax(z') - onehot(y)) / B; an infinite offset gives probability 0):
    (final W, final b, the steps' losses)."""
    W, b, losses = np.zeros((3, 2)), FEDRS_B0.copy(), []
    for _ in range(steps):
        z = scale * (FEDRS_X @ W.T + b) - offset
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        losses.append(float(-np.log(p[np.arange(len(FEDRS_Y)), FEDRS_Y]).mean()))
        p[np.arange(len(FEDRS_Y)), FEDRS_Y] -= 1
        dz = scale * p / len(FEDRS_Y)
        W, b = W - lr * dz.T @ FEDRS_X, b - lr * dz.sum(0)
    return W, b, losses


def fedrs_hand_model() -> Classifier:
    """The hand case's model in float64: no body, head Linear(2, 3) at W = 0, b = (0, 0, 1)."""
    model = Classifier(nn.Identity(), nn.Linear(2, 3)).double()
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor(FEDRS_B0))
    return model


def fedrs_hand_round(method: str, keys: dict):
    """The hand case through ``method``'s update and ``local_round`` (counts given as the
    ``prepare`` step leaves them in the round's state)."""
    model = fedrs_hand_model()
    params, buffers = module_state(model)
    state = {"label_counts": torch.tensor(FEDRS_COUNTS)}
    return local_round(Round(get_method(method).update, model, params, buffers, state, {"buffers": buffers},
                       Hyper(lr=0.1, keys=keys), torch.tensor(FEDRS_X), torch.tensor(FEDRS_Y), 2, 2,
                       torch.Generator().manual_seed(0)))


# ------------------------------------------------------------------ softmax regression written out
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


# ---------------------------------------------------------------------- the module-based reference
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


# -------------------------------------------------------------- a cohort against its clients alone
COHORT_SHAPE = InputShape(1, 8, 10)  # MNIST-like, one channel (a channels-last quirk: keep_layout), small for speed

COHORT_KEYS = {"proximal-mu": 0.3, "sam-rho": 0.05, "feddyn-alpha": 0.1}

# The updates tests/training/test_functional.py checks (its module loop writes out their corrections), looked up
# through the one registry of methods, each as its client trains it.
COHORT_NAMES = ("fedavg", "feddyn", "fedprox", "fedsam", "scaffold")

COHORT_UPDATES = {name: get_method(name).update for name in COHORT_NAMES}


def cohort_inputs(model_name, sizes, seed=5, shape=COHORT_SHAPE):
    """A cohort of len(sizes) clients of ``model_name`` on ``shape``, seeded by ``seed``: (the
    meta skeleton, the clients' stacked parameters and buffers (model k seeded k), each client's
    (x, y) of its size, each client's non-zero state ``ci`` and ``grad``, different per client,
    and the server's non-zero ``c``)."""
    gen = torch.Generator().manual_seed(seed)
    models = [build_model(model_name, shape, seed=k) for k in range(len(sizes))]
    params, buffers = (stack_trees(t) for t in zip(*(module_state(m) for m in models)))
    params = {n: p.contiguous() for n, p in params.items()}  # the layout vmap batches
    data = [(torch.randn(n, shape.channels, shape.size, shape.size, generator=gen),
             torch.randint(0, shape.classes, (n,), generator=gen)) for n in sizes]
    states = []
    for k in range(len(sizes)):  # non-zero client state, different per client
        p_k = unstack_tree(params, k)
        states.append({"ci": {n: torch.randn(v.shape, generator=gen) * 0.1 for n, v in p_k.items()},
                       "grad": {n: torch.randn(v.shape, generator=gen) * 0.1 for n, v in p_k.items()}})
    server = {"c": {n: torch.randn(v.shape[1:], generator=gen) * 0.1 for n, v in params.items()}}
    return build_model(model_name, shape).to("meta"), params, buffers, data, states, server


def compare_cohort(name, model_name, sizes, batch_size, rel, shape=COHORT_SHAPE):
    """Method ``name``'s update (of ``COHORT_UPDATES``) on a cohort of ``cohort_inputs``, two
    epochs of SGD with momentum and weight decay at ``batch_size``: every client of the one
    ``cohort_round`` equals its own ``local_round`` within ``rel`` (exactly when 0,
    ``assert_cohort_client_equals``)."""
    skeleton, params, buffers, data, states, server = cohort_inputs(model_name, sizes, shape=shape)
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=COHORT_KEYS)
    update, k_all = COHORT_UPDATES[name], len(sizes)
    together = cohort_round(update, skeleton, params, buffers, states, server, hp, data, batch_size, 2,
                            [torch.Generator().manual_seed(10 + k) for k in range(k_all)])
    for k in range(k_all):
        alone = local_round(Round(update, skeleton, unstack_tree(params, k), unstack_tree(buffers, k), states[k], server,
                            hp, *data[k], batch_size, 2, torch.Generator().manual_seed(10 + k)))
        assert_cohort_client_equals(together, k, alone, rel)
