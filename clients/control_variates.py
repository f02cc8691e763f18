"""The control-variate family's client maths, shared by the methods built on it (SCAFFOLD,
FedPVR, FedGAM-CV, FedDC): c and c_i at the start of a round, the correction c − c_i added to
every step (``CORRECTION``, a gradient term), option II's c_i⁺ and the reply Δc_i at its end,
and the arrays that travel (``control_variate_arrays``). The server side is the part
``strategies.parts.ControlVariates`` (declared in ``strategies.control_variates``); the rules
are in docs/methods.md, "control variates"."""

from __future__ import annotations

from dataclasses import replace

import torch

from protocol.layout import cv_names_in_state_order
from protocol.traffic import CONTROL_VARIATES
from tasks.functional.core import Hyper, Tree, tree_norm
from tasks.functional.terms import POST_STEP, Term, constant
from tasks.functional.update import Arrays
from tasks.optim import effective_steps, scheduled_steps


def control_variate_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """c (``server["c"]``) and c_i (``state["ci"]``), zeros when absent (the first round), on
    the parameters that carry control variates (all of them unless ``server["c"]`` names fewer),
    and the step's correction c - c_i, constant over the round."""
    c = server.get("c") or {n: torch.zeros_like(w, memory_format=torch.contiguous_format) for n, w in w_t.items()}
    ci = state.get("ci") or {n: torch.zeros_like(v) for n, v in c.items()}
    return {"c": c, "ci": ci, "corr": {n: c[n] - ci[n] for n in c}}


def control_variate_update(w_t: Tree, params: Tree, c: Tree, ci: Tree, steps: int, lr: float,
                           momentum: float, factors: torch.Tensor | None = None) -> Tree:
    """SCAFFOLD option II: c_i+ = c_i - c + (w_t - w) / (lr K_eff), K_eff the momentum-corrected
    count of the round's ``steps`` (``tasks.optim.effective_steps``); c_i unchanged after no step.
    With an in-round schedule (``factors``, the steps' factors on lr: FedMoSWA's), lr K_eff is
    the scheduled rates' sum, lr ``tasks.optim.scheduled_steps`` (sum_k eta_k without momentum).
    The one place of this rule: SCAFFOLD, FedPVR, FedGAM-CV and FedMoSWA end their rounds with it."""
    if steps == 0:  # no local step: nothing was learned about this client's direction
        return {n: v.clone() for n, v in ci.items()}
    if factors is None:
        scale = 1.0 / (lr * effective_steps(steps, momentum))
    else:
        scale = 1.0 / (lr * scheduled_steps(factors[:steps].tolist(), momentum))
    return {n: ci[n] - c[n] + (w_t[n] - params[n]) * scale for n in ci}


def control_variate_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """state c_i+, reply delta c_i = c_i+ - c_i, metric ``ci_norm`` = ||c_i+||. K_eff counts the
    momentum's steps when the correction goes through the optimiser; with SCAFFOLD's
    ``post-step`` reading (the correction outside the momentum buffer) it is K, as the
    benchmarks that read it so divide."""
    momentum = 0.0 if hp.keys.get(CORRECTION_KEY) == POST else hp.momentum
    ci_new = control_variate_update(w_t, params, ctx["c"], ctx["ci"], steps, hp.lr, momentum)
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
    client side of the protocol whose server side is ``strategies.parts.ControlVariates``:

    - c_i, kept per client under record ``cv-ci``, zero until the client first trains;
    - c, received after the model's state arrays, one array per parameter that carries a
      control variate (``select``: every trainable parameter, or FedPVR's last Linear layers),
      in state_dict order;
    - delta c_i = c_i+ - c_i sent after the trained weights, the same count and shapes.

    The rule for c_i+ is ``control_variate_update`` (K_eff, not K, with momentum: dividing by K
    over-counts a momentum client's direction by about 1/(1 - beta), which feeds back through c
    over the rounds until the run diverges; the FedSOL authors' SCAFFOLD divides the same way).
    Option II needs a step linear in the gradient, so these methods refuse ``optimizer``
    adam/adamw before training (``strategies.parts.ControlVariates.check``)."""
    names = control_variate_names(select)
    (down,), (up,) = CONTROL_VARIATES.down, CONTROL_VARIATES.up
    return {"state": {"ci": Arrays(names, record="cv-ci")}, "receives": {down: Arrays(names)},
            "sends": {up: Arrays(names)}}


# + (c - c_i), the round's constant correction ``ctx["corr"]``, on the parameters with control
# variates, before the clip (the correction is part of the corrected gradient in SCAFFOLD's
# Algorithm 1 and in the codes that clip it)
CORRECTION = constant("corr")

# SCAFFOLD's run-config key for where its correction goes: "direction" (CORRECTION, above:
# through the clip, weight decay and momentum; c_i+ with K_eff) or "post-step" (NIID-Bench's
# and Flower's niid_bench SCAFFOLD: w <- w - lr (c - c_i) after the optimiser's step, outside
# its momentum buffer; c_i+ with the plain step count K)
CORRECTION_KEY = "scaffold-correction"
DIRECTION, POST = "direction", "post-step"


def correction_terms(key: str = CORRECTION_KEY) -> tuple[Term, ...]:
    """c - c_i at the place run-config ``key`` says, the direction when it is absent (a zero
    coefficient drops the other)."""
    return (replace(CORRECTION, coef=lambda hp: 0.0 if hp.keys.get(key) == POST else 1.0),
            replace(CORRECTION, formula="- lr (c - c_i) after the step", place=POST_STEP,
                    coef=lambda hp: 1.0 if hp.keys.get(key) == POST else 0.0))
