#!/usr/bin/env python
"""A round of K clients' local training through the functional local updates
(``tasks.functional``): one client after another, or all K in one vmap per step.
Not a test, and no product code depends on it; run by hand, the same command on CPU and CUDA:

    python bench/cohort.py                      # cnn, cnn-small, lenet; K = 10, 30, 100; fedavg
    python bench/cohort.py --methods fedavg,scaffold,fedsam --models cnn --clients 30
    python bench/cohort.py --quick              # CPU smoke run: K = 2, 4, 64 samples a client

It imports torch and the checkout's ``tasks`` only (no Flower), so it runs on a machine with
torch and this repository alone. For each model, method and client count K it prints the
training samples per second of one round (every client ``--samples`` synthetic MNIST-shaped
samples, ``--epochs`` epochs of batch ``--batch-size``, SGD with momentum 0.9):

- ``module``: the per-client loop the clients ran before the conversion (``torch.optim.SGD``
  on one module object, each client's weights loaded in place; FedAvg only): the reference
  cost of a step;
- ``sequential``: ``tasks.functional.local_round`` per client, the path each converted
  NumPyClient takes (weights in the module's layout, channels-last convolutions);
- ``cohort``: ``tasks.functional.cohort_round``, the K clients stacked (contiguous layout,
  which vmap needs), one vmap call per local step.

Every client has its own data and batch order (its generator), as in the simulation. The rate
is K * samples * epochs / seconds, the median of ``--reps`` timed rounds after one warm-up
round (on CUDA the device is synchronised before each clock read; ``bench/vmap.py``'s
``timed``). Before timing, ``check`` compares the paths (relative differences, the largest
over the clients' weight tensors, each to its largest magnitude). After one local step, the
cohort's error to the same step in float64 must be at most max(2 x the per-client path's
error, ``--tol``), or the bench stops (a step that trains something else is off by O(1)).
``--tol`` is 1e-4 on CPU (both paths about 1e-7 off) and 1e-2 on CUDA: on the H100 (torch
2.11, TF32 off) vmap's grouped cuDNN convolutions (K clients' convolutions as one with K
groups) left ``cnn``'s first step up to 1.8e-3 off float64 at K = 30 (in the Linear layer
after them), the per-client step 9e-8; with cuDNN disabled both were equal.
After the round the cohort-vs-per-client difference is printed beside the difference the
per-client path shows against itself when only the weights' memory layout differs. Over a
round the rounding can flip a discrete decision (a ReLU sign, a max-pool winner) on random
data and labels, after which that client's path moves visibly: on the H100, ``cnn-small`` at
K = 10 agreed to 1e-7 for every client up to step 6 and for nine of ten after 12 steps, one
client at 6e-2; ``cnn``'s layout-only difference alone reached 7e-2 to 1.6e-1. The first
step is the sharp check; tests/training/test_functional.py checks whole rounds on CPU (1e-5). On CPU
both columns stay near 1e-7. TF32 is off unless ``--tf32`` (PyTorch enables it
for cuDNN convolutions by default). On CPU, ``--cpu-max-clients`` (default 20) caps K.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from vmap import sync, timed  # noqa: E402

from clients import fedavg, feddyn, fedprox, fedsam, scaffold  # noqa: E402
from tasks.datasets import input_shape  # noqa: E402
from tasks.functional import Hyper, Round, cohort_round, local_round, module_state  # noqa: E402
from tasks.functional.rounds import stack_trees, unstack_tree  # noqa: E402
from tasks.models import build_model, default_device, set_cuda_precision  # noqa: E402

KEYS = {"proximal-mu": 0.01, "sam-rho": 0.05, "feddyn-alpha": 0.01}  # the methods' defaults
# The updates this bench runs: those that need no keys but KEYS and start from empty client state
# and server message (zeros). Named here, by their modules, because the bench imports no Flower
# and so cannot read the method registry (fl_app.registry), which is where a run looks them up.
BENCHED = {m.UPDATE.name: m.UPDATE for m in (fedavg, fedprox, scaffold, fedsam, feddyn)}


def make_clients(name: str, k: int, samples: int, device: torch.device):
    """K clients: their initial weights (module layout), buffers and synthetic data."""
    shape = input_shape("mnist")
    gen = torch.Generator().manual_seed(0)
    models = [build_model(name, shape, seed=i).to(device) for i in range(k)]
    states = [module_state(m) for m in models]
    data = [(torch.randn(samples, shape.channels, shape.size, shape.size, generator=gen).to(device),
             torch.randint(0, shape.classes, (samples,), generator=gen).to(device)) for _ in range(k)]
    return models[0], states, data


def generators(k: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(1000 + i) for i in range(k)]


def run_module(model, states, data, args) -> None:
    """FedAvg as the module-based clients ran it before the conversion: one module, each
    client's weights copied in, torch.optim."""
    params = list(model.parameters())
    for (p0, _), (x, y), gen in zip(states, data, generators(len(data))):
        with torch.no_grad():
            for p, v in zip(params, p0.values()):
                p.copy_(v)
        opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
        for _ in range(args.epochs):
            order = torch.randperm(len(x), generator=gen).to(x.device)
            for start in range(0, len(x), args.batch_size):
                idx = order[start:start + args.batch_size]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()


