"""The local updates of FedNova, FedBN, DP-FedAvg, FedPVR and RI-FedAvg as ``LocalUpdate``s (the
contract is in ``tasks.functional``'s docstring; each method's reading of its paper is in its
client module's docstring, clients/<method>.py).

Four of them train locally as an already written method does, so their updates are that
method's functions under their own name (the maths stays in ``tasks.functional.methods``):

- FedNova, FedBN, DP-FedAvg: FedAvg's plain step, d = g. What sets them apart is outside
  the local step: FedNova's normalised averaging is the server's (it reads ``num_steps``);
  FedBN's BN entries kept local are the client's starting weights and what it stores after
  the round (``clients.fedbn``: ``end`` sees neither the buffers nor may ``begin`` change
  the starting weights, so the client's ``receive`` and ``functional_outputs`` keep them);
  DP-FedAvg's clipping is a Flower client mod on the reply.
- FedPVR: SCAFFOLD's update on the parameters that carry control variates: ``begin`` takes
  them from the names of ``server["c"]`` (FedPVR's client sends only the last ``pvr-layers``
  Linear layers), and ``direction`` corrects only those.

RI-FedAvg's step is its own: d = g + 2 lambda I_k (w - w_t), with the roughness index I_k
measured by the client before the round (``tasks.roughness.model_roughness`` on its fixed
sample, with its seeded directions: ``begin`` has neither the model nor the data) and passed
in as ``state["ri"]`` (per client, where ``server`` is the cohort's shared message). Nothing of
it persists: ``end`` returns an empty state and I_k as the fit metric ``ri``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tasks.functional.core import Hyper, Tree
from tasks.functional.methods import FEDAVG, SCAFFOLD, LocalUpdate, plain_direction

FEDNOVA = replace(FEDAVG, name="fednova")
FEDBN = replace(FEDAVG, name="fedbn")
DP_FEDAVG = replace(FEDAVG, name="dp-fedavg")
FEDPVR = replace(SCAFFOLD, name="fedpvr")


# ---------------------------------------------------------------------------- RI-FedAvg
def ri_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """I_k (``state["ri"]``, a float) and the round's proximal coefficient 2 lambda I_k
    (lambda = ``ri-lambda``), both as 0-dim float64 CPU tensors (stackable for a cohort;
    ``float`` gives back the exact doubles the client computed)."""
    if "ri" not in state:
        raise ValueError("ri-fedavg: state['ri'] (the roughness index I_k measured before the round) is missing")
    ri = float(state["ri"])
    coef = 2 * hp.keys["ri-lambda"] * ri
    return {"ri": torch.tensor(ri, dtype=torch.float64), "coef": torch.tensor(coef, dtype=torch.float64)}


def ri_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = g + 2 lambda I_k (w - w_t) on every parameter, the coefficient fixed for the round.

    One client: the coefficient as a Python float through ``add``'s ``alpha`` (the kernel a module's
    in-place ``.grad`` update runs: bit-identical), skipped when 0. Inside a cohort's vmap it is a
    per-client tensor, so ``g + c (w - w_t)``: the same value up to the rounding of the fused
    multiply-add (tests: 1e-5 relative)."""
    grads, new_buffers, loss = plain_direction(model, params, buffers, x, y, w_t, ctx, hp)
    if hp.vmapped:
        first = next(iter(grads.values()))
        coef = ctx["coef"].to(device=first.device, dtype=first.dtype)
        return {n: g + coef * (params[n] - w_t[n]) for n, g in grads.items()}, new_buffers, loss
    coef = float(ctx["coef"])
    if coef != 0:
        grads = {n: g.add(params[n] - w_t[n], alpha=coef) for n, g in grads.items()}
    return grads, new_buffers, loss


def ri_end(w_t, params, steps, ctx, state, hp):
    """No state carried to the next round; metric ``ri`` = I_k."""
    return {}, {}, {"ri": ctx["ri"]}


RI_FEDAVG = LocalUpdate("ri-fedavg", ri_direction, ri_begin, ri_end, keys=("ri-lambda",))
