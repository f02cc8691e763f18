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
``--tolerance`` of the float64 value, or of 0.1 where that is smaller, on every partition) is the smallest interval at which the
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

from fl_app.registry import validate_config  # noqa: E402
from tasks.datasets import input_shape, resolve_data_dir  # noqa: E402
from tasks.models import build_model  # noqa: E402
from tasks.partition_spec import PartitionSpec  # noqa: E402
from tasks.partitioning import load_partition  # noqa: E402
from tasks.roughness import (  # noqa: E402
    grid,
    model_loss_fn,
    normalised_total_variation,
    profile_losses,
    random_directions,
    roughness_index,
)


def measure(model, x, y, cfg: dict, l: float, seed: int) -> dict:
    """The index in float32 and in float64 along the same directions, and the median loss
    amplitude along a direction in units of the float32 rounding of the loss (2^-24 x loss)."""
    out = {}
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    drawn = random_directions(params, cfg["ri-directions"], torch.Generator().manual_seed(seed))  # float32 draws
    for name, dtype in (("f32", torch.float32), ("f64", torch.float64)):
        center = {n: p.to(dtype) for n, p in params.items()}
        directions = {n: d.to(dtype) for n, d in drawn.items()}  # the same directions in both precisions
        s = grid(l, cfg["ri-points"], dtype=dtype)
        with torch.no_grad():
            values = profile_losses(model_loss_fn(model, x, y, dtype if dtype == torch.float64 else None, 0),
                                    center, directions, s, chunk=1).to(torch.float64)
        out[name] = roughness_index(normalised_total_variation(values, l), float("inf"))
        if name == "f64":
            amplitude = (values.max(1).values - values.min(1).values).median().item()
            out["amp_ulps"] = amplitude / (values.mean().item() * 2.0**-24)
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
    print(f"{'l':>6} | {'loss amplitude / float32 rounding':>33} | {'I float32':>26} | {'I float64':>26} | gap")
    alive = None
    for l in intervals:
        f32, f64, gaps, amps = [], [], [], []
        for p in parts:
            x, y = data[p]
            x, y = x[: cfg["ri-samples"]], y[: cfg["ri-samples"]]
            r = measure(model, x, y, cfg, l, seed=1000 + p)
            f32.append(r["f32"])
            f64.append(r["f64"])
            amps.append(r["amp_ulps"])
            gaps.append(abs(r["f32"] - r["f64"]))
        # agreement: within the tolerance of the float64 index, or of 0.01 where that is ~0
        ok = all(g <= args.tolerance * max(v, 0.1) for g, v in zip(gaps, f64))
        if ok and alive is None:
            alive = l
        print(f"{l:>6g} | {' '.join(f'{v:10.3g}' for v in amps):>33} | {' '.join(f'{v:8.4f}' for v in f32):>26}"
              f" | {' '.join(f'{v:8.4f}' for v in f64):>26} | {max(gaps):.4f}{'  <- agree' if ok else ''}")
    print(f"smallest interval with the float32 index within {args.tolerance:.0%} of float64: {alive}")


if __name__ == "__main__":
    main()
