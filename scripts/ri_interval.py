#!/usr/bin/env python
"""Where does RI-FedAvg's roughness index measure the loss landscape rather than rounding?

    FL_DATA_DIR=/path/to/data python scripts/ri_interval.py --config experiments/ri-fedavg-mnist-dir05.toml \
        [--intervals 0.01,0.03,0.1,0.3,1,3] [--partitions 0,1,2] [--train-steps 200]

At initial weights the loss is near-linear along every direction at small l and the index is 0
in any precision, so the model is first trained: ``--train-steps`` SGD steps (the experiment's lr
and batch size) on the pooled partitions, as a stand-in for the global model of a mid-run round.
For the experiment's model and data it then reads the loss along the index's unit directions (the
same M, m and sample size as the experiment's ``ri-*`` keys) on a few clients' partitions, once
in float32 (what a run computes) and once in float64 (the same directions and points), and prints
per interval l: the median loss amplitude along a direction, the float32 and float64 indices and
their gap. The smallest l whose float32 index agrees with the float64 one (gap below
``--tolerance`` of the float64 value, on every partition) is the smallest interval at which the
float32 index measures the landscape; below it the index is driven by float32 rounding of the
losses (their resolution is about 1e-7 times the loss).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fl_app.config import validate_config  # noqa: E402
from tasks.datasets import input_shape, resolve_data_dir  # noqa: E402
from tasks.models import build_model  # noqa: E402
from tasks.partition_spec import PartitionSpec  # noqa: E402
from tasks.partitioning import load_partition  # noqa: E402
from tasks.roughness import model_roughness  # noqa: E402


def measure(model, x, y, cfg: dict, l: float, seed: int) -> dict:
    out = {}
    for name, dtype in (("f32", None), ("f64", torch.float64)):
        gen = torch.Generator().manual_seed(seed)  # same directions for both precisions
        t, index = model_roughness(
            model, x, y, num_directions=cfg["ri-directions"], l=l, m=cfg["ri-points"],
            i_max=float("inf"), generator=gen, chunk=1, dtype=dtype,
        )
        out[name] = index
    return out


def train(model, x, y, cfg: dict, steps: int) -> None:
    """``steps`` SGD steps of the experiment's lr and batch size on (x, y), seeded."""
    gen = torch.Generator().manual_seed(cfg["seed"])
    opt = torch.optim.SGD(model.parameters(), lr=cfg["learning-rate"])
    model.train()
    for _ in range(steps):
        idx = torch.randint(len(x), (cfg["batch-size"],), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--intervals", default="0.01,0.03,0.1,0.3,1,3")
    parser.add_argument("--partitions", default="0,1,2")
    parser.add_argument("--tolerance", type=float, default=0.1)
    parser.add_argument("--train-steps", type=int, default=200)
    args = parser.parse_args()

    exp = tomllib.loads(Path(args.config).read_text())
    raw = {**exp.get("run-config", {}), **exp.get("methods", {}).get("ri-fedavg", {}), "strategy": "ri-fedavg"}
    raw["data-dir"] = resolve_data_dir(raw.get("data-dir", ""))
    cfg = validate_config(raw)
    clients = int(exp.get("clients", 100))
    spec = PartitionSpec.from_config(cfg, clients)
    model = build_model(cfg["model"], input_shape(cfg["dataset"]), seed=cfg["seed"])
    intervals = [float(v) for v in args.intervals.split(",")]
    parts = [int(p) for p in args.partitions.split(",")]
    data = {p: load_partition(spec, p) for p in parts}
    train(model, torch.cat([data[p][0] for p in parts]), torch.cat([data[p][1] for p in parts]), cfg,
          args.train_steps)
    print(f"{cfg['dataset']} / {cfg['model']} (seed {cfg['seed']}, {args.train_steps} SGD steps), M = {cfg['ri-directions']},"
          f" m = {cfg['ri-points']}, {cfg['ri-samples']} examples per partition {parts}")
    print(f"{'l':>6} | {'I float32':>28} | {'I float64':>28} | max gap / I64")
    alive = None
    for l in intervals:
        f32, f64, gaps = [], [], []
        for p in parts:
            x, y = data[p]
            x, y = x[: cfg["ri-samples"]], y[: cfg["ri-samples"]]
            r = measure(model, x, y, cfg, l, seed=1000 + p)
            f32.append(r["f32"])
            f64.append(r["f64"])
            gaps.append(abs(r["f32"] - r["f64"]) / max(r["f64"], 1e-12))
        ok = max(gaps) <= args.tolerance
        if ok and alive is None:
            alive = l
        print(f"{l:>6g} | {' '.join(f'{v:8.4f}' for v in f32):>28} | {' '.join(f'{v:8.4f}' for v in f64):>28}"
              f" | {max(gaps):.3f}{'  <- float32 = float64' if ok else ''}")
    print(f"smallest interval with the float32 index within {args.tolerance:.0%} of float64: {alive}")


if __name__ == "__main__":
    main()
