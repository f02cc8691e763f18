#!/usr/bin/env python
"""CPU training throughput of the models, and the cost of training-time augmentation.

Not a test; run by hand:  python bench/models.py [--reps 5] [--skip-augment] [--skip-throughput]
[--set dataset=mnist]

- throughput: samples/s of plain SGD training steps (momentum 0.9; forward, backward, step)
  on CIFAR-10-sized random batches for ``cnn``, ``resnet18`` and ``vgg11`` (built by
  ``build_model``, so channels-last as in a run), at 1 and 2 torch threads, batch 32 and 50.
  Models are interleaved within each repetition and the median over repetitions is taken;
  the ratio to ``cnn`` is taken per repetition (then the median), so drift in the machine's
  speed hits all models alike.
- augment: one client's local epoch (600 samples, batch 50, ``cnn``) on MNIST- and
  CIFAR-10-sized batches without augmentation and with each recipe, interleaved per
  repetition; reports the epoch time, the time spent in the augmentation itself and the
  ratio to the unaugmented epoch of the same repetition.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch
import torch.nn.functional as F

from tasks.augment import Augment
from tasks.datasets import input_shape
from tasks.models import build_model

MODELS = ("cnn", "resnet18", "vgg11")


def _step(model, opt, x, y) -> None:
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()


def param_counts() -> None:
    print("| model | parameters, MNIST (1x28x28, 10 classes) | parameters, CIFAR-10 (3x32x32, 10 classes) |")
    print("|---|---|---|")
    for name in MODELS:
        counts = [sum(p.numel() for p in build_model(name, input_shape(d)).parameters()) for d in ("mnist", "cifar10")]
        print(f"| `{name}` | {counts[0]:,} | {counts[1]:,} |")


def throughput(reps: int, steps: int, dataset: str = "cifar10") -> None:
    shape = input_shape(dataset)
    print(f"\n{dataset}-sized batches")
    print("\n| threads | batch | model | samples/s (median) | x cnn (median of per-rep ratios) |")
    print("|---|---|---|---|---|")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for batch in (32, 50):
            gen = torch.Generator().manual_seed(0)
            x = torch.randn(batch, shape.channels, shape.size, shape.size, generator=gen)
            y = torch.randint(0, shape.classes, (batch,), generator=gen)
            setups = {}
            for name in MODELS:
                model = build_model(name, shape, seed=0).train()
                opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
                for _ in range(2):  # warm-up: allocations, oneDNN primitive caches
                    _step(model, opt, x, y)
                setups[name] = (model, opt)
            rates: dict[str, list[float]] = {n: [] for n in MODELS}
            for _ in range(reps):
                for name, (model, opt) in setups.items():
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        _step(model, opt, x, y)
                    rates[name].append(steps * batch / (time.perf_counter() - t0))
            for name in MODELS:
                ratio = statistics.median(a / b for a, b in zip(rates[name], rates["cnn"]))
                print(f"| {threads} | {batch} | `{name}` | {statistics.median(rates[name]):.0f} | {ratio:.3f} |",
                      flush=True)


RECIPES = {"mnist": ("none", "crop", "crop,flip,cutout"), "cifar10": ("none", "crop,flip", "crop,flip,cutout")}


def augment_cost(reps: int, threads: int, datasets: tuple[str, ...] = tuple(RECIPES)) -> None:
    torch.set_num_threads(threads)
    n, batch = 600, 50
    print(f"\n| dataset | augment | epoch s (median) | augmentation s (median) | augmentation / plain epoch |"
          " epoch / plain epoch |"
          f" ({threads} thread{'s' if threads > 1 else ''}, cnn, {n} samples, batch {batch})")
    print("|---|---|---|---|---|---|")
    for dataset in datasets:
        recipes = RECIPES.get(dataset, ("none", "crop,flip", "crop,flip,cutout"))
        shape = input_shape(dataset)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(n, shape.channels, shape.size, shape.size, generator=gen)
        y = torch.randint(0, shape.classes, (n,), generator=gen)
        model = build_model("cnn", shape, seed=0).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        _step(model, opt, x[:batch], y[:batch])
        epoch: dict[str, list[float]] = {r: [] for r in recipes}
        aug_only: dict[str, list[float]] = {r: [] for r in recipes}
        for rep in range(reps):
            for recipe in recipes:
                cfg = {"augment": recipe, "dataset": dataset, "seed": 0}
                aug = Augment.for_round(cfg, torch.device("cpu"), 0, rep + 1)
                t0 = time.perf_counter()
                for s in range(0, n, batch):
                    aug(x[s:s + batch])
                aug_only[recipe].append(time.perf_counter() - t0)
                aug = Augment.for_round(cfg, torch.device("cpu"), 0, rep + 1)
                t0 = time.perf_counter()
                for s in range(0, n, batch):
                    _step(model, opt, aug(x[s:s + batch]), y[s:s + batch])
                epoch[recipe].append(time.perf_counter() - t0)
        for recipe in recipes:
            ratio = statistics.median(a / b for a, b in zip(epoch[recipe], epoch["none"]))
            share = statistics.median(a / b for a, b in zip(aug_only[recipe], epoch["none"]))
            print(f"| {dataset} | `{recipe}` | {statistics.median(epoch[recipe]):.3f} |"
                  f" {statistics.median(aug_only[recipe]):.4f} | {share:.3f} | {ratio:.3f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="training steps per model per repetition")
    ap.add_argument("--skip-augment", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="dataset=...: only that dataset's shapes (default: both for augment, cifar10 for throughput)")
    args = ap.parse_args()
    from fl_app.registry import parse_override

    chosen = dict(parse_override(text) for text in args.set)
    if set(chosen) - {"dataset"}:
        ap.error(f"--set {sorted(set(chosen) - {'dataset'})[0]}=...: this bench reads only dataset")
    param_counts()
    if not args.skip_augment:
        for threads in (1, 2):
            augment_cost(args.reps, threads, (chosen["dataset"],) if chosen else tuple(RECIPES))
    if not args.skip_throughput:
        throughput(args.reps, args.steps, chosen.get("dataset", "cifar10"))


if __name__ == "__main__":
    main()
