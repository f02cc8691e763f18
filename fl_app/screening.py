"""Update screening: bound or drop each client's weight update before the method aggregates.

Run-config key ``screening`` (``none`` by default) and its parameters:

- ``clip``: each update Delta_k = w_k - w_t is scaled by s_k = min(1, B / ||Delta_k||), with
  B = ``screen-clip-norm`` when > 0, else ``screen-clip-multiple`` (1) x the median of the
  round's update norms (norm clipping, Sun et al. 2019, "Can you really backdoor FL?"; the
  median as the adaptive bound, as in Andrew et al., NeurIPS 2021). A clipped attacker still
  moves the model by up to B in its own direction, so the bound is tight by default: at 3 x
  the median, one sign-flipped client in ten held FedAvg on MNIST 7 points below the clean run.
- ``reject``: a reply whose ||Delta_k|| exceeds ``screen-reject-multiple`` (3) x the round's
  median norm
  is dropped (counted in ``num_rejected``, its node named in the log).
- ``median`` / ``trimmed-mean``: the coordinate-wise median (Yin et al., ICML 2018) or
  trimmed mean (cut ``screen-trim`` of the replies at each end) of the weights, computed
  with Flower's ``aggregate_median`` / ``aggregate_trimmed_avg`` (those of its FedMedian and
  FedTrimmedAvg). Every reply's weights are replaced by that robust value, so the method's
  own mean of them returns it (up to float rounding). Only for methods whose aggregation is
  a mean of the client weights: a strategy class lists the modes it supports in
  ``SCREENING`` (``strategies/base.py``); other combinations fail at config validation.

What counts: w_t is what the server sent (the global model), and Delta_k covers the first N
arrays of a reply, N = the number of model state arrays. Only floating-point arrays count in
the norm and change: integer buffers (BatchNorm's ``num_batches_tracked``) are left as sent.
BatchNorm running statistics are floating-point state that the methods average, so they
count and are clipped like the weights (a client could otherwise poison them freely).
Arrays the server does not aggregate (a strategy's ``screen_skip``: FedBN's local BN entries)
neither count nor change.

A method's extra arrays after the N weights (SCAFFOLD-style delta c_i) follow their reply:
a rejected reply is dropped whole, so its extras are never applied; a clipped reply's
floating extras are scaled by the same s_k, so clipping shrinks every contribution of that
client to the server state by one factor (rejection being s_k = 0, no screening s_k = 1).
Extras are not screened on their own norm: an attacker that sends a normal weight update
with a poisoned delta c_i is not caught (see the README).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
from flwr.common import (
    FitRes,
    Parameters,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg

from tasks.keys import ConfigError

log = logging.getLogger("flwr.fl_drift")

ROBUST_MODES = ("median", "trimmed-mean")


def check_screening(cfg: dict, strategy_cls: type) -> None:
    """Refuse a screening mode the method's strategy does not declare in ``SCREENING``."""
    mode = cfg["screening"]
    if mode == "none":
        return
    allowed = tuple(getattr(strategy_cls, "SCREENING", ("clip", "reject")))
    if mode not in allowed:
        why = getattr(strategy_cls, "SCREENING_WHY", "")
        raise ConfigError(
            f"run-config key 'screening' = {mode!r} is invalid for strategy {cfg['strategy']!r}"
            f"{': ' + why if why else ''}; valid choices for it: {', '.join(('none',) + allowed)}"
        )


def screened(i: int, a: np.ndarray, skip: frozenset[int]) -> bool:
    """Does state array ``i`` take part in screening?"""
    return i not in skip and np.issubdtype(a.dtype, np.floating)


def update_norm(weights: list[np.ndarray], w_t: list[np.ndarray], skip: frozenset[int] = frozenset()) -> float:
    """||w_k - w_t|| (L2, float64) over the screened arrays."""
    total = 0.0
    for i, (a, ref) in enumerate(zip(weights, w_t)):
        if screened(i, ref, skip):
            total += float(((a.astype(np.float64) - ref.astype(np.float64)) ** 2).sum())
    return math.sqrt(total)


def clip_factor(norm: float, bound: float) -> float:
    """s = min(1, bound / norm); 1 for a zero update."""
    return 1.0 if norm <= bound else bound / norm


def scale_update(arrays: list[np.ndarray], w_t: list[np.ndarray], s: float,
                 skip: frozenset[int] = frozenset()) -> list[np.ndarray]:
    """A reply with its update scaled by s: weights w_t + s (w_k - w_t) on screened arrays,
    floating extras (after the len(w_t) weights) times s; everything else unchanged."""
    n = len(w_t)
    out = list(arrays)
    for i, a in enumerate(arrays):
        if i < n and screened(i, w_t[i], skip):
            ref = w_t[i].astype(np.float64)
            out[i] = (ref + s * (a.astype(np.float64) - ref)).astype(a.dtype)
        elif i >= n and np.issubdtype(a.dtype, np.floating):
            out[i] = (s * a.astype(np.float64)).astype(a.dtype)
    return out


