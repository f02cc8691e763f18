"""Estimated run time of a comparison on this machine, printed by ``run_simulation.py --check``.

An estimate, not a measurement: a short probe times a few local SGD steps of each model the
runs use (one thread, the configured batch size, random inputs) and the server's forward pass;
the arithmetic then counts what a run does:

    run = START + rounds * (ceil(K * C) clients * steps * step * cost / parallel + eval + ROUND)
    steps = local-epochs * ceil((N_train / K) / batch-size)
    eval = N_test * forward-per-example                (the server's test split, every round)

with K clients, C = fraction-fit, N_train / N_test the sizes of the run's splits (``split_sizes``:
the local parquet files' row counts, else the hub's; an even share per client: Dirichlet splits
vary around it), ``cost`` the method's local step relative to plain SGD
(the method's ``LocalUpdate.step_cost``, set from the measured run times in docs/results:
two forward-backward passes for the sharpness-aware methods, ...), ``parallel``
the clients trained at once (CPU cores, one per client as run_simulation's default), START the
launch and end of one run, ROUND what Flower adds to every round beyond the arithmetic (the
grid's 0.1 s polls, the messages and the ClientApp built anew for each of them, the server's
diagnostics). A loaded machine makes the probe, and so the estimate, slower.

START and ROUND are measured, not guessed (docs/performance.md section 9): from launch to the
first fit a run spends about 18 s in `flwr run`'s submission, `flwr-simulation`'s imports, Ray's
start and the actors' imports, and about 4 s after its last round stopping them; with START =
12 s and no ROUND the estimate fell short of the idle 2-core CPU's measured sweeps by a quarter
(fedpgvc-fmnist-dir05: 35 min estimated, 45 measured for 24 runs of 60 rounds; fedgam-fmnist-dir03:
43 against 59, part of it under load). START = 20 s and ROUND = 0.3 s account for the
fedpgvc-fmnist-dir05 sweep (45 min) and bring fedgam-fmnist-dir03's to 55 min.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

START_SECONDS = 20.0
ROUND_SECONDS = 0.3
HUB_SIZES = {"mnist": (60000, 10000), "fashion_mnist": (60000, 10000), "cifar10": (50000, 10000),
             "cifar100": (50000, 10000)}  # (train, test) examples of the hub's splits
SYNTHETIC_PER_CLIENT = 100  # tasks/synthetic.py: lognormal(4, 2) + 50 examples a device, median about 105
SYNTHETIC_TEST = 1000


@dataclass(frozen=True)
class Probe:
    """Measured on this machine: seconds per local training step (one thread, one batch)
    and seconds per example of the server's forward pass."""

    step_seconds: float
    forward_seconds_per_example: float


def split_sizes(cfg: dict) -> tuple[int, int] | None:
    """(train, test) examples the run reads: the row counts of the data folder's
    ``<dataset>/{train,test}.parquet`` (their footers, nothing decoded) when the run reads one,
    else the hub's sizes; None when neither is known (a dataset added to ``tasks/catalogue.py``
    and read from the hub), so the estimate names the run instead of guessing."""
    if cfg["dataset"] == "synthetic":
        return None
    if cfg.get("data-dir"):
        from fl_app.api import parquet_rows

        rows = [parquet_rows(Path(cfg["data-dir"]) / cfg["dataset"] / f"{s}.parquet") for s in ("train", "test")]
        if all(rows):
            return rows[0], rows[1]
    return HUB_SIZES.get(cfg["dataset"])


def estimable(cfg: dict) -> bool:
    return cfg["dataset"] == "synthetic" or split_sizes(cfg) is not None


def local_steps(cfg: dict, clients: int) -> int:
    """Local steps of one client in one round (an even share of the training split)."""
    n = SYNTHETIC_PER_CLIENT if cfg["dataset"] == "synthetic" else split_sizes(cfg)[0] / clients
    return cfg["local-epochs"] * max(1, math.ceil(n / cfg["batch-size"]))


