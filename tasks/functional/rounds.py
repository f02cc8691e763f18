"""The one driver of a round of local training, ``cohort_round``: K clients in one
``torch.func.vmap`` per step, running a ``LocalUpdate``'s step functions; ``local_round`` is
that loop for a cohort of one (its steps unbatched). The one generic client
(``fl_app.node.drift_client.DriftClient``) calls ``local_round``; a cohort node
(``fl_app.node.cohort_client``) calls ``cohort_round`` on the same prepared rounds.

Per-client batch order: every epoch is ``tasks.train.batches`` with the client's generator
(seeded per client and round by ``DriftClient.round_generator``), so a client's batches
are the same on both paths. The cohort path takes them as index lists (``batch_schedule``).

Cohort masking: at the cohort's s-th step the clients that still have an s-th step are
grouped by the size of that batch (an epoch's last batch may be shorter); each group is one
vmap call over all K clients, every client fed a batch of that size from its own data. A client
outside the group (finished, or its batch has another size) is masked: its weights, buffers,
carry, optimiser state and loss sum are kept as they were (``torch.where``), so what it was fed
changes nothing; no client ever trains on samples that are not its own batch.
Tolerance: vmap batches the K clients' convolutions and matmuls into grouped/batched kernels
that sum in another order, so a cohort client equals its separate ``local_round`` within float
rounding (tests: 1e-5 relative in float32); a cohort of one runs unbatched and equals it exactly.

Augmentation: each client's own callable (``tasks.augment.Augment.for_round``, its own
generator) is applied to each of its batches alone, in its step order, before the step: the
same calls, on the same batches, as in its ``local_round``, so the same random draws.

BatchNorm: the running statistics are per-client outputs of every step (stacked buffers in,
new stacked buffers out; ``tasks.functional.core.cross_entropy``), masked like the weights, so
BN models run as a cohort too. (A tiny last batch makes BN's gradient ill-conditioned: the
rounding differences then grow faster than for models without BN.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.func import vmap

from tasks.functional.core import Hyper, Tree, clipped, keep_layout
from tasks.functional.optim import opt_init, opt_step
from tasks.functional.terms import DECAY, GRADIENT, POST_STEP, add_terms
from tasks.functional.update import LR_FACTORS, LocalUpdate, Round
from tasks.train import batches, min_train_batch


@dataclass
class RoundResult:
    """A client's round: new weights and buffers, its new state, what it replies besides the
    weights, its fit metrics (``train_loss``, ``num_steps``, then the method's, as floats)."""

    params: Tree
    buffers: Tree
    state: dict
    reply: dict
    metrics: dict


def make_step(update: LocalUpdate, model: nn.Module, hp: Hyper, t: int) -> Callable:
    """The local step t (1-based) as a pure function
    (params, buffers, carry, opt_state, x, y, w_t, ctx) -> (params', buffers', carry', opt_state', loss).

    The method's direction, then its gradient terms; the clips (``LocalUpdate.clips``: the
    method's clip key, then ``local-clip-norm``), each scaling the direction to at most that
    norm over the trained weights, where ``clip_grad_norm_`` sits between ``backward`` and
    ``optimizer.step`` in the authors' codes; then its decay terms (FedDyn's alpha w, which
    those codes add through SGD's weight_decay, after the clip); then the optimiser's step,
    weight decay and momentum; then its post-step terms, times -lr (SCAFFOLD as NIID-Bench
    runs it) (``tasks.functional.terms``). With an ``lr_schedule`` (``ctx[LR_FACTORS]``, one
    factor per step of the client), that whole move from w is scaled by the step's factor s_t:
    w' = w + s_t (step(w) - w), the step at rate s_t lr, since each optimiser here moves linearly
    in its rate (``tasks.functional.update``)."""
    clips = update.clips(hp)

    def step(params, buffers, carry, opt_state, x, y, w_t, ctx):
        d, new_buffers, new_carry, loss = update.direction(model, params, buffers, x, y, w_t, ctx, carry, hp)
        d = add_terms(d, update.terms, GRADIENT, params, w_t, ctx, hp)
        for clip in clips:
            d = clipped(d, clip)
        d = add_terms(d, update.terms, DECAY, params, w_t, ctx, hp)
        new_params, new_opt = opt_step(params, d, opt_state, hp, t)
        new_params = add_terms(new_params, update.terms, POST_STEP, params, w_t, ctx, hp, scale=-hp.lr)
        if LR_FACTORS in ctx:
            s_t = ctx[LR_FACTORS][t - 1]
            new_params = {n: keep_layout(p + s_t * (new_params[n] - p), p) for n, p in params.items()}
        return new_params, new_buffers, new_carry, new_opt, loss
    return step


def with_lr_factors(update: LocalUpdate, contexts: list[dict], steps: Sequence[int], hp: Hyper,
                    like: torch.Tensor) -> list[dict]:
    """``contexts`` with each client's ``lr_schedule`` factors under ``LR_FACTORS`` (dtype and
    device of ``like``), padded with zeros to the cohort's longest round so that they stack (a
    client never takes a step past its own K); unchanged when every client's schedule is flat
    (None), and ones for a flat client beside others that are not."""
    if update.lr_schedule is None:
        return contexts
    factors = [update.lr_schedule(k, hp) for k in steps]
    if all(f is None for f in factors):
        return contexts
    longest = max(steps)
    rows = [[1.0] * k if f is None else list(f) for f, k in zip(factors, steps)]
    for row, k in zip(rows, steps):
        if len(row) != k:
            raise ValueError(f"{update.name}'s lr_schedule gave {len(row)} factors for a round of {k} steps")
    return [{**ctx, LR_FACTORS: torch.tensor(row + [0.0] * (longest - len(row)), dtype=like.dtype,
                                             device=like.device)}
            for ctx, row in zip(contexts, rows)]


def local_round(job: Round) -> RoundResult:
    """One client's round, ``job`` prepared (``tasks.functional.update.Round``): the cohort loop
    (``cohort_round``) on a cohort of one, which runs each step unbatched, on the client's own
    weights' layout: so the per-client path and a cohort are one loop, and a cohort of one
    equals this exactly. ``job.epochs`` shuffled passes over (x, y), each batch augmented by
    ``job.augment`` (when given) before its step (a last batch too small for the model to train
    on skipped, ``tasks.train.min_train_batch``); the model is a skeleton only."""
    result = cohort_round(job.update, job.model, stack_trees([job.params]), stack_trees([job.buffers]), [job.state],
                          job.server, job.hp, [(job.x, job.y)], job.batch_size, job.epochs, [job.generator],
                          [job.augment])
    return result.client(0)


def batch_schedule(sizes: Sequence[int], batch_size: int, epochs: int,
                   generators: Sequence[torch.Generator], min_size: int = 1) -> list[list[torch.Tensor]]:
    """Per client, the sample indices of each of its local steps, in its per-client order:
    ``tasks.train.batches`` over ``arange(n)`` with the client's generator and ``min_size``,
    epoch after epoch."""
    schedule = []
    for n, gen in zip(sizes, generators):
        index = torch.arange(n)
        schedule.append([idx for _ in range(epochs) for idx, _ in batches(index, index, batch_size, gen, min_size)])
    return schedule


def _select(mask: torch.Tensor, new, old):
    """``new`` where ``mask`` (one bool per client, first dimension), else ``old``; on pytrees."""
    if isinstance(new, dict):
        return {k: _select(mask, new[k], old[k]) for k in new}
    return torch.where(mask.view(-1, *([1] * (new.dim() - 1))), new, old)


def stack_trees(trees: Sequence):
    """K pytrees (dicts or tuples of tensors) -> one with a leading client dimension. One tree
    keeps each tensor's strides (``unsqueeze``, then a copy): ``torch.stack`` may give a
    channels-last weight with one input channel other strides, and the convolution another
    kernel than the per-client path's (``core.keep_layout``), which a cohort of one must not."""
    if isinstance(trees[0], dict):
        return {k: stack_trees([t[k] for t in trees]) for k in trees[0]}
    if isinstance(trees[0], tuple):
        return tuple(stack_trees([t[i] for t in trees]) for i in range(len(trees[0])))
    if len(trees) == 1:
        return trees[0].unsqueeze(0).clone()
    return torch.stack(list(trees))


def unstack_tree(tree, k: int):
    """Client ``k`` of a stacked pytree."""
    if isinstance(tree, dict):
        return {n: unstack_tree(v, k) for n, v in tree.items()}
    return tree[k]


@dataclass
class CohortResult:
    """K clients' round: weights and buffers stacked (client dimension first); per client its
    new state, reply and fit metrics, as ``RoundResult`` has them for one client."""

    params: Tree
    buffers: Tree
    states: list[dict]
    replies: list[dict]
    metrics: list[dict]

    def client(self, k: int) -> RoundResult:
        """Client ``k``'s round as ``local_round`` returns it for one client."""
        return RoundResult(unstack_tree(self.params, k), unstack_tree(self.buffers, k), self.states[k],
                           self.replies[k], self.metrics[k])


def step_groups(schedule: list[list[torch.Tensor]], s: int) -> dict[int, list[int]]:
    """The clients with an s-th step, grouped by that batch's size."""
    groups: dict[int, list[int]] = {}
    for k, steps in enumerate(schedule):
        if s < len(steps):
            groups.setdefault(len(steps[s]), []).append(k)
    return groups


def step_indices(schedule, s: int, size: int, members: list[int], sizes: Sequence[int],
                 offsets: Sequence[int]) -> torch.Tensor:
    """[K, size] rows into the concatenated data: a member's s-th batch; for any other client
    (masked, its outputs dropped) its own first ``size`` samples, cycled if it has fewer."""
    rows = []
    for k in range(len(schedule)):
        own = schedule[k][s] if k in members else torch.arange(size) % sizes[k]
        rows.append(own + offsets[k])
    return torch.stack(rows)


def augmented(xb: torch.Tensor, members: list[int], augments: Sequence[Callable | None]) -> torch.Tensor:
    """The step's stacked batches [K, size, ...] with each member's batch augmented by its own
    callable; other clients' rows (masked) are left as they are. ``xb`` is a fresh gather."""
    for k in members:
        if augments[k] is not None:
            xb[k] = augments[k](xb[k])
    return xb


def cohort_step(step: Callable, k_all: int) -> Callable:
    """``step`` over stacked clients: ``vmap`` for K > 1. A cohort of one runs ``step`` on its
    one client unbatched, the per-client path's kernels exactly (under vmap even one client's
    convolutions and matmuls run batched kernels, measured about one ulp off on CPU)."""
    if k_all > 1:
        return vmap(step)

    def one(*args):
        return stack_trees([step(*(unstack_tree(a, 0) for a in args))])
    return one


def concatenated(data: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The clients' (x, y) end to end; one client's own tensors, not a copy."""
    if len(data) == 1:
        return data[0]
    return torch.cat([x for x, _ in data]), torch.cat([y for _, y in data])


def cohort_round(update: LocalUpdate, model: nn.Module, params: Tree, buffers: Tree,
                 states: Sequence[dict], server: dict | Sequence[dict], hp: Hyper,
                 data: Sequence[tuple[torch.Tensor, torch.Tensor]], batch_size: int, epochs: int,
                 generators: Sequence[torch.Generator],
                 augments: Sequence[Callable[[torch.Tensor], torch.Tensor] | None] | None = None) -> CohortResult:
    """K clients' rounds in one vmap per step: client k starts from ``params[name][k]`` with
    ``states[k]``, trains on ``data[k]`` in the order of ``generators[k]``; ``server`` is what
    the server sent: one dict for all, or one per client. ``augments[k]`` (when given and not
    None) augments each of client k's batches before its step, called on that batch alone,
    once per local step in step order: the calls ``local_round`` makes with the same callable,
    so a client's augmentation draws the same random numbers on both paths. Equal to K
    ``local_round`` calls within rounding (module docstring). ``model`` is a skeleton (a copy
    on the meta device will do)."""
    sizes = [len(x) for x, _ in data]
    if len(sizes) > 1 and min(sizes) == 0:
        raise ValueError(f"cohort clients need data: sizes {sizes}; train an empty client on its own")
    schedule = batch_schedule(sizes, batch_size, epochs, generators, min_train_batch(model))
    offsets = torch.tensor([0, *sizes[:-1]]).cumsum(0).tolist()
    x_all, y_all = concatenated(data)
    model.train()
    w_t, k_all = params, len(data)
    servers = [server] * k_all if isinstance(server, dict) else list(server)
    augments = list(augments) if augments is not None else [None] * k_all
    if len(servers) != k_all or len(augments) != k_all:
        raise ValueError(f"cohort of {k_all} clients given {len(servers)} server dicts and {len(augments)} augments")
    contexts = [update.begin(unstack_tree(w_t, k), states[k], servers[k], hp) for k in range(k_all)]
    contexts = with_lr_factors(update, contexts, [len(steps) for steps in schedule], hp, next(iter(w_t.values())))
    carry = stack_trees([update.initial_carry(unstack_tree(w_t, k), contexts[k], hp) for k in range(k_all)])
    ctx = stack_trees(contexts)
    opt_state = opt_init(params, hp)
    loss_sum = torch.zeros(k_all, device=x_all.device)
    for s in range(max(len(steps) for steps in schedule)):
        step = cohort_step(make_step(update, model, replace(hp, vmapped=k_all > 1), s + 1), k_all)
        for size, members in step_groups(schedule, s).items():
            idx = step_indices(schedule, s, size, members, sizes, offsets).to(x_all.device)
            xb = augmented(x_all[idx], members, augments)
            new_params, new_buffers, new_carry, new_opt, loss = step(params, buffers, carry, opt_state, xb,
                                                                     y_all[idx], w_t, ctx)
            if len(members) == k_all:
                params, buffers, carry, opt_state = new_params, new_buffers, new_carry, new_opt
                loss_sum = loss_sum + loss
                continue
            mask = torch.zeros(k_all, dtype=torch.bool)
            mask[members] = True
            mask = mask.to(x_all.device)
            params, buffers = _select(mask, new_params, params), _select(mask, new_buffers, buffers)
            carry = _select(mask, new_carry, carry)
            opt_state, loss_sum = _select(mask, new_opt, opt_state), torch.where(mask, loss_sum + loss, loss_sum)
    return _finish(update, w_t, params, buffers, carry, ctx, states, hp, schedule, loss_sum)


def _finish(update, w_t, params, buffers, carry, ctx, states, hp, schedule, loss_sum) -> CohortResult:
    """Each client's ``end`` (the same function as its ``local_round``'s) and metrics."""
    new_states, replies, metrics = [], [], []
    for k, steps in enumerate(schedule):
        state, reply, method_metrics = update.end(unstack_tree(w_t, k), unstack_tree(params, k),
                                                  unstack_tree(buffers, k), unstack_tree(carry, k), len(steps),
                                                  unstack_tree(ctx, k), states[k], hp)
        new_states.append(state)
        replies.append(reply)
        m = {"train_loss": loss_sum[k].item() / max(len(steps), 1), "num_steps": len(steps)}
        m.update({name: float(v) for name, v in method_metrics.items()})
        metrics.append(m)
    return CohortResult(params, buffers, new_states, replies, metrics)