def robust_weights(clients: list[list[np.ndarray]], w_t: list[np.ndarray], mode: str, trim: float,
                   skip: frozenset[int] = frozenset()) -> dict[int, np.ndarray]:
    """Coordinate-wise median or trimmed mean of the screened weight arrays, by index."""
    index = [i for i, ref in enumerate(w_t) if screened(i, ref, skip)]
    results = [([c[i] for i in index], 1) for c in clients]
    if mode == "median":
        values = aggregate_median(results)
    else:
        values = aggregate_trimmed_avg(results, trim)
    return {i: np.asarray(v).astype(w_t[i].dtype) for i, v in zip(index, values)}


@dataclass
class Decision:
    """What screening decided for one round: per reply a keep flag and a factor."""

    norms: list[float]
    keep: list[bool]
    factors: list[float]
    bound: float | None
    median: float
    robust: dict[int, np.ndarray] = field(default_factory=dict)


def decide(clients: list[list[np.ndarray]], w_t: list[np.ndarray], mode: str, clip_norm: float,
           multiple: float, trim: float, skip: frozenset[int] = frozenset()) -> Decision:
    """The screening of one round's replies (``clients``: each reply's arrays, weights first)."""
    norms = [update_norm(c[: len(w_t)], w_t, skip) for c in clients]
    median = float(np.median(norms)) if norms else 0.0
    keep = [True] * len(clients)
    factors = [1.0] * len(clients)
    bound = None
    robust: dict[int, np.ndarray] = {}
    if mode == "clip":
        bound = clip_norm if clip_norm > 0 else multiple * median
        factors = [clip_factor(n, bound) for n in norms]
    elif mode == "reject":
        bound = multiple * median
        keep = [n <= bound for n in norms]
    elif mode in ROBUST_MODES and clients:
        robust = robust_weights([c[: len(w_t)] for c in clients], w_t, mode, trim, skip)
    return Decision(norms, keep, factors, bound, median, robust)


class Screening:
    """Applies ``screening`` to the replies of each round (called by ``RecordingStrategy``)."""

    def __init__(self, cfg: dict, skip=()):
        self.mode = cfg["screening"]
        self.clip_norm = cfg["screen-clip-norm"]
        self.clip_multiple = cfg["screen-clip-multiple"]
        self.reject_multiple = cfg["screen-reject-multiple"]
        self.trim = cfg["screen-trim"]
        self.skip = frozenset(skip)
        self.w_t: list[np.ndarray] | None = None

    @property
    def active(self) -> bool:
        return self.mode != "none"

    def begin_round(self, parameters: Parameters) -> None:
        """Remember w_t, the global model the round's clients received."""
        self.w_t = parameters_to_ndarrays(parameters) if self.active else None

    def apply(self, server_round: int, accepted: list, row: dict) -> list:
        """The replies to aggregate: rejected ones removed, the others possibly rewritten.
        Writes ``num_clipped``, ``screen_bound``, ``screen_median_norm`` into ``row``."""
        if not self.active or not accepted or self.w_t is None:
            return accepted
        clients = [parameters_to_ndarrays(res.parameters) for _, res in accepted]
        multiple = self.clip_multiple if self.mode == "clip" else self.reject_multiple
        d = decide(clients, self.w_t, self.mode, self.clip_norm, multiple, self.trim, self.skip)
        row["num_clipped"] = sum(f < 1.0 for f in d.factors)
        row["screen_bound"] = d.bound if d.bound is not None else ""
        row["screen_median_norm"] = d.median
        out = []
        for (client, res), arrays, norm, keep, s in zip(accepted, clients, d.norms, d.keep, d.factors):
            if not keep:
                log.warning("round %d: rejected the update of node %s: update norm %.4g > %.4g "
                            "(%g x the median %.4g; screening = reject)",
                            server_round, client.cid, norm, d.bound, multiple, d.median)
                continue
            if s < 1.0:
                arrays = scale_update(arrays, self.w_t, s, self.skip)
            elif d.robust:
                arrays = [d.robust.get(i, a) for i, a in enumerate(arrays)]
            else:
                out.append((client, res))
                continue
            out.append((client, FitRes(res.status, ndarrays_to_parameters(arrays), res.num_examples, res.metrics)))
        return out