def run_seconds(cfg: dict, clients: int, probe: Probe, parallel: int, step_cost: float = 1.0) -> float:
    """Estimated seconds of one run of ``cfg`` (see the module docstring for the formula);
    ``step_cost``: the method's ``LocalUpdate.step_cost`` (its local step against one SGD step)."""
    per_round = max(cfg["min-fit-clients"], math.ceil(clients * cfg["fraction-fit"]))
    train = per_round * local_steps(cfg, clients) * probe.step_seconds * step_cost
    test = SYNTHETIC_TEST if cfg["dataset"] == "synthetic" else split_sizes(cfg)[1]
    evaluate = test * probe.forward_seconds_per_example
    return START_SECONDS + cfg["num-server-rounds"] * (train / max(1, parallel) + evaluate + ROUND_SECONDS)


def measure(cfg: dict, steps: int = 5) -> Probe:
    """Time ``steps`` SGD steps (after one warm-up step) of the configured model on random
    inputs of the configured batch size, and one forward pass of 256 examples; one thread."""
    import torch

    from fl_app.api import build_model, input_shape

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        shape = input_shape(cfg["dataset"])
        model = build_model(cfg["model"], shape)
        x = torch.randn(cfg["batch-size"], *_dims(shape))
        y = torch.randint(0, shape.classes, (cfg["batch-size"],))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(steps + 1):
            if i == 1:
                started = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        step = (time.perf_counter() - started) / steps
        with torch.no_grad():
            xs = torch.randn(256, *_dims(shape))
            started = time.perf_counter()
            model(xs)
            forward = (time.perf_counter() - started) / 256
    finally:
        torch.set_num_threads(threads)
    return Probe(step, forward)


def _dims(shape) -> tuple[int, ...]:
    return (shape.size,) if shape.channels == 0 else (shape.channels, shape.size, shape.size)


def describe(configs: list[dict], clients: int, parallel: int | None = None, kept: int = 0,
             step_costs: list[float] | None = None, paths: list[str] | None = None) -> str:
    """The estimate for a list of validated run configs, one probe per (dataset, model, batch);
    ``kept``: runs that already finished and cost nothing (named, not counted); ``step_costs``:
    each config's method's ``LocalUpdate.step_cost`` (default 1 each); ``paths``: each run's execution
    path (``fl_app/common/execution_path.py``). The arithmetic is the per-client path's: a cohort run's
    speed depends on the device (faster on a GPU; 0.45-0.83x the per-client loop on a CPU,
    ``bench/cohort.py``), so for cohort runs the line says it is the per-client estimate. Runs
    whose data size is unknown (``split_sizes``) are named, not estimated."""
    parallel = parallel or os.cpu_count() or 1
    kept_text = f" ({kept} finished runs kept)" if kept else ""
    if not configs:
        return f"estimated run time on this machine: nothing left to run{kept_text}"
    runs = [(c, cost) for c, cost in zip(configs, step_costs or [1.0] * len(configs)) if estimable(c)]
    unsized = sorted({c["dataset"] for c in configs if not estimable(c)})
    unsized_text = (f"; {len(configs) - len(runs)} runs on {', '.join(unsized)} not estimated: its size is read"
                    " from a local data folder (--data-dir), and the hub's is not known here") if unsized else ""
    if not runs:
        return f"estimated run time on this machine: unknown{kept_text}{unsized_text}"
    probes: dict[tuple, Probe] = {}
    total = 0.0
    for cfg, step_cost in runs:
        key = (cfg["dataset"], cfg["model"], cfg["batch-size"])
        if key not in probes:
            probes[key] = measure(cfg)
        total += run_seconds(cfg, clients, probes[key], parallel, step_cost)
    measured = "; ".join(f"{m} on {d}, batch {b}: {p.step_seconds * 1000:.1f} ms/step"
                         for (d, m, b), p in probes.items())
    cohort = sum(p == "cohort" for p in paths or [])
    cohort_text = (f"; {cohort} of them on the cohort path, estimated as per-client runs: faster on a GPU, slower on"
                   " a CPU (bench/cohort.py)") if cohort else ""
    return (f"estimated run time on this machine: {total / 60:.0f} min for {len(runs)} runs{kept_text} "
            f"(an estimate from a probe, {measured}; {parallel} clients in parallel; "
            f"{START_SECONDS:.0f} s start-up per run, {ROUND_SECONDS:g} s of Flower per round"
            f"{cohort_text}{unsized_text})")
