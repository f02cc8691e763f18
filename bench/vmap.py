#!/usr/bin/env python
"""Many clients' local SGD on one device: one after another, in one ``torch.func`` vmap, or as
one model on their concatenated batches. Not a test, and no product code depends on it; run by
hand (the same command on CPU and on CUDA):

    python bench/vmap.py                                   # cnn-small, cnn, lenet, resnet18; 10 and 100 clients
    python bench/vmap.py --models cnn --clients 10 --reps 5

For each model and client count K it prints the training samples per second of

- ``sequential``: one model object; per client its weights are loaded in place
  (``copy_`` from that client's copy), then ``--steps`` SGD steps on its own batches (what a
  simulation actor does, without Flower);
- ``vmap``: the K clients' weights stacked (``torch.func.stack_module_state``), one
  ``vmap(grad(loss))`` over them (``functional_call`` on a stateless copy of the model) and
  one SGD update of the stacked weights per step: K independent trainings in one call;
- ``concat``: one model on the K batches concatenated (K*B samples per step). Not K
  clients' training (one set of weights); it is the device's rate at that batch size, the
  ceiling the other two can be read against.

All three run the same number of steps on the same number of samples; the rate is
``K * steps * batch / seconds`` (median of ``--reps`` timed repetitions after one warm-up
repetition; on CUDA the device is synchronised before each clock read).

Before timing, ``vmap`` is checked against ``sequential``: the first step's updated weights
of 2 clients must agree within ``--tol`` relative (float32: vmap batches the convolutions of K
clients into grouped ones, which sums in a different order; a mismatch beyond that means the
vmap path trains something else and the bench stops). The default fits the arithmetic: 1e-4 in
full fp32 (CPU, and CUDA with TF32 off), 1e-2 with ``--tf32``. TF32 is off unless ``--tf32``
(``tasks.models.set_cuda_precision``, a run's ``cuda-tf32`` choice). Measured on an H100 (torch
2.11, K = 10, 2 steps): TF32 off, ``cnn`` 1.1e-7 and ``resnet18`` 1.2e-6; TF32 on, ``resnet18``
6.2e-4 (and vmap 2.06x sequential against 1.15x off). With PyTorch's default, which turns TF32 on
for cuDNN convolutions only, ``resnet18`` reaches 2.05e-4.

On CPU, ``--cpu-max-clients`` (default 20) caps K so that the run takes minutes, not hours
(100 ``resnet18`` clients hold 100 x 11 M weights plus their gradients); the capped K is printed.
Where torch's vmap cannot batch an operator of the model (torch 2.13 on CPU: ``group_norm``
on a tensor it treats as channels-last, which the 1x1 shortcut convolutions of ``resnet18``
produce), the check's error is printed and only ``sequential`` and ``concat`` are measured.
BatchNorm models (``*-bn``) are left out: vmap over per-client running statistics needs
the buffers handled as outputs, which this bench does not do (``tasks.functional`` does:
``bench/cohort.py`` times whole rounds of the methods' functional local updates, per client
and as a cohort, reusing this file's ``timed`` and ``sync``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.func import functional_call, grad, stack_module_state, vmap  # noqa: E402

from tasks.datasets import input_shape  # noqa: E402
from tasks.models import build_model, default_device, set_cuda_precision  # noqa: E402

DEFAULT_DATASET = {"resnet18": "cifar10"}  # the others on MNIST-sized inputs


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_data(shape, k: int, steps: int, batch: int, device: torch.device, seed: int = 0):
    """K clients' batches for every step: x [steps, K, B, C, H, W], y [steps, K, B], on the device."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, k, batch, shape.channels, shape.size, shape.size, generator=gen)
    y = torch.randint(0, shape.classes, (steps, k, batch), generator=gen)
    return x.to(device), y.to(device)


def client_models(name: str, shape, k: int, device: torch.device) -> list[torch.nn.Module]:
    """K differently initialised copies (clients start from their own weights)."""
    return [build_model(name, shape, seed=i).to(device) for i in range(k)]


def run_sequential(model, states, x, y, lr: float) -> None:
    """Per client: load its weights in place, then its steps of plain SGD."""
    params = list(model.parameters())
    for c, state in enumerate(states):
        with torch.no_grad():
            for p, s in zip(params, state):
                p.copy_(s)
        for step in range(x.shape[0]):
            for p in params:
                p.grad = None
            F.cross_entropy(model(x[step, c]), y[step, c]).backward()
            with torch.no_grad():
                for p in params:
                    p.add_(p.grad, alpha=-lr)
        with torch.no_grad():
            for p, s in zip(params, state):
                s.copy_(p)


def stacked(models: list[torch.nn.Module]) -> tuple[dict, dict]:
    """The clients' weights and buffers stacked along a new first dimension, in the standard
    (contiguous) layout: torch 2.13's vmap cannot clone channels-last tensors ("NYI:
    Tensor.clone(memory_format) inside vmap"), so the vmap path does not use the channels-last
    weights the other two use. (That alone does not rescue ``resnet18``: see the module docstring.)"""
    params, buffers = stack_module_state(models)
    params = {k: v.detach().contiguous().requires_grad_() for k, v in params.items()}
    return params, {k: v.contiguous() for k, v in buffers.items()}


def vmap_trainer(model):
    """A function (params, buffers, x, y) -> per-client gradients, vmapped over clients."""
    base = copy.deepcopy(model).to("meta")

    def loss(params, buffers, xb, yb):
        return F.cross_entropy(functional_call(base, (params, buffers), (xb,)), yb)

    return vmap(grad(loss), in_dims=(0, 0, 0, 0))


