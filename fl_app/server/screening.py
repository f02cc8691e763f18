"""Update screening: bound or drop each client's weight update before the method aggregates.

Run-config key ``screening`` (``none`` by default) and its parameters:

- ``clip``: each update Delta_k = w_k - w_t is scaled by s_k = min(1, B / ||Delta_k||), with
  B = ``screen-clip-norm`` when > 0, else ``screen-clip-multiple`` (1) x the median of the
  round's update norms (norm clipping, Sun et al. 2019, "Can you really backdoor FL?"; the
  median as the adaptive bound, as in Andrew et al., NeurIPS 2021). A clipped attacker still
  moves the model by up to B in its own direction, so the bound is tight by default: at 3 x
  the median, one sign-flipped client in ten held the weighted mean on MNIST 7 points below the clean run.
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

What counts: w_t is the model the server sent (the global model; FedACG's look-ahead), and Delta_k covers the first N
arrays of a reply, N = the number of model state arrays. Only floating-point arrays count in
the norm and change: integer buffers (BatchNorm's ``num_batches_tracked``) are left as sent.
BatchNorm running statistics are floating-point state that the methods average, so they
count and are clipped like the weights (a client could otherwise poison them freely).
Arrays the server does not aggregate (a strategy's ``screen_skip``: entries kept on the clients, BatchNorm's say)
neither count nor change.

A method's extra arrays after the N weights (control-variate updates, delta c_i) follow their
reply: a rejected reply is dropped whole, so its extras are never applied; a clipped reply's
floating extras are scaled by the same s_k, so clipping shrinks every contribution of that
client to the server state by one factor (rejection being s_k = 0, no screening s_k = 1).
They are also screened, as a second group of the reply's update, by the same rule, so that a
client sending a normal weight update with a poisoned delta c_i is caught
(tests/server/test_screening_extras.py): ``clip`` bounds ||e_k|| (L2 over the floating extras)
by ``screen-clip-multiple`` x the round's median ||e||, s_k being the smaller of the two
groups' factors; ``reject`` drops a reply whose ||e_k|| exceeds ``screen-reject-multiple`` x
the median ||e||, as it drops one whose ||Delta_k|| is too large; ``krum`` / ``multi-krum``
score the concatenation of Delta_k and e_k x (median ||Delta|| / median ||e||). Each group is
held against its own median, not one norm over both: the two are in different units (delta c_i
is a gradient, about Delta / (K lr)), so in one norm the larger would hide the other, and honest
extras would pad a weight attacker's norm past the documented bound. Krum has no per-group
form (its picks on two groups need not agree), so it reads both groups rescaled to one scale.
The rules that replace the weights by a robust value (``median`` and the like) are refused for
methods with extras. What screening still leaves open is the clients' own state: a rejected
SCAFFOLD client's c_i has moved as if its update was applied.

Byzantine-robust rules for a declared number of attackers f = ``screen-attackers``:

- ``krum`` / ``multi-krum`` (Blanchard et al., NeurIPS 2017): each reply's score is the sum of
  the squared distances from its update to its n - f - 2 nearest other updates (n = the
  round's replies); ``krum`` keeps the one reply of lowest score, ``multi-krum`` the n - f
  of lowest score. The others are dropped whole, as ``reject`` drops a reply (extras
  included, counted in ``num_rejected``), so these two are allowed wherever ``reject`` is,
  methods with extra arrays included. For the weighted mean of weights the result is exactly
  Flower's ``aggregate_krum`` (its mean of the kept replies weighted by examples;
  tests/server/test_screening_robust.py checks this).
- ``bulyan`` (El Mhamdi et al., ICML 2018): Flower's ``aggregate_bulyan`` with Krum as its
  selection rule: a robust value that replaces every reply's weights like ``median``, so it
  is allowed wherever ``median`` is.
- ``trimmed-mean`` with f >= 1 cuts exactly f replies at each end (``screen-trim`` is then
  unused), so f attackers on one side are all cut.

Each rule needs enough replies for its guarantee: ``krum`` / ``multi-krum`` n >= 2f + 3,
``bulyan`` n >= 4f + 3, ``trimmed-mean`` n >= 2f + 2. A round with fewer accepted replies
does not update the model (every reply is dropped, with a warning naming the rule and the
count); f must be >= 1 for the three Byzantine rules (refused at validation otherwise). A
federation whose rounds sample fewer clients than the rule needs is refused before launch by
``check_replies`` (the runner's ``--check`` and the ServerApp's start-up), naming the rule.

``geometric-median`` (smoothed Weiszfeld, RFA) and ``centered-clip`` (``screen-cc-tau``,
``screen-cc-iters``; centered at the zero update) replace the weights like ``median``, and
``screen-pre`` (``arc``, ``nnm``, ``bucketing``, chained with ``+``) rewrites the updates, as rows
of equal weight, before any rule but ``none``, ``clip`` and ``reject``; with it every rule's
result replaces the weights (``rule_on_rows``: Flower's functions where Flower has the rule,
``fl_app.server.robust_rules`` for the others). docs/screening.md has each formula.
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
from flwr.server.strategy.aggregate import (
    aggregate_bulyan,
    aggregate_krum,
    aggregate_median,
    aggregate_trimmed_avg,
)

from fl_app.common.screening_modes import ROBUST_MODES, SELECTION_MODES, parse_pre
from fl_app.server import robust_rules
from protocol.keys import ConfigError

log = logging.getLogger("flwr.fl_drift")

def rule_replies(mode: str, attackers: int) -> int:
    """The fewest rows (updates, or what ``screen-pre`` left) ``mode`` holds its guarantee on."""
    if mode in SELECTION_MODES:
        return 2 * attackers + 3
    if mode == "bulyan":
        return 4 * attackers + 3
    if mode == "trimmed-mean" and attackers > 0:
        return 2 * attackers + 2
    return 1


def rows_left(n: int, pre: tuple[str, ...], attackers: int, bucket: int) -> int:
    """How many rows ``n`` replies become through the ``pre`` chain: 0 where a step lacks the
    rows it needs (``arc`` and ``nnm`` need more rows than f; ``bucketing`` leaves ceil(n / s))."""
    for step in pre:
        if step in ("arc", "nnm") and n <= attackers:
            return 0
        if step == "bucketing":
            n = -(-n // bucket)
    return n


def min_replies(mode: str, attackers: int, pre: tuple[str, ...] = (), bucket: int = 2) -> int:
    """The fewest replies for which ``mode`` (after the ``pre`` chain, ``screen-pre``) holds its
    guarantee against ``attackers``."""
    need = rule_replies(mode, attackers)
    n = need
    if pre:
        n = 1
        while rows_left(n, pre, attackers, bucket) < need:
            n += 1
    return n


RULES = {"krum": "2f + 3", "multi-krum": "2f + 3", "bulyan": "4f + 3", "trimmed-mean": "2f + 2"}


def sampled_per_round(cfg: dict, num_nodes: int) -> int:
    """The clients a round samples from ``num_nodes`` connected ones: Flower's
    ``FedAvg.num_fit_clients`` (max(int(fraction-fit x nodes), min-fit-clients)), which every
    method's ``configure_fit`` uses."""
    from flwr.server.strategy import FedAvg

    flower = FedAvg(fraction_fit=cfg["fraction-fit"], min_fit_clients=cfg["min-fit-clients"])
    return flower.num_fit_clients(num_nodes)[0]


