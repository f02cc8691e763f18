"""RI-FedAvg: a proximal term scaled by the roughness of the client's loss landscape
(Partohaghighi, Marcia, West, Chen, arXiv 2026).

- Client, once per round before training, measures the Roughness Index I_k of its loss around
  w_t on a fixed sample of its data (`tasks.roughness`):
  1. draw M directions d_i ~ N(0, I) over all trainable parameters and scale each to unit
     norm over the whole parameter vector;
  2. evaluate f_i(s_j) = F_k(w_t + s_j d_i) at s_j = −l + j · 2l/m, j = 0..m (m + 1 points);
  3. TV_i = Σ_j |f_i(s_{j+1}) − f_i(s_j)|, A_i = max_j f_i − min_j f_i,
     T_i = TV_i / (2l · max(A_i, 1e-12)), so a flat profile gives T_i = 0;
  4. I_k = std_i(T_i) / mean_i(T_i) (population standard deviation), clipped to [0, I_max]
     (the paper's Assumption 5; I_k = 0 when every T_i is 0).

  Then it trains on F_k(w) + λ I_k ‖w − w_t‖², that is d = g + 2 λ I_k (w − w_t) (Eqs. 10-11),
  with I_k fixed for the round.
- Server: the weighted mean (Algorithm 1; `DriftFedAvg`).
- State: none. What travels: I_k as the fit metric `ri` (`ri_mean/_min/_max` in `metrics.csv`;
  `run_simulation.py` draws `roughness.png`).
- Keys: `ri-lambda` λ (0.1, ≥ 0), `ri-directions` M (10), `ri-interval` l (0.01, > 0),
  `ri-points` m (19), `ri-max` I_max (10.0), `ri-samples` (128: the size of the fixed sample),
  `ri-chunk` (−1: perturbed models per batched `vmap` call; −1 = 1 on CPU, 20 on CUDA; 0 = all
  at once; 1 = one at a time without `vmap`), `ri-float64` (false, the paper's setting).
- Readings: the paper does not say on which data the index is measured. Here it is one fixed,
  seeded sample of `ri-samples` local examples, drawn once per (`seed`, partition) and used for
  every evaluation, so the total variation measures the landscape rather than batch-sampling
  noise and the index's evolution over rounds reflects the model only. The directions are seeded
  per (`seed`, partition, round), so runs are reproducible. The model is in eval mode, without
  gradients, for the evaluations. At l = 0.01 the loss changes along a unit direction of a large
  model are close to float32 rounding, so a float32 index partly measures rounding noise;
  `ri-float64 = true` evaluates the losses in float64 (the index then comes out close to 0, and
  the method close to FedAvg). The cost is M (m + 1) forward passes on the sample per client per
  round.

Summary: client + 2λ I_k (w − w_t) | server - | client state - | server state - | traffic I_k as
a fit metric
"""

from __future__ import annotations

from dataclasses import replace

import torch

from protocol.keys import Key, at_least, non_negative, positive
from tasks.functional.core import Hyper, Tree, plain_direction
from tasks.functional.update import LocalUpdate, Round
from tasks.roughness import model_roughness


def ri_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """I_k (``state["ri"]``, a float) and the round's proximal coefficient 2 lambda I_k
    (lambda = ``ri-lambda``), both as 0-dim float64 CPU tensors (stackable for a cohort;
    ``float`` gives back the exact doubles the client computed)."""
    if "ri" not in state:
        raise ValueError("ri-fedavg: state['ri'] (the roughness index I_k measured before the round) is missing")
    ri = float(state["ri"])
    coef = 2 * hp.keys["ri-lambda"] * ri
    return {"ri": torch.tensor(ri, dtype=torch.float64), "coef": torch.tensor(coef, dtype=torch.float64)}


