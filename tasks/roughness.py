"""Roughness Index (RI) of a loss landscape (Partohaghighi et al., arXiv 2026, Eqs. 5-9, after
Wu et al., ICML 2023).

Along M unit directions d_i (normalised over the whole parameter vector), the loss is read
at s_j = -l + j*2l/m, j = 0..m; for each direction the normalised total variation is
T_i = sum_j |f_i(s_{j+1}) - f_i(s_j)| / (2l * A_i) with A_i = max_j f_i - min_j f_i, and
I = std_i(T_i) / mean_i(T_i) (population std), clipped to [0, I_max].

The loss is any function of a parameter dict, so the same code measures an analytic
function (tests) or a model through ``torch.func.functional_call``. The M*(m+1) evaluations
are batched with ``torch.vmap`` over stacked perturbed parameter dicts, ``chunk`` points at
a time so memory stays bounded; ``profile_losses_loop`` is the one-at-a-time reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

Params = Mapping[str, torch.Tensor]
LossFn = Callable[[Params], torch.Tensor]

# A_i below this counts as a flat profile: T_i = TV_i / (2l * eps) = 0 since TV_i <= m * A_i.
EPS = 1e-12


def grid(l: float, m: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The m+1 step sizes s_j = -l + j * 2l/m (Eq. 7)."""
    j = torch.arange(m + 1, dtype=torch.float64)
    return (-l + j * (2 * l / m)).to(dtype=dtype, device=device)