def check_replies(cfg: dict, num_nodes: int) -> None:
    """Refuse a Byzantine rule whose ``min_replies`` exceeds the clients a round samples from
    ``num_nodes``: every round would drop every reply, and the run stop after 0 rounds.
    (Drop-outs, ``drop-rate``, can still leave a round short: that round does not update.)"""
    mode, f = cfg["screening"], cfg.get("screen-attackers", 0)
    pre, bucket = parse_pre(cfg.get("screen-pre", "none")), cfg.get("screen-bucket-size", 2)
    need = min_replies(mode, f, pre, bucket)
    sampled = sampled_per_round(cfg, num_nodes)
    if sampled >= need:
        return
    largest = max((g for g in range(f) if min_replies(mode, g, pre, bucket) <= sampled), default=0)
    lower = f"lower screen-attackers to {largest}" if largest >= 1 else f"use another screening than {mode!r}"
    rule = f"n >= {RULES[mode]} = {need}" if mode in RULES and not pre else f"n >= {need}"
    after = f" (screen-pre = {'+'.join(pre)}, screen-bucket-size {bucket})" if pre else ""
    raise ConfigError(
        f"screening = {mode!r} with screen-attackers f = {f}{after} needs {rule} replies per round,"
        f" but a round samples only n = {sampled} (fraction-fit {cfg['fraction-fit']:g} x {num_nodes} clients,"
        f" min-fit-clients {cfg['min-fit-clients']}): every reply would be dropped; sample at least {need} clients"
        f" (more clients or a larger fraction-fit) or {lower}"
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


def extras_norm(extras: list[np.ndarray]) -> float:
    """||e|| (L2, float64) over a reply's floating extra arrays (those after its weights)."""
    floating = [a for a in extras if np.issubdtype(a.dtype, np.floating)]
    return math.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in floating))


