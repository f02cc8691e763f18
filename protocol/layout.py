"""Which entries of a model play which role: what a method's client and server must agree on.

Both sides of a method call the same function here (never a copy of it on each side), so the
arrays that travel beside the weights (control variates, BN entries kept local) cannot differ
between the client that sends them and the server that reads them.
"""

from __future__ import annotations

import math

import numpy as np
from torch import nn

from tasks.models import last_layers_param_names

# The largest float32. A reply whose squared norm exceeds it (finite values, norm above ~1.8e19) has
# a float32 norm that overflows: the server's float32 sums over it (the aggregate, SCAFFOLD's c, the
# screening norms) overflow too, as SCAFFOLD's cv_norm became inf at learning rate 3.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def squared_norm(arrays: list[np.ndarray]) -> float:
    """||arrays||^2 as one vector, over the floating arrays, with float64 squares (so a finite
    float32 value never overflows here); NaN or Inf when a value is."""
    floats = [a for a in map(np.asarray, arrays) if np.issubdtype(a.dtype, np.floating)]
    return float(sum(float(np.square(a, dtype=np.float64).sum()) for a in floats))


def all_finite(arrays: list[np.ndarray]) -> bool:
    """No NaN or Inf in any numeric array, and a float32 norm that is finite too (the squared
    norm, ``squared_norm``, at most ``FLOAT32_MAX``): finite values whose float32 norm overflows
    are as unusable as an Inf. The server leaves out a reply that fails it
    (``fl_app.server.recording.check_reply``) and the client then keeps its earlier state
    (``fl_app.node.drift_client.DriftClient.finish_round``): one test on both sides, so a client's c_i or h_i
    moves exactly when the server counts its update."""
    return squared_norm(arrays) <= FLOAT32_MAX  # False for NaN too


def reply_problem(arrays: list, sent_shapes: list[tuple] | None, squares=squared_norm, more: bool = False) -> str:
    """Why a client's reply cannot be used ('' when it can): another count or shapes of arrays
    than it was sent, non-finite values, or finite values whose float32 norm overflows
    (``all_finite``'s rule). The server's check of every reply
    (``fl_app.server.recording.check_reply``) and a cohort node's check of each client before it
    sums them (``protocol.cohort.sum_replies``): one rule on both sides. ``squares``: the
    squared norm in the arrays' library (numpy's ``squared_norm``; a node summing tensors on
    their device passes its own). ``more``: the reply carries groups after the arrays sent that
    answer none of them (``protocol.traffic.CLASS_STATISTICS``): at least as many arrays, the
    sent ones of the sent shapes (the groups' count is the strategy's split's)."""
    if sent_shapes is not None and more and len(arrays) < len(sent_shapes):
        return f"{len(arrays)} arrays, expected at least {len(sent_shapes)}"
    if sent_shapes is not None and not more and len(arrays) != len(sent_shapes):
        return f"{len(arrays)} arrays, expected {len(sent_shapes)}"
    if sent_shapes is not None:
        for i, (a, shape) in enumerate(zip(arrays, sent_shapes)):
            if tuple(a.shape) != tuple(shape):
                return f"array {i} has shape {tuple(a.shape)}, expected {tuple(shape)}"
    total = squares(arrays)
    if not math.isfinite(total):
        return "non-finite values (NaN or Inf)"
    if total > FLOAT32_MAX:
        return (f"its float32 norm is not finite (finite values, but norm^2 = {total:.3g}, over float32's"
                f" {FLOAT32_MAX:.3g}: the server's float32 sums over it would overflow)")
    return ""


def trainable_param_names(model: nn.Module, cfg: dict) -> list[str]:
    """Every trainable parameter: the default control-variate scope (SCAFFOLD, FedGAM-CV)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def pvr_param_names(model: nn.Module, cfg: dict) -> list[str]:
    """FedPVR's control-variate scope: weights and biases of the last ``pvr-layers`` Linear layers."""
    return last_layers_param_names(model, cfg["pvr-layers"], nn.Linear)


def cv_names_in_state_order(model: nn.Module, names: list[str]) -> list[str]:
    """``names`` in the model's state_dict order: the order control variates travel in."""
    wanted = set(names)
    params = {n for n, p in model.named_parameters() if p.requires_grad}
    unknown = wanted - params
    if unknown:
        raise ValueError(f"control variates asked for non-trainable or unknown {sorted(unknown)}")
    return [n for n in model.state_dict() if n in wanted]


def bn_indices(model: nn.Module) -> list[int]:
    """Positions in the state_dict of the entries owned by BatchNorm modules (FedBN keeps them local)."""
    prefixes = tuple(
        f"{name}." for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
    )
    return [i for i, key in enumerate(model.state_dict()) if prefixes and key.startswith(prefixes)]


def bn_names(model: nn.Module, cfg: dict | None = None) -> list[str]:
    """The state_dict names of the entries owned by BatchNorm modules, in state_dict order (FedBN
    keeps them local): the entries at ``bn_indices``."""
    names = list(model.state_dict())
    return [names[i] for i in bn_indices(model)]


def trainable_mask(model: nn.Module) -> list[bool]:
    """For each state_dict entry: is it a trainable parameter (not a buffer)?"""
    params = {name for name, _ in model.named_parameters()}
    return [name in params for name in model.state_dict()]