def ri_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = g + 2 lambda I_k (w - w_t) on every parameter, the coefficient fixed for the round.

    One client: the coefficient as a Python float through ``add``'s ``alpha`` (the kernel a module's
    in-place ``.grad`` update runs: bit-identical), skipped when 0. Inside a cohort's vmap it is a
    per-client tensor, so ``g + c (w - w_t)``: the same value up to the rounding of the fused
    multiply-add (tests: 1e-5 relative)."""
    grads, new_buffers, carry, loss = plain_direction(model, params, buffers, x, y, w_t, ctx, carry, hp)
    if hp.vmapped:
        first = next(iter(grads.values()))
        coef = ctx["coef"].to(device=first.device, dtype=first.dtype)
        return {n: g + coef * (params[n] - w_t[n]) for n, g in grads.items()}, new_buffers, carry, loss
    coef = float(ctx["coef"])
    if coef != 0:
        grads = {n: g.add(params[n] - w_t[n], alpha=coef) for n, g in grads.items()}
    return grads, new_buffers, carry, loss


def ri_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """No state carried to the next round; metric ``ri`` = I_k."""
    return {}, {}, {"ri": ctx["ri"]}


DIRECTIONS_STREAM = 0x52  # separates the direction seed from the batch-order seed
SAMPLE_STREAM = 0x53


def stream_seed(*parts: int) -> int:
    return hash(tuple(int(p) for p in parts)) & 0x7FFFFFFF


def ri_sample(job: Round) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed sample the index is measured on: ``ri-samples`` seeded local examples."""
    size = min(job.hp.keys["ri-samples"], len(job.x))
    generator = torch.Generator().manual_seed(stream_seed(job.seed, job.partition, SAMPLE_STREAM))
    idx = torch.randperm(len(job.x), generator=generator)[:size].to(job.x.device)
    return job.x[idx], job.y[idx]


def ri_chunk(chunk: int, device: torch.device) -> int:
    """``ri-chunk``, with -1 (auto) resolved per device: on CPU vmap turns the convolutions into
    grouped ones (measured ~4x slower than the plain loop, docs/performance.md, "What the code
    does for speed"); on CUDA
    batching the evaluations pays."""
    if chunk < 0:
        return 1 if device.type == "cpu" else 20
    return chunk


def measure_roughness(job: Round) -> Round:
    """I_k of the loss around w_t (loaded into the model skeleton: ``model_roughness`` evaluates
    a module), on ``ri_sample`` along the round's seeded directions, into ``state["ri"]`` for
    ``ri_begin`` (not kept: the update declares no state)."""
    keys, model = job.hp.keys, job.model
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(job.params[name])
        for name, b in model.named_buffers():
            b.copy_(job.buffers[name])
    x, y = ri_sample(job)
    generator = torch.Generator().manual_seed(stream_seed(job.seed, job.partition, job.server_round,
                                                          DIRECTIONS_STREAM))
    _, ri = model_roughness(
        model, x, y, num_directions=keys["ri-directions"], l=keys["ri-interval"], m=keys["ri-points"],
        i_max=keys["ri-max"], generator=generator, chunk=ri_chunk(keys["ri-chunk"], job.x.device),
        dtype=torch.float64 if keys["ri-float64"] else None,
        # on CPU the forwards run at the training batch size (cache-sized activations)
        batch_size=job.batch_size if job.x.device.type == "cpu" else 0)
    return replace(job, state={**job.state, "ri": ri})


UPDATE = LocalUpdate("ri-fedavg", ri_direction, ri_begin, ri_end, keys={  # defaults as in the paper's Sec. V-A
    "ri-lambda": Key(0.1, non_negative, ">= 0 (regularisation strength lambda)"),
    "ri-directions": Key(10, at_least(1), ">= 1 (random directions M)"),
    "ri-interval": Key(0.01, positive, "> 0 (half-width l of the interval [-l, l])"),
    "ri-points": Key(19, at_least(1), ">= 1 (m: the grid has m+1 points)"),
    "ri-max": Key(10.0, non_negative, ">= 0 (clip I_max)"),
    "ri-samples": Key(128, at_least(1), ">= 1 (local examples the index is measured on)"),
    "ri-chunk": Key(-1, lambda v: v >= -1, ">= -1 (perturbed models per vmap call; -1 = auto: 1 on CPU,"
                    " where vmap over convolutions is ~4x slower, 20 on CUDA; 0 = all; 1 = no vmap)"),
    "ri-float64": Key(False),  # evaluate the index's losses in float64 (see above)
}, prepare=measure_roughness, step_cost=1.3, module=__name__)