def has_extras(clients: list[list[np.ndarray]], n: int) -> bool:
    """Whether the replies carry floating extra arrays after their ``n`` weights."""
    return any(np.issubdtype(a.dtype, np.floating) and a.size for c in clients for a in c[n:])


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
                   skip: frozenset[int] = frozenset(), attackers: int = 0) -> dict[int, np.ndarray]:
    """Coordinate-wise median, trimmed mean or Bulyan (Flower's functions) of the screened
    weight arrays, by index. With ``attackers`` = f >= 1 the trimmed mean cuts exactly f
    replies at each end (its share (f + 1/2) / n floors to f in Flower's ``int(share * n)``)."""
    index = [i for i, ref in enumerate(w_t) if screened(i, ref, skip)]
    results = [([c[i] for i in index], 1) for c in clients]
    if mode == "median":
        values = aggregate_median(results)
    elif mode == "bulyan":  # aggregate_bulyan pops from its list: it gets its own
        values = aggregate_bulyan(list(results), attackers, aggregate_krum, to_keep=0)
    elif attackers > 0:
        values = aggregate_trimmed_avg(results, (attackers + 0.5) / len(results))
    else:
        values = aggregate_trimmed_avg(results, trim)
    return {i: np.asarray(v).astype(w_t[i].dtype) for i, v in zip(index, values)}


def flat_updates(clients: list[list[np.ndarray]], w_t: list[np.ndarray],
                 skip: frozenset[int] = frozenset()) -> tuple[np.ndarray, list[int]]:
    """The updates as rows (float64, n x d) over the screened arrays, and those arrays' indices."""
    index = [i for i, ref in enumerate(w_t) if screened(i, ref, skip)]
    rows = [np.concatenate([(c[i].astype(np.float64) - w_t[i].astype(np.float64)).ravel() for i in index])
            for c in clients]
    return np.stack(rows), index


def unflatten(v: np.ndarray, w_t: list[np.ndarray], index: list[int]) -> dict[int, np.ndarray]:
    """w_t + v, array by array (in each array's dtype), for the screened arrays ``index``."""
    out, start = {}, 0
    for i in index:
        size = w_t[i].size
        out[i] = (w_t[i].astype(np.float64) + v[start:start + size].reshape(w_t[i].shape)).astype(w_t[i].dtype)
        start += size
    return out


def pre_aggregate(rows: np.ndarray, pre: tuple[str, ...], attackers: int, bucket: int,
                  rng: np.random.Generator) -> np.ndarray:
    """The rows after each ``screen-pre`` step in turn (``fl_app.server.robust_rules``)."""
    for step in pre:
        if step == "arc":
            rows = robust_rules.arc(rows, attackers)
        elif step == "nnm":
            rows = robust_rules.nnm(rows, attackers)
        else:
            rows = robust_rules.bucketing(rows, bucket, rng)
    return rows


def rule_on_rows(rows: np.ndarray, mode: str, trim: float, attackers: int, cc: tuple[float, int]
                 ) -> tuple[np.ndarray, float | None]:
    """One update from the rows, each weighing 1, and the bound it used (centered-clip's tau):
    Flower's functions where Flower has the rule (median, trimmed mean, Bulyan, Krum: its
    ``aggregate_krum``, the mean of the kept rows), ``robust_rules`` for the others."""
    results = [([r], 1) for r in rows]
    if mode == "geometric-median":
        return robust_rules.geometric_median(rows), None
    if mode == "centered-clip":
        tau = cc[0] if cc[0] > 0 else float(np.median(np.linalg.norm(rows, axis=1)))
        return robust_rules.centered_clip(rows, tau, cc[1]), tau
    if mode == "median":
        values = aggregate_median(results)
    elif mode == "bulyan":
        values = aggregate_bulyan(list(results), attackers, aggregate_krum, to_keep=0)
    elif mode in SELECTION_MODES:
        values = aggregate_krum(results, attackers, 0 if mode == "krum" else max(1, len(rows) - attackers))
    else:
        values = aggregate_trimmed_avg(results, (attackers + 0.5) / len(rows) if attackers > 0 else trim)
    return np.asarray(values[0], np.float64), None