def run_sequential(update, skeleton, states, data, args, hp) -> list:
    return [local_round(Round(update, skeleton, p, b, {}, {}, hp, x, y, args.batch_size, args.epochs, gen))
            for (p, b), (x, y), gen in zip(states, data, generators(len(data)))]


def run_cohort(update, skeleton, stacked, data, args, hp):
    params, buffers = stacked
    return cohort_round(update, skeleton, params, buffers, [{} for _ in data], {}, hp, data,
                        args.batch_size, args.epochs, generators(len(data)))


def max_difference(alone: list, together) -> float:
    """Largest relative difference (per tensor, to its largest magnitude) of any client's weights."""
    worst = 0.0
    for k, result in enumerate(alone):
        for n, v in result.params.items():
            diff = (unstack_tree(together.params, k)[n] - v).abs().max() / v.abs().max().clamp_min(1e-12)
            worst = max(worst, diff.item())
    return worst


def check(update, skeleton, states, stacked, data, args, hp) -> dict[str, float]:
    """Relative differences (``max_difference``) that show the cohort trains what the per-client
    path trains. ``first_cohort`` / ``first_alone``: after one local step, the cohort's and the
    per-client path's (both from the same contiguous float32 weights) difference to that step
    in float64; ``round``: cohort against per-client after the whole round; ``layout``: what the
    per-client round itself moves when only the weights' memory layout differs (the module's
    channels-last against contiguous)."""
    contiguous = [({n: v.contiguous() for n, v in unstack_tree(stacked[0], k).items()}, unstack_tree(stacked[1], k))
                  for k in range(len(data))]
    double = [({n: v.double() for n, v in p.items()}, {n: v.double() if v.is_floating_point() else v for n, v in b.items()})
              for p, b in contiguous]
    one = [(x[:args.batch_size], y[:args.batch_size]) for x, y in data]
    one_args = argparse.Namespace(**{**vars(args), "epochs": 1})
    exact = run_sequential(update, skeleton, double, [(x.double(), y) for x, y in one], one_args, hp)
    alone = run_sequential(update, skeleton, contiguous, data, args, hp)
    return {"first_cohort": max_difference(exact, run_cohort(update, skeleton, stacked, one, one_args, hp)),
            "first_alone": max_difference(exact, stack_results(run_sequential(update, skeleton, contiguous, one,
                                                                              one_args, hp))),
            "round": max_difference(alone, run_cohort(update, skeleton, stacked, data, args, hp)),
            "layout": max_difference(alone, stack_results(run_sequential(update, skeleton, states, data, args, hp)))}


def stack_results(results: list):
    """K ``local_round`` results as one object with stacked ``params`` (for ``max_difference``)."""
    return argparse.Namespace(params=stack_trees([r.params for r in results]))