def run_vmap(step_fn, params, buffers, x, y, lr: float) -> None:
    for step in range(x.shape[0]):
        grads = step_fn(params, buffers, x[step], y[step])
        with torch.no_grad():
            for key, g in grads.items():
                params[key].add_(g, alpha=-lr)


def run_concat(model, x, y, lr: float) -> None:
    params = list(model.parameters())
    for step in range(x.shape[0]):
        for p in params:
            p.grad = None
        xb = x[step].reshape(-1, *x.shape[3:])
        F.cross_entropy(model(xb), y[step].reshape(-1)).backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-lr)


def check_vmap(name: str, shape, device: torch.device, batch: int, lr: float) -> float:
    """Max relative difference of one step's weights, vmap vs sequential, 2 clients."""
    models = client_models(name, shape, 2, device)
    x, y = make_data(shape, 2, 1, batch, device, seed=1)
    states = [[p.detach().clone() for p in m.parameters()] for m in models]
    run_sequential(copy.deepcopy(models[0]), states, x, y, lr)
    params, buffers = stacked(models)
    run_vmap(vmap_trainer(models[0]), params, buffers, x, y, lr)
    worst = 0.0
    for i, together in enumerate(params.values()):
        for c in range(2):
            ref = states[c][i]
            worst = max(worst, ((together[c] - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item())
    return worst


def timed(fn, device: torch.device, reps: int) -> float:
    """Median seconds of ``reps`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def samples(x: torch.Tensor) -> int:
    """Training samples in one repetition: steps x clients x batch."""
    return x.shape[0] * x.shape[1] * x.shape[2]


def rate_sequential(models, x, y, args, device) -> float:
    states = [[p.detach().clone() for p in m.parameters()] for m in models]
    worker = copy.deepcopy(models[0])
    return samples(x) / timed(
        lambda: run_sequential(worker, states, x, y, args.lr), device, args.reps)


def rate_vmap(models, x, y, args, device) -> float | str:
    try:
        params, buffers = stacked(models)
        step_fn = vmap_trainer(models[0])
        return samples(x) / timed(
            lambda: run_vmap(step_fn, params, buffers, x, y, args.lr), device, args.reps)
    except torch.OutOfMemoryError:
        return "out of memory"


def rate_concat(model, x, y, args, device) -> float | str:
    try:
        return samples(x) / timed(
            lambda: run_concat(model, x, y, args.lr), device, args.reps)
    except torch.OutOfMemoryError:
        return "out of memory"


def bench_one(name: str, dataset: str, k: int, args, device: torch.device, with_vmap: bool = True) -> dict[str, float | str]:
    """Samples/s of the three ways for K clients of ``name`` (each way's memory freed before the next)."""
    shape = input_shape(dataset)
    x, y = make_data(shape, k, args.steps, args.batch_size, device)
    models = client_models(name, shape, k, device)
    out = {"sequential": rate_sequential(models, x, y, args, device),
           "vmap": rate_vmap(models, x, y, args, device) if with_vmap else "not supported"}
    model = models[0]
    models.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    out["concat"] = rate_concat(model, x, y, args, device)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="cnn-small,cnn,lenet,resnet18")
    p.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    p.add_argument("--cpu-max-clients", type=int, default=20,
                   help="on CPU, cap each client count at this (0 = no cap)")
    p.add_argument("--steps", type=int, default=2, help="SGD steps per client per repetition")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0 = torch's default)")
    p.add_argument("--tol", type=float, default=None,
                   help="first step, vmap vs sequential, relative (default 1e-4; 1e-2 with --tf32 on CUDA)")
    p.add_argument("--tf32", action="store_true", help="allow TF32 on CUDA (off by default, as a run's cuda-tf32)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = default_device()
    set_cuda_precision(args.tf32)
    tol = args.tol if args.tol is not None else (1e-2 if args.tf32 and device.type == "cuda" else 1e-4)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} torch threads"
    print(f"device: {device} ({where}); torch {torch.__version__}; TF32 {'on' if args.tf32 else 'off'};"
          f" first-step tolerance {tol:.0e}; batch {args.batch_size}, {args.steps} steps"
          f" per client, median of {args.reps}", flush=True)
    print("| model | dataset | clients | sequential samples/s | vmap samples/s | concat samples/s | vmap / sequential |"
          " concat / sequential |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for name in args.models.split(","):
        dataset = DEFAULT_DATASET.get(name, "mnist")
        try:
            diff = check_vmap(name, input_shape(dataset), device, args.batch_size, args.lr)
            unsupported = None
        except RuntimeError as exc:  # an operator torch's vmap does not batch
            diff, unsupported = None, str(exc).splitlines()[0]
        if diff is not None and diff > tol:
            raise SystemExit(f"{name}: vmap's first step differs from the sequential one by {diff:.2e} (relative),"
                             f" above --tol {tol:.0e}")
        for k in args.clients:
            if device.type == "cpu" and args.cpu_max_clients:
                k = min(k, args.cpu_max_clients)
            r = bench_one(name, dataset, k, args, device, with_vmap=unsupported is None)
            seq = float(r["sequential"])
            ratio = {m: (f"{r[m] / seq:.2f}" if isinstance(r[m], float) else "-") for m in ("vmap", "concat")}
            cells = [f"{r[m]:.0f}" if isinstance(r[m], float) else str(r[m]) for m in ("sequential", "vmap", "concat")]
            print(f"| `{name}` | {dataset} | {k} | {' | '.join(cells)} | {ratio['vmap']} | {ratio['concat']} |", flush=True)
        if unsupported:
            print(f"    `{name}`: vmap not run: {unsupported}", flush=True)
        else:
            print(f"    `{name}`: vmap vs sequential after one step, max relative difference {diff:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