def krum_scores(clients: list[list[np.ndarray]], w_t: list[np.ndarray], attackers: int,
                skip: frozenset[int] = frozenset(), extras_scale: float | None = None) -> list[float]:
    """Krum's score of each reply (Blanchard et al. 2017): the sum of the squared L2
    distances from its screened arrays to those of its n - f - 2 nearest other replies
    (at least 1, as in Flower's ``aggregate_krum``), in float64. With ``extras_scale`` the
    floating extras after the weights count too, times that scale (``decide``: the ratio of the
    round's median norms, so that both groups weigh alike)."""
    index = [i for i, ref in enumerate(w_t) if screened(i, ref, skip)]
    n = len(w_t)
    flat = np.stack([np.concatenate([c[i].astype(np.float64).ravel() for i in index]
                                    + ([extras_scale * a.astype(np.float64).ravel() for a in c[n:]
                                        if np.issubdtype(a.dtype, np.floating)] if extras_scale is not None else []))
                     for c in clients])
    dist = np.array([[float(((a - b) ** 2).sum()) for b in flat] for a in flat])
    nearest = max(1, len(clients) - attackers - 2)
    scores = []
    for k, row in enumerate(dist):
        others = np.delete(row, k)
        scores.append(float(np.sort(others)[:nearest].sum()))
    return scores


def krum_keep(scores: list[float], mode: str, attackers: int) -> list[bool]:
    """Which replies Krum (the one of lowest score) or Multi-Krum (the n - f of lowest
    score, ties broken as Flower's ``aggregate_krum`` does) keeps."""
    n = len(scores)
    if mode == "krum":  # Flower: weights[np.argmin(scores)]
        best = {int(np.argmin(scores))}
    else:  # Flower: np.argsort(scores)[::-1][len(scores) - to_keep:]
        best = set(np.argsort(scores)[::-1][n - max(1, n - attackers):].tolist())
    return [k in best for k in range(n)]


@dataclass
class Decision:
    """What screening decided for one round: per reply a keep flag and a factor."""

    norms: list[float]
    keep: list[bool]
    factors: list[float]
    bound: float | None
    median: float
    robust: dict[int, np.ndarray] = field(default_factory=dict)
    extras_norms: list[float] = field(default_factory=list)  # ||e_k|| of the extras; [] without any
    extras_bound: float | None = None  # clip's or reject's bound on them


