"""SCAFFOLD: stochastic controlled averaging (Karimireddy et al., ICML 2020), option II control
variates on every trainable parameter.

- Client: plain local SGD corrected on every step, d = g − c_i + c; then c_i⁺ and Δc_i as in
  the [control-variate rules](#control-variates) (c_i⁺ = c_i − c + (w_t − w) / (η K_eff), K_eff
  the momentum-corrected count of all local steps of the round).
- Server (`strategies/scaffold.py`): weighted mean of the weights;
  c ← c + (1/N) Σ_{i∈S_t} Δc_i.
- State: c_i per client, c on the server; c travels with the model, Δc_i with the reply.
- Keys: `cv-divisor` (`total`, SCAFFOLD's D = N; `participants`, D = |S_t| as FedGAM-CV's
  Eq. 22, for ablations that separate FedGAM-CV's divisor from its GAM term; the two agree
  under full participation); it reads `momentum` (for K_eff).
- Readings: the weights take the n_k-weighted mean with global step size 1; K counts all local
  steps of the round, not the batches of one epoch.

Summary: client + c − c_i | server c update | client state c_i | server state c | traffic c
down, Δc_i up
"""

from __future__ import annotations

import torch

from protocol.layout import cv_names_in_state_order, trainable_param_names
from tasks.functional.core import Hyper, Tree, plain_direction, tree_norm
from tasks.functional.update import Arrays, LocalUpdate
from tasks.optim import effective_steps


def control_variate_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """c (``server["c"]``) and c_i (``state["ci"]``), zeros when absent (the first round), on
    the parameters that carry control variates (all of them unless ``server["c"]`` names fewer),
    and the step's correction c - c_i, constant over the round."""
    c = server.get("c") or {n: torch.zeros_like(w, memory_format=torch.contiguous_format) for n, w in w_t.items()}
    ci = state.get("ci") or {n: torch.zeros_like(v) for n, v in c.items()}
    return {"c": c, "ci": ci, "corr": {n: c[n] - ci[n] for n in c}}


def control_variate_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = g - c_i + c on the parameters with control variates, g elsewhere."""
    grads, new_buffers, carry, loss = plain_direction(model, params, buffers, x, y, w_t, ctx, carry, hp)
    corr = ctx["corr"]
    return {n: g.add(corr[n]) if n in corr else g for n, g in grads.items()}, new_buffers, carry, loss


def control_variate_update(w_t: Tree, params: Tree, c: Tree, ci: Tree, steps: int, lr: float,
                           momentum: float) -> Tree:
    """SCAFFOLD option II: c_i+ = c_i - c + (w_t - w) / (lr K_eff), K_eff the momentum-corrected
    count of the round's ``steps`` (``tasks.optim.effective_steps``); c_i unchanged after no step.
    The one place of this rule: SCAFFOLD, FedPVR and FedGAM-CV end their rounds with it."""
    if steps == 0:  # no local step: nothing was learned about this client's direction
        return {n: v.clone() for n, v in ci.items()}
    scale = 1.0 / (lr * effective_steps(steps, momentum))
    return {n: ci[n] - c[n] + (w_t[n] - params[n]) * scale for n in ci}


def control_variate_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """state c_i+, reply delta c_i = c_i+ - c_i, metric ``ci_norm`` = ||c_i+||."""
    ci_new = control_variate_update(w_t, params, ctx["c"], ctx["ci"], steps, hp.lr, hp.momentum)
    delta = {n: ci_new[n] - ctx["ci"][n] for n in ci_new}
    return {"ci": ci_new}, {"delta_c": delta}, {"ci_norm": tree_norm(ci_new.values())}


def control_variate_names(select):
    """The model entries that carry control variates, in state_dict order (the order c, c_i and
    delta c_i travel and are kept in), from ``select(model, cfg)``."""
    def names(model, cfg):
        return cv_names_in_state_order(model, select(model, cfg))
    return names


def control_variate_arrays(select) -> dict:
    """The declarations every control-variate method shares (SCAFFOLD, FedPVR, FedGAM-CV), the
    client side of the protocol whose server side is ``strategies.scaffold.ControlVariateStrategy``:

    - c_i, kept per client under record ``cv-ci``, zero until the client first trains;
    - c, received after the model's state arrays, one array per parameter that carries a
      control variate (``select``: every trainable parameter, or FedPVR's last Linear layers),
      in state_dict order;
    - delta c_i = c_i+ - c_i sent after the trained weights, the same count and shapes.

    The rule for c_i+ is ``control_variate_update`` (K_eff, not K, with momentum: dividing by K
    over-counts a momentum client's direction by about 1/(1 - beta), which feeds back through c
    over the rounds until the run diverges; the FedSOL authors' SCAFFOLD divides the same way).
    Option II needs a step linear in the gradient, so these methods refuse ``optimizer``
    adam/adamw before training (``ControlVariateStrategy.resolve_config``)."""
    names = control_variate_names(select)
    return {"state": {"ci": Arrays(names, record="cv-ci")}, "receives": {"c": Arrays(names)},
            "sends": {"delta_c": Arrays(names)}}


UPDATE = LocalUpdate("scaffold", control_variate_direction, control_variate_begin, control_variate_end,
                     **control_variate_arrays(trainable_param_names), module=__name__)
