#!/usr/bin/env python
"""The server's time per round of each screening rule, against the plain weighted mean.

Not a test; run by hand:  python bench/screening.py [--model cnn-small] [--clients 10] [--attackers 3]

Each rule's ``decide`` (``fl_app.server.screening``: norms, the rule, its pre-aggregation steps)
runs on the same ``--clients`` replies, w_t plus seeded Gaussian updates of the model's size,
then the mean of the replies it returns (the aggregation the method does after it); the
reference is that mean alone, on the replies unscreened (Flower's ``aggregate``, what FedAvg's
server does). Rules are interleaved (rep 1: every rule, rep 2: every rule, ...) and each rep's
time is divided by that rep's reference time, the median of these ratios reported, so that a
change in the machine's speed hits every rule alike. What it leaves out: the rest of a round
(the clients' training, which dominates on the CPU: cnn-small's 10-client MNIST round of the
security table trains 13 steps per client, 125 in all), and a method's extra arrays (SCAFFOLD's delta c_i
doubles the rows that ``clip``, ``reject`` and Krum read).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from flwr.server.strategy.aggregate import aggregate  # noqa: E402

from fl_app.common.screening_modes import parse_pre  # noqa: E402
from fl_app.server.screening import decide, min_replies, scale_update  # noqa: E402
from tasks.datasets import input_shape  # noqa: E402
from tasks.models import build_model, get_weights  # noqa: E402

DEFENCES = ("clip", "reject", "median", "trimmed-mean", "krum", "multi-krum", "bulyan", "geometric-median",
            "centered-clip", "nnm+trimmed-mean", "arc+nnm+trimmed-mean", "bucketing+median")
"""The defences of docs/security.md's columns, each 'step+...+rule' for a pre-aggregation chain."""


def replies(model: str, dataset: str, clients: int, seed: int = 0) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """w_t (the model's seeded initial weights) and ``clients`` replies w_t + N(0, 0.01^2) each."""
    w_t = get_weights(build_model(model, input_shape(dataset), seed=seed))
    rng = np.random.default_rng(seed)
    return w_t, [[w + rng.normal(0, 0.01, w.shape).astype(w.dtype) for w in w_t] for _ in range(clients)]


def screened_mean(defence: str, w_t, clients, attackers: int):
    """One round's screening by ``defence`` then the mean of what it keeps (the server's work)."""
    pre, _, rule = defence.rpartition("+")
    d = decide(clients, w_t, rule, 0.0, 1.0 if rule == "clip" else 3.0, 0.2, attackers=attackers,
               pre=parse_pre(pre or "none"), rng=np.random.default_rng(0))
    kept = []
    for arrays, keep, s in zip(clients, d.keep, d.factors):
        if keep:
            arrays = scale_update(arrays, w_t, s) if s < 1.0 else arrays  # as Screening.apply does
            kept.append(([d.robust.get(i, a) for i, a in enumerate(arrays)], 1))
    return aggregate(kept)


def applies(defence: str, replies: int, attackers: int) -> bool:
    """Whether ``defence`` screens ``replies`` replies at f = ``attackers`` (Bulyan needs 4f + 3;
    with fewer, screening drops every reply, which would time nothing)."""
    pre, _, rule = defence.rpartition("+")
    return replies >= min_replies(rule, attackers, parse_pre(pre or "none"))


def time_rules(w_t, clients, attackers: int, reps: int) -> dict[str, list[float]]:
    """Seconds of the reference mean and of each defence that applies, once per rep, interleaved."""
    work = {"mean": lambda: aggregate([(c, 1) for c in clients])}
    work |= {d: (lambda d=d: screened_mean(d, w_t, clients, attackers)) for d in DEFENCES
             if applies(d, len(clients), attackers)}
    for fn in work.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in work}
    for _ in range(reps):
        for name, fn in work.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn-small")
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--attackers", type=int, default=3)
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    w_t, clients = replies(args.model, args.dataset, args.clients)
    size = sum(w.size for w in w_t)
    times = time_rules(w_t, clients, args.attackers, args.reps)
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    print(f"{args.model} on {args.dataset}: {size:,} weights, {args.clients} replies, f = {args.attackers}, "
          f"{args.reps} reps, load {load}\n")
    print("| defence | ms per round | / the plain mean |")
    print("|---|---|---|")
    for name, ts in times.items():
        ratio = statistics.median(t / r for t, r in zip(ts, times["mean"]))
        print(f"| {name} | {statistics.median(ts) * 1e3:.1f} | {ratio:.1f} |")
    for name in DEFENCES:
        if name not in times:
            pre, _, rule = name.rpartition("+")
            need = min_replies(rule, args.attackers, parse_pre(pre or "none"))
            print(f"| {name} | n/a: needs at least {need} replies at f = {args.attackers} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