def decide(clients: list[list[np.ndarray]], w_t: list[np.ndarray], mode: str, clip_norm: float,
           multiple: float, trim: float, skip: frozenset[int] = frozenset(), attackers: int = 0,
           pre: tuple[str, ...] = (), bucket: int = 2, cc: tuple[float, int] = (0.0, 3),
           rng: np.random.Generator | None = None) -> Decision:
    """The screening of one round's replies (``clients``: each reply's arrays, weights first).
    Fewer replies than ``min_replies``: every reply is dropped. ``pre``: the ``screen-pre`` chain
    (``bucket``: its s); ``cc``: centered-clip's (tau, iterations); ``rng``: bucketing's order.

    Replies with floating extras after the weights (a method's delta c_i) are screened on both
    groups by the same rule (module docstring): ``clip`` and ``reject`` bound each group by
    ``multiple`` x that group's median norm (the weights by ``clip_norm`` instead when > 0), a
    reply scaled by the smaller factor or rejected when either group is over; Krum's distances
    are over the weights and the extras scaled by median ||Delta|| / median ||e||."""
    norms = [update_norm(c[: len(w_t)], w_t, skip) for c in clients]
    median = float(np.median(norms)) if norms else 0.0
    extras = has_extras(clients, len(w_t))
    e_norms = [extras_norm(c[len(w_t):]) for c in clients] if extras else []
    e_median = float(np.median(e_norms)) if e_norms else 0.0
    e_bound = multiple * e_median if extras and mode in ("clip", "reject") else None
    keep = [True] * len(clients)
    factors = [1.0] * len(clients)
    bound = None
    robust: dict[int, np.ndarray] = {}
    weights = [c[: len(w_t)] for c in clients]
    if clients and len(clients) < min_replies(mode, attackers, pre, bucket):
        keep = [False] * len(clients)
    elif mode == "clip":
        bound = clip_norm if clip_norm > 0 else multiple * median
        factors = [clip_factor(n, bound) for n in norms]
        if extras:
            factors = [min(s, clip_factor(e, e_bound)) for s, e in zip(factors, e_norms)]
    elif mode == "reject":
        bound = multiple * median
        keep = [n <= bound for n in norms]
        if extras:
            keep = [k and e <= e_bound for k, e in zip(keep, e_norms)]
    elif mode in SELECTION_MODES and clients and not pre:
        scale = (median / e_median if median > 0 and e_median > 0 else 1.0) if extras else None
        keep = krum_keep(krum_scores(clients if extras else weights, w_t, attackers, skip, scale), mode, attackers)
    elif mode in ("median", "trimmed-mean", "bulyan") and clients and not pre:
        robust = robust_weights(weights, w_t, mode, trim, skip, attackers)
    elif clients and (pre or mode in ROBUST_MODES):
        rows, index = flat_updates(weights, w_t, skip)
        rows = pre_aggregate(rows, pre, attackers, bucket, rng or np.random.default_rng(0))
        v, bound = rule_on_rows(rows, mode, trim, attackers, cc)
        robust = unflatten(v, w_t, index)
    return Decision(norms, keep, factors, bound, median, robust, e_norms, e_bound)


class Screening:
    """Applies ``screening`` to the replies of each round (called by ``DriftServer.screen``)."""

    def __init__(self, cfg: dict, skip=()):
        self.mode = cfg["screening"]
        self.clip_norm = cfg["screen-clip-norm"]
        self.clip_multiple = cfg["screen-clip-multiple"]
        self.reject_multiple = cfg["screen-reject-multiple"]
        self.trim = cfg["screen-trim"]
        self.attackers = cfg.get("screen-attackers", 0)
        self.pre = parse_pre(cfg.get("screen-pre", "none"))
        self.bucket = cfg.get("screen-bucket-size", 2)
        self.cc = (cfg.get("screen-cc-tau", 0.0), cfg.get("screen-cc-iters", 3))
        self.seed = cfg.get("seed", 0)
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
        rng = np.random.default_rng([self.seed, server_round])  # bucketing's order: the same on a resumed run
        d = decide(clients, self.w_t, self.mode, self.clip_norm, multiple, self.trim, self.skip, self.attackers,
                   self.pre, self.bucket, self.cc, rng)
        need = min_replies(self.mode, self.attackers, self.pre, self.bucket)
        if len(clients) < need:
            log.warning("round %d: screening = %s needs at least %d replies for screen-attackers = %d, got %d; "
                        "no update this round", server_round, self.mode, need, self.attackers, len(clients))
        if self.mode in SELECTION_MODES and not self.pre and len(clients) >= need:
            log.info("round %d: %s (f = %d) dropped the updates of nodes %s", server_round, self.mode,
                     self.attackers, [c.cid for (c, _), k in zip(accepted, d.keep) if not k])
        row["num_clipped"] = sum(f < 1.0 for f in d.factors)
        row["screen_bound"] = d.bound if d.bound is not None else ""
        row["screen_median_norm"] = d.median
        out = []
        for k, ((client, res), arrays, norm, keep, s) in enumerate(zip(accepted, clients, d.norms, d.keep, d.factors)):
            if not keep:
                if self.mode == "reject" and norm > d.bound:
                    log.warning("round %d: rejected the update of node %s: update norm %.4g > %.4g "
                                "(%g x the median %.4g; screening = reject)",
                                server_round, client.cid, norm, d.bound, multiple, d.median)
                elif self.mode == "reject":
                    log.warning("round %d: rejected the update of node %s: its extras' norm %.4g > %.4g "
                                "(%g x their median; screening = reject)",
                                server_round, client.cid, d.extras_norms[k], d.extras_bound, multiple)
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