def random_directions(params: Params, num: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``num`` directions d_i ~ N(0, I) over every entry of ``params``, each scaled to unit
    Euclidean norm over the whole parameter vector (Eq. 5). Returned stacked: name -> [num, *shape].

    Drawn on the CPU from ``generator`` (so the same seed gives the same directions on any
    device) in the parameters' dtype (float32 draws cost a third of float64 ones; the norm
    is accumulated in float64), then moved to each parameter's device.
    """
    raw = {
        name: torch.randn((num, *p.shape), generator=generator, dtype=p.dtype)
        for name, p in params.items()
    }
    sq = sum(
        torch.linalg.vector_norm(d.reshape(num, -1), dim=1, dtype=torch.float64) ** 2 for d in raw.values()
    )
    norm = sq.sqrt()
    out = {}
    for name, d in raw.items():
        scale = (1.0 / norm).to(d.dtype).reshape(num, *([1] * (d.dim() - 1)))
        out[name] = d.mul_(scale).to(device=params[name].device)
    return out


def point_along(center: Params, directions: Params, i: int, s: torch.Tensor) -> dict[str, torch.Tensor]:
    """center + s d_i, each tensor laid out like its center tensor: a channels-last conv
    weight must stay channels-last (with one input channel ``c + s*d`` comes out with
    contiguous strides, and the convolutions then take the slow NCHW path: 1.6x per call)."""
    out = {}
    for name, c in center.items():
        point = torch.empty_like(c)  # same strides as c
        torch.mul(directions[name][i], s, out=point)
        out[name] = point.add_(c)
    return out


def profile_losses_loop(loss_fn: LossFn, center: Params, directions: Params, s: torch.Tensor) -> torch.Tensor:
    """f_i(s_j) = loss_fn(center + s_j d_i) one point at a time: [M, m+1]. Reference only."""
    num = next(iter(directions.values())).shape[0]
    rows = []
    with torch.no_grad():
        for i in range(num):
            rows.append(torch.stack([loss_fn(point_along(center, directions, i, sj)) for sj in s]))
    return torch.stack(rows)


def profile_losses(
    loss_fn: LossFn, center: Params, directions: Params, s: torch.Tensor, chunk: int = 0
) -> torch.Tensor:
    """f_i(s_j) = loss_fn(center + s_j d_i) for all i, j: [M, m+1].

    ``torch.vmap`` over up to ``chunk`` stacked perturbed parameter dicts per call
    (``chunk`` <= 0: all M*(m+1) points in one call). ``loss_fn`` must be vmappable
    (functional, no in-place ops, no data-dependent control flow). ``chunk`` == 1 skips
    vmap and evaluates one point at a time: on CPU, vmap turns convolutions with batched
    weights into grouped convolutions, about 4x slower per round than the plain loop
    (docs/performance.md, "What the code does for speed").
    """
    if chunk == 1:
        return profile_losses_loop(loss_fn, center, directions, s)
    num = next(iter(directions.values())).shape[0]
    points = s.numel()
    total = num * points
    chunk = total if chunk <= 0 else min(chunk, total)
    batched = torch.vmap(loss_fn)
    out = []
    with torch.no_grad():
        for start in range(0, total, chunk):
            idx = torch.arange(start, min(start + chunk, total), device=s.device)
            di, sj = idx // points, s[idx % points]
            stacked = {}
            for name, c in center.items():
                d = directions[name][di]  # [chunk, *shape]
                stacked[name] = c.unsqueeze(0) + sj.reshape(-1, *([1] * c.dim())) * d
            out.append(batched(stacked))
    return torch.cat(out).reshape(num, points)


def normalised_total_variation(values: torch.Tensor, l: float, eps: float = EPS) -> torch.Tensor:
    """T_i = TV_i / (2l * max(A_i, eps)) per row of ``values`` [M, m+1] (Eqs. 7-8), in float64."""
    v = values.detach().to(torch.float64)
    tv = (v[:, 1:] - v[:, :-1]).abs().sum(1)
    amplitude = v.max(1).values - v.min(1).values
    return tv / (2 * l * amplitude.clamp_min(eps))


def roughness_index(t: torch.Tensor, i_max: float) -> float:
    """I = std(T) / mean(T) (population std, Eq. 9) clipped to [0, I_max]; 0 when mean(T) = 0."""
    t = t.to(torch.float64)
    mean = t.mean()
    if not torch.isfinite(mean) or mean.item() <= 0:
        return 0.0
    index = (t.std(unbiased=False) / mean).item()
    return float(min(max(index, 0.0), i_max))


def model_loss_fn(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None = None,
    batch_size: int = 0,
) -> LossFn:
    """Mean cross-entropy of ``model`` on (x, y) as a function of its trainable parameters.

    Buffers (e.g. BatchNorm running stats) are passed unbatched as they are; put the model
    in eval mode first so they are read, not updated. With ``dtype``, floating buffers and
    x are cast to it (the parameters passed in must then be of that dtype too). With
    ``batch_size`` > 0 the forward runs that many examples at a time (the same mean): on CPU
    128 examples at once spill the activations out of cache and cost 1.3x per example.
    """
    buffers = {
        n: b.to(dtype) if dtype is not None and b.is_floating_point() else b
        for n, b in model.named_buffers()
    }
    if dtype is not None and x.is_floating_point():
        x = x.to(dtype)

    step = batch_size if 0 < batch_size < len(x) else len(x)

    def loss(params: Params) -> torch.Tensor:
        state = (dict(params), buffers)
        if step == len(x):
            return F.cross_entropy(functional_call(model, state, (x,)), y)
        total = sum(
            F.cross_entropy(functional_call(model, state, (x[i:i + step],)), y[i:i + step], reduction="sum")
            for i in range(0, len(x), step)
        )
        return total / len(x)

    return loss


def model_roughness(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_directions: int,
    l: float,
    m: int,
    i_max: float,
    generator: torch.Generator,
    chunk: int = 0,
    dtype: torch.dtype | None = None,
    batch_size: int = 0,
) -> tuple[torch.Tensor, float]:
    """(T_i for each direction, I) of the model's loss on (x, y) around its current weights.

    Switches the model to eval mode for the evaluations and restores its mode after.
    ``dtype`` (e.g. float64) evaluates the losses in that precision: at the paper's l = 0.01
    the loss changes along a unit direction are near float32 rounding, so in float32 the
    index can measure rounding noise rather than the landscape.
    """
    was_training = model.training
    model.eval()
    try:
        center = {
            n: p.detach() if dtype is None else p.detach().to(dtype)
            for n, p in model.named_parameters() if p.requires_grad
        }
        directions = random_directions(center, num_directions, generator)
        first = next(iter(center.values()))
        s = grid(l, m, dtype=first.dtype, device=first.device)
        values = profile_losses(model_loss_fn(model, x, y, dtype, batch_size), center, directions, s, chunk)
    finally:
        model.train(was_training)
    t = normalised_total_variation(values, l)
    return t, roughness_index(t, i_max)
