"""MOON: model-contrastive learning, pulling the local representation towards the global model's
and away from the client's previous local model's (Li, He, Song, CVPR 2021).

- Client: with z = the local model's representation of x (the output of `model.body`, the
  input of the classifier), z_g that of the frozen global model w_t (positive) and z_p that of
  the client's own model at the end of its previous round (negative), sim the cosine similarity
  and T the temperature,

  ```
  ℓ_con = −log( exp(sim(z, z_g)/T) / (exp(sim(z, z_g)/T) + exp(sim(z, z_p)/T)) )
  loss  = CE + μ ℓ_con                               (both averaged over the batch)
  ```

- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`): the change is all on the client.
- State: the client's model from the end of its last round, in `context.state`.
- Keys: `moon-mu` μ (1.0, ≥ 0; the MOON paper uses 1 to 5, the FedSOL authors' code 0.1),
  `moon-temperature` T (0.5, > 0).
- Readings: the representation is the body's output; no separate projection head is added.
  The first time a client is sampled it has no previous model and trains with CE alone, as
  Flower's MOON baseline does. The reference codes differ there only for a client that first
  joins after round 1: the official MOON code (Li et al., CVPR 2021) then uses the client's
  untrained local network (its own random initialisation, kept in the pool of all parties'
  networks) as the negative, and the FedSOL code (Lee et al., CVPR 2024) the initial global
  model w_0; both are a real negative with a non-zero gradient, so such a client's first update
  differs from fl-drift's. In round 1 all three agree: the official MOON code has no negative
  yet (the loss is zero) and in the FedSOL code the negative w_0 equals the positive w_t (a
  constant log 2).

Summary: client + μ model-contrastive loss | server - | client state previous local model |
server state - | traffic -
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from protocol.keys import Key, non_negative, positive
from tasks.functional.core import Hyper, Tree, call_part, clone_tree, eval_forward, value_grads
from tasks.functional.update import Arrays, LocalUpdate


def moon_contrastive(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float) -> torch.Tensor:
    """Batch mean of -log softmax([sim(z, z_g), sim(z, z_p)] / T)[0]."""
    pos = F.cosine_similarity(z, z_glob, dim=1)
    neg = F.cosine_similarity(z, z_prev, dim=1)
    logits = torch.stack([pos, neg], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


def moon_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """The global model's buffers (``server["buffers"]``), the previous local model
    (``state["prev"]``: its weights and buffers by state_dict name, split here) and ``has_prev`` (1.0, or 0.0 the first
    time a client is sampled: no previous model, then w_t stands in for it and the contrastive
    term is multiplied by 0, so every client of a cohort runs the same function)."""
    global_buffers = server.get("buffers", {})
    prev = state.get("prev")
    has_prev = prev is not None
    some = next(iter(w_t.values()))
    return {"global_buffers": global_buffers,
            "prev_params": {n: prev[n] for n in w_t} if has_prev else w_t,
            "prev_buffers": {n: t for n, t in prev.items() if n not in w_t} if has_prev else global_buffers,
            "has_prev": torch.tensor(float(has_prev), dtype=some.dtype, device=some.device)}


def moon_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = grad [CE(head(z), y) + mu has_prev l_con(z, z_g, z_p)], z = body(x) at w, z_g and z_p
    the eval-mode bodies of w_t and of the previous model (no gradient); mu = ``moon-mu``,
    T = ``moon-temperature``. The representation z is the body's output (``model.body``)."""
    z_glob = eval_forward(model, lambda: call_part(model, "body", w_t, ctx["global_buffers"], x, strict=True))
    z_prev = eval_forward(model, lambda: call_part(model, "body", ctx["prev_params"], ctx["prev_buffers"], x,
                                                   strict=True))
    weight = hp.keys["moon-mu"] * ctx["has_prev"]  # mu, or 0 without a previous model

    def objective(p):
        new_buffers = clone_tree(buffers)
        z = call_part(model, "body", p, new_buffers, x)
        ce = F.cross_entropy(call_part(model, "head", p, new_buffers, z), y)
        return (ce + weight * moon_contrastive(z, z_glob, z_prev, hp.keys["moon-temperature"]),), new_buffers

    (grads,), new_buffers, (loss,) = value_grads(objective, params, hp)
    return grads, new_buffers, carry, loss


def moon_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """The next round's previous model: this round's final weights and buffers (``prev``)."""
    return {"prev": {**params, **buffers}}, {}, {}


def model_entry_names(model, cfg) -> list[str]:
    """Every entry of the model's state_dict (weights and buffers), in its order."""
    return list(model.state_dict())


UPDATE = LocalUpdate("moon", moon_direction, moon_begin, moon_end, keys={  # mu: the paper's range 1-5
    "moon-mu": Key(1.0, non_negative, ">= 0"),
    "moon-temperature": Key(0.5, positive, "> 0"),
}, state={"prev": Arrays(model_entry_names, record="moon-prev", as_weights=True)}, step_cost=1.5, module=__name__)
