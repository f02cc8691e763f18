#!/usr/bin/env python
"""A cohort node's round around its training, in one process (no Flower, no Ray): the node's
client objects against its rows, and its replies summed on the host against on its training
device, as ratios measured in one run. Not a test; run by hand, the same command on CPU and CUDA:

    FL_DATA_DIR=/path/to/data python bench/cohort_node.py                     # cnn-small, scaffold and fedavg
    FL_DATA_DIR=/path/to/data python bench/cohort_node.py --model cnn --methods scaffold --rounds 6

For each method, three nodes of ``--clients`` virtual clients (partitions of the data in
``FL_DATA_DIR``, Dirichlet 0.3) train the same ``--per-round`` sampled clients each round from
the same global model, with the server's checkpointing on (the clients' state journalled or
mirrored on disk, in a temporary run folder) and a summed reply (``cohort_wire.SUM``, the
default of a summing method's cohort run):

- ``objects``: a ``DriftClient`` and ``NodeClient`` per virtual client (``CohortClient.rows =
  False``), the replies summed with numpy on the host: the node without ``cohort_rows``;
- ``rows``: ``fl_app.node.cohort_rows`` with numpy sums (a CPU node's default);
- ``rows+device-sums``: rows with the replies summed on the training device
  (``cohort_rows.device_sums``, a CUDA node's default).

The variants take turns within each round (their order rotates), so drift in the machine's
speed falls on all three. Per variant it prints the median over rounds 2.. of the seconds a
round outside the training (the node's ``fit`` less its one ``cohort_client.train`` call; on
CUDA the device is synchronised around it) and its ratio to ``objects``; the training seconds
beside them show the variants trained the same work. The three give the same replies (bit for
bit, but the device sums' drift dot products: tests/node/test_cohort_rows.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays  # noqa: E402

import fl_app.node.cohort_client as cohort_client  # noqa: E402
from fl_app.node.cohort_wire import SUM, SumSpec, bundle_instructions  # noqa: E402
from fl_app.node.drift_client import DriftClient  # noqa: E402
from fl_app.registry import METHODS, validate_config  # noqa: E402
from fl_app.server.drift import layout  # noqa: E402
from tasks.models import default_device  # noqa: E402

VARIANTS = {"objects": (False, False), "rows": (True, False), "rows+device-sums": (True, True)}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(method: str, args) -> dict[str, tuple[list[float], list[float]]]:
    """Per variant, (seconds outside training, training seconds) of each round."""
    cfg = validate_config({"strategy": method, "dataset": args.dataset, "model": args.model, "batch-size": args.batch_size,
                           "local-epochs": 1, "learning-rate": 0.01, "seed": 0, "alpha": 0.3})
    update = METHODS[method].update
    weights = DriftClient(update, cfg, Context(0, 0, {}, RecordDict(), {}), 0, args.clients).get_parameters({})
    num_state, head, body = layout(cfg["model"], cfg["dataset"], METHODS[method].strategy)
    sent = weights + ([np.zeros_like(w) for w in weights] if update.receives else [])
    states = {name: RecordDict() for name in VARIANTS}
    folders = {name: tempfile.mkdtemp(prefix=f"cohort-node-{name}-") for name in VARIANTS}
    spent: dict[str, float] = {}
    train = cohort_client.train

    def timed_train(jobs):
        sync()
        started = time.perf_counter()
        results = train(jobs)
        sync()
        spent["train"] = time.perf_counter() - started
        return results
    cohort_client.train = timed_train
    out = {name: ([], []) for name in VARIANTS}
    names = list(VARIANTS)
    for server_round in range(1, args.rounds + 1):
        rng = np.random.default_rng([0, server_round])
        partitions = [int(p) for p in rng.choice(args.clients, args.per_round, replace=False)]
        for name in names[server_round % 3:] + names[:server_round % 3]:
            rows, device_sums = VARIANTS[name]
            context = Context(run_id=1, node_id=0, node_config={"partition-id": 0, "num-partitions": 1},
                              state=states[name], run_config={})
            node = cohort_client.CohortClient(cfg, context, update, 0, 1)
            node.rows, node.device_sums = rows, device_sums
            config = {"server-round": server_round, "num-partitions": args.clients, "run-dir": folders[name],
                      "checkpoint-every": 1, "checkpoint-round": server_round - 1}
            bundle = bundle_instructions([(p, FitIns(ndarrays_to_parameters(sent), config)) for p in partitions])
            bundle.config[SUM] = SumSpec(num_state, head, body).encode()
            arrays = parameters_to_ndarrays(bundle.parameters)
            sync()
            started = time.perf_counter()
            node.fit(arrays, dict(bundle.config))
            total = time.perf_counter() - started
            out[name][0].append(total - spent["train"])
            out[name][1].append(spent["train"])
    cohort_client.train = train
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="scaffold,fedavg")
    parser.add_argument("--model", default="cnn-small")
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--per-round", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds = {args.rounds}: at least 2 (round 1 pays first-use costs and is left out)")
    print(f"{args.dataset} {args.model}, {args.clients} clients, {args.per_round} a round, B={args.batch_size}, "
          f"device {default_device()}, torch threads {torch.get_num_threads()}")
    for method in args.methods.split(","):
        out = measure(method.strip(), args)
        base = statistics.median(out["objects"][0][1:])
        for name, (outside, training) in out.items():
            median = statistics.median(outside[1:])
            print(f"  {method:10s} {name:17s} outside training {median:.3f} s a round ({median / base:.2f}x objects),"
                  f" training {statistics.median(training[1:]):.2f} s")


if __name__ == "__main__":
    main()