def bench_one(name: str, method: str, k: int, args, device: torch.device) -> dict:
    model, states, data = make_clients(name, k, args.samples, device)
    skeleton = copy.deepcopy(model).to("meta")
    update, hp = BENCHED[method], Hyper(lr=args.lr, momentum=0.9, keys=KEYS)
    stacked = tuple({n: v.contiguous() for n, v in t.items()} for t in
                    (stack_trees([p for p, _ in states]), stack_trees([b for _, b in states])))
    out = check(update, skeleton, states, stacked, data, args, hp)
    bound = max(2 * out["first_alone"], args.tol if args.tol is not None else (1e-2 if device.type == "cuda" else 1e-4))
    if out["first_cohort"] > bound:
        raise SystemExit(f"{name} {method} K={k}: the cohort's first step is {out['first_cohort']:.2e} off float64,"
                         f" more than {bound:.1e} (the per-client step is {out['first_alone']:.2e} off): it trains"
                         " something else")
    samples = k * args.samples * args.epochs
    rate = {"module": lambda: run_module(model, states, data, args),
            "sequential": lambda: run_sequential(update, skeleton, states, data, args, hp),
            "cohort": lambda: run_cohort(update, skeleton, stacked, data, args, hp)}
    for way, fn in rate.items():
        if way == "module" and method != "fedavg":
            out[way] = "-"
            continue
        try:
            out[way] = samples / timed(fn, device, args.reps)
        except torch.OutOfMemoryError:
            out[way] = "out of memory"
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="cnn,cnn-small,lenet")
    p.add_argument("--methods", default="fedavg", help=f"comma list of: {', '.join(BENCHED)}")
    p.add_argument("--clients", type=int, nargs="+", default=[10, 30, 100])
    p.add_argument("--cpu-max-clients", type=int, default=20, help="on CPU, cap K at this (0 = no cap)")
    p.add_argument("--samples", type=int, default=600, help="samples per client (MNIST over 100 clients: 600)")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tol", type=float, default=None, help="first step: the cohort's error to float64 may be"
                   " max(2 x the per-client error, this); default 1e-4 on CPU, 1e-2 on CUDA")
    p.add_argument("--tf32", action="store_true", help="allow TF32 on CUDA (off by default)")
    p.add_argument("--quick", action="store_true", help="smoke run: K = 2 and 4, 64 samples, 1 rep")
    p.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0 = torch's default)")
    args = p.parse_args(argv)
    if args.quick:
        args.clients = [c for c in args.clients if c <= 4] or [2, 4]
        args.samples, args.batch_size, args.reps = min(args.samples, 64), min(args.batch_size, 16), 1
    bad = [m for m in args.methods.split(",") if m not in BENCHED]
    if bad:
        p.error(f"--methods {','.join(bad)} invalid; valid choices: {', '.join(BENCHED)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    set_cuda_precision(args.tf32)
    device = default_device()
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} torch threads"
    print(f"device: {device} ({where}); torch {torch.__version__}; TF32 {'on' if args.tf32 else 'off'};"
          f" {args.samples} samples a client, batch {args.batch_size}, {args.epochs} epoch(s), median of {args.reps}")
    print("| model | method | clients | module samples/s | sequential samples/s | cohort samples/s |"
          " cohort / sequential | step 1 vs float64: cohort | per-client | round: cohort vs per-client |"
          " per-client, layout only |")
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for name in args.models.split(","):
        for method in args.methods.split(","):
            for k in args.clients:
                if device.type == "cpu" and args.cpu_max_clients:
                    k = min(k, args.cpu_max_clients)
                r = bench_one(name, method, k, args, device)
                cells = [f"{r[w]:.0f}" if isinstance(r[w], float) else r[w] for w in ("module", "sequential", "cohort")]
                ratio = (f"{r['cohort'] / r['sequential']:.2f}"
                         if all(isinstance(r[w], float) for w in ("cohort", "sequential")) else "-")
                diffs = " | ".join(f"{r[d]:.1e}" for d in ("first_cohort", "first_alone", "round", "layout"))
                print(f"| `{name}` | {method} | {k} | {' | '.join(cells)} | {ratio} | {diffs} |", flush=True)
    sync(device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
