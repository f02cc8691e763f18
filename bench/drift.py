#!/usr/bin/env python
"""Server-side cost of the per-round diagnostics: the drift columns (fl_app/server/drift.py) and
the per-class accuracy of the server evaluation, against a round's time.

Not a test; run by hand:
    FL_DATA_DIR=/path/to/data python bench/drift.py --clients 5 10 --run results/cmp/runs/fedavg-seed0

- drift: ``round_drift`` on K replies of the model (serialised as Flower sends them, read
  through the same zero-copy views the server uses), median of ``--reps`` calls;
- per-class: ``evaluate(..., per_class=True)`` against the plain ``evaluate`` on the MNIST
  test split, interleaved, median of ``--reps`` each;
- with ``--run``, the median ``round_seconds`` of that run's metrics.csv, and each cost as a
  share of it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np
import torch
from flwr.common import ndarrays_to_parameters

from fl_app.server.drift import round_drift
from fl_app.server.recording import array_views
from runner.results.report import read_metrics
from strategies.base import DriftFedAvg
from tasks.datasets import input_shape, resolve_data_dir
from tasks.models import build_model, get_weights
from tasks.partitioning import load_test_split
from tasks.train import evaluate


def time_drift(model: str, dataset: str, clients: int, reps: int) -> float:
    rng = np.random.default_rng(0)
    sent = get_weights(build_model(model, input_shape(dataset), seed=0))
    replies = [ndarrays_to_parameters([(a + 0.01 * rng.standard_normal(a.shape)).astype(a.dtype) for a in sent])
               for _ in range(clients)]
    sent_params = ndarrays_to_parameters(sent)
    cfg = {"model": model, "dataset": dataset}
    round_drift(cfg, DriftFedAvg, array_views(sent_params), [(100, array_views(p)) for p in replies])  # warm: model layout cached
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        round_drift(cfg, DriftFedAvg, array_views(sent_params), [(100 + i, array_views(p)) for i, p in enumerate(replies)])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_per_class(model_name: str, dataset: str, reps: int) -> tuple[float, float]:
    x, y = load_test_split(dataset, resolve_data_dir(""), 0)
    model = build_model(model_name, input_shape(dataset), seed=0)
    evaluate(model, x, y)
    plain, per_class = [], []
    for _ in range(reps):
        for flag, out in ((False, plain), (True, per_class)):
            start = time.perf_counter()
            evaluate(model, x, y, per_class=flag)
            out.append(time.perf_counter() - start)
    return statistics.median(plain), statistics.median(per_class)


def time_bincounts(y: torch.Tensor, classes: int, batch_size: int, reps: int) -> float:
    """The work per_class=True adds to one evaluation, alone: two bincounts per batch (the
    difference of two full evaluations is within their noise on a loaded machine)."""
    pred = torch.randint(0, classes, y.shape, generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        hits = torch.zeros(classes, dtype=torch.long)
        seen = torch.zeros_like(hits)
        for i in range(0, len(y), batch_size):
            yb, right = y[i : i + batch_size], pred[i : i + batch_size] == y[i : i + batch_size]
            seen += torch.bincount(yb, minlength=classes)
            hits += torch.bincount(yb[right], minlength=classes)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cnn")
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--clients", type=int, nargs="+", default=[5, 10])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--run", help="a run folder whose median round_seconds is the reference")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="dataset=... or model=... (as the other bench scripts; wins over --dataset/--model)")
    args = p.parse_args()
    from fl_app.registry import parse_override

    for text in args.set:
        key, value = parse_override(text)
        if key not in ("dataset", "model"):
            p.error(f"--set {key}=...: this bench reads only dataset and model")
        setattr(args, key, value)
    print(f"torch threads {torch.get_num_threads()}")
    round_s = None
    if args.run:
        rounds = [r["round_seconds"] for r in read_metrics(Path(args.run))]
        round_s = statistics.median(rounds)
        print(f"{args.run}: median round_seconds {round_s:.2f} s over {len(rounds)} rounds")
    for k in args.clients:
        t = time_drift(args.model, args.dataset, k, args.reps)
        share = f", {100 * t / round_s:.2f} % of a round" if round_s else ""
        print(f"drift columns, {args.model}, {k} clients: {1000 * t:.1f} ms{share}")
    _, y = load_test_split(args.dataset, resolve_data_dir(""), 0)
    extra = time_bincounts(y, input_shape(args.dataset).classes, 128, args.reps)
    share = f", {100 * extra / round_s:.3f} % of a round" if round_s else ""
    print(f"per-class bincounts alone ({len(y)} test samples, batches of 128): {1000 * extra:.1f} ms{share}")
    plain, per_class = time_per_class(args.model, args.dataset, args.reps)
    extra = per_class - plain
    share = f", {100 * extra / round_s:.2f} % of a round" if round_s else ""
    print(f"server evaluation {args.dataset} test split: plain {plain:.3f} s, with per-class {per_class:.3f} s"
          f" (difference {1000 * extra:+.1f} ms{share})")


if __name__ == "__main__":
    main()
