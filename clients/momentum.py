"""Client-level momentum, the client maths FedCM and MoFedSAM share: every local step mixes the
method's own gradient with the server's global direction Δ (the previous round's mean update
per local step, ``strategies.parts.ClientMomentum``),

    d = α g + (1 − α) Δ,

g the method's gradient (FedCM: the cross-entropy gradient; MoFedSAM: SAM's), Δ received after
the weights as ``delta`` (zeros when absent: round 1), constant over the round. α g is the
direction (``scaled``); (1 − α) Δ is a gradient term (``momentum_terms``), so it is clipped with
the gradient, as the authors' code puts ⟨w, Δ⟩ in the loss before ``clip_grad_norm_``; weight
decay is added after, outside the mix, as their SGD's ``weight_decay``."""

from __future__ import annotations

from dataclasses import replace

import torch

from protocol.layout import cv_names_in_state_order, trainable_param_names
from protocol.traffic import CLIENT_MOMENTUM
from tasks.functional.core import Hyper, Tree
from tasks.functional.terms import Term, constant
from tasks.functional.update import Arrays


def momentum_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """Δ (``server["delta"]``; zeros on every trainable parameter when absent)."""
    delta = server.get("delta") or {n: torch.zeros_like(w, memory_format=torch.contiguous_format)
                                    for n, w in w_t.items()}
    return {"delta": delta}


def scaled(d: Tree, alpha: float) -> Tree:
    """α d: the share of the method's own gradient in the step."""
    return {n: g * alpha for n, g in d.items()}


def momentum_terms(alpha_key: str) -> tuple[Term, ...]:
    """+ (1 − α) Δ, α the run-config key ``alpha_key``, before the clip."""
    return (replace(constant("delta"), formula="+ (1 - alpha) delta",
                    coef=lambda hp: 1.0 - hp.keys[alpha_key]),)


def delta_names(model, cfg) -> list[str]:
    """Every trainable parameter, in state_dict order (the order Δ travels in)."""
    return cv_names_in_state_order(model, trainable_param_names(model, cfg))


def momentum_arrays() -> dict:
    """Δ received after the weights, one array per trainable parameter; nothing kept or sent."""
    (down,) = CLIENT_MOMENTUM.down
    return {"receives": {down: Arrays(delta_names)}}
