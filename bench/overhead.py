#!/usr/bin/env python
"""Flower overhead: the same FedAvg work as (a) a plain in-process PyTorch loop and (b) an
fl-drift simulation (``LocalSimulation`` -> ``flwr run`` on Ray). Not a test; run by hand:

    FL_DATA_DIR=/path/to/data python bench/overhead.py                 # a and b, 100 clients
    FL_DATA_DIR=/path/to/data python bench/overhead.py --mode sim --clients 200 --rounds 3
    FL_DATA_DIR=/path/to/data python bench/overhead.py --mode sim --execution per-client,cohort

Per path it also prints where a round's seconds go (``PHASES``) and its replies' megabytes: preparing, training, finishing,
the messages, aggregating, evaluating, from the timings the product records in metrics.csv
(the clients' ``prepare_seconds``/``train_seconds``/``fit_seconds``, spread over the processes
that ran them; the server's ``fit_phase_seconds``, ``aggregate_seconds``, ``evaluate_seconds``),
so a CPU run shows what a GPU run spends around the training.

``--execution per-client,cohort`` runs (b) once per path (``fl_app/common/execution_path.py``: one node
per client, or cohort nodes that train the round's clients in one vmap) and prints the training
samples per second over the rounds side by side (samples: the sampled partitions' sizes times
the local epochs, the same clients on both paths), with both final accuracies.

(a) reproduces the simulation's work exactly: the same partitions (``load_partition``), the
same clients each round (``SeededClientManager``'s draw: ``default_rng([seed, draw])`` over the
nodes ordered by partition id), the same initial model (``build_model(seed=seed)``), the same
batch order (the client's generator seed), the clients' own local loop (FedAvg's ``LocalUpdate``
through ``tasks.functional.local_round``), the n_k-weighted mean, and the server's
evaluation on the full test split before round 1 and after every round. Its final accuracy
must equal the simulation's (printed side by side).

Peak memory: every second the script sums RSS (and PSS, which counts shared pages once) over
its whole process tree (SuperLink, SuperExec, simulation, Ray daemons and actors), read from
/proc. (a) runs in a child process so that it is measured the same way. Reading PSS walks each
process's page tables: sampled 4 times a second over the simulation's 13 processes it took
6 s of CPU per run, on the same 2 cores as the run it measures; the sampler's own CPU time
is printed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fl_app.common.procfs import descendants, memory_kib  # noqa: E402


# ------------------------------------------------------------------ process-tree memory
class TreeMemory(threading.Thread):
    """Samples the summed RSS/PSS of the process tree under ``root`` until stopped."""

    def __init__(self, root: int, every: float = 1.0, include_root: bool = False):
        super().__init__(daemon=True)
        self.root, self.every, self.include_root = root, every, include_root
        self.peak_rss = self.peak_pss = 0
        self.peak_procs = 0
        self.peak_by_name: dict[str, int] = {}  # process kind -> peak summed PSS (KiB)
        self._halt = threading.Event()
        self.cpu_s = 0.0  # this sampler's own CPU time

    def run(self) -> None:
        while not self._halt.is_set():
            pids = list(descendants([self.root]))  # the tree under root, root included
            if not self.include_root:
                pids = [p for p in pids if p != self.root]
            rss = pss = 0
            by_name: dict[str, int] = {}
            for pid in pids:
                r, p = memory_kib(pid)
                rss, pss = rss + r, pss + p
                name = _kind(pid)
                by_name[name] = by_name.get(name, 0) + p
            for name, kib in by_name.items():
                self.peak_by_name[name] = max(self.peak_by_name.get(name, 0), kib)
            if rss > self.peak_rss:
                self.peak_rss, self.peak_procs = rss, len(pids)
            self.peak_pss = max(self.peak_pss, pss)
            self.cpu_s = time.thread_time()
            self._halt.wait(self.every)

    def stop(self) -> dict:
        self._halt.set()
        self.join()
        return {"peak_rss_mib": self.peak_rss / 1024, "peak_pss_mib": self.peak_pss / 1024,
                "procs_at_peak": self.peak_procs, "sampler_cpu_s": self.cpu_s,
                "peak_pss_mib_by_process": {k: round(v / 1024) for k, v in sorted(self.peak_by_name.items())}}


def _kind(pid: int) -> str:
    """A short name for a process of the tree: the Flower/Ray program it runs."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    for arg in argv[:3]:
        base = arg.rsplit("/", 1)[-1]
        if base.startswith(("flwr", "flower", "ray::", "raylet", "gcs_server")) or "ray" in base and "py" not in base:
            return base.split()[0]
    text = " ".join(argv)
    for key in ("default_worker.py", "dashboard", "log_monitor", "monitor.py", "runtime_env", "raylet", "gcs_server"):
        if key in text:
            return key
    return argv[0].rsplit("/", 1)[-1] if argv else "?"


class StartPhases(threading.Thread):
    """When each part of a simulated run's start appears, in seconds since ``t0`` (launch).

    Two sources: the processes of the run (read from /proc every ``every`` seconds; a process's
    own start time comes from its /proc stat, so it is exact to the kernel's 10 ms whatever the
    polling interval; a Ray worker becoming ``ray::ClientAppActor`` is seen at the next poll)
    and the run's output lines (``line()``, stamped on arrival: Flower's ``[INIT]``,
    ``[ROUND 1]``, the first ``configure_fit`` of round 1 = its fit instructions sent, and the
    first ``aggregate_fit`` = round 1's last reply in). Polling stops at ``[ROUND 2]``.
    """

    LINES = (("[INIT]", "ServerApp started ([INIT])"),
             ("Starting evaluation of initial", "round-0 evaluation begins"),
             ("[ROUND 1]", "round 1 begins ([ROUND 1])"),
             ("configure_fit", "round 1 fit instructions sent (first fit)"),
             ("aggregate_fit", "round 1 replies in (aggregate_fit)"),
             ("[ROUND 2]", "round 2 begins"))

    def __init__(self, root: int, t0: float, every: float = 0.3):
        super().__init__(daemon=True)
        self.root, self.t0, self.every = root, t0, every
        self.events: dict[str, float] = {}
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._boot = _boot_time() - (time.time() - time.perf_counter())  # boot time on perf_counter's clock
        self._tick = os.sysconf("SC_CLK_TCK")

    def mark(self, name: str, at: float | None = None) -> None:
        with self._lock:
            self.events.setdefault(name, (time.perf_counter() if at is None else at) - self.t0)

    def line(self, text: str) -> None:
        for needle, name in self.LINES:
            if needle in text:
                self.mark(name)
                if needle == "[ROUND 2]":
                    self._halt.set()

    def run(self) -> None:
        while not self._halt.is_set():
            for pid, (start, _) in descendants([self.root]).items():
                kind = _kind(pid)
                if pid == self.root or kind == "?":
                    continue
                if kind == "ray::ClientAppActor.run" or kind.startswith("ray::ClientAppActor"):
                    self.mark("first Ray actor named (ClientAppActor)")
                    continue
                self.mark(f"process started: {kind}", self._boot + int(start) / self._tick)
            self._halt.wait(self.every)

    def stop(self) -> dict[str, float]:
        self._halt.set()
        self.join()
        return dict(sorted(self.events.items(), key=lambda kv: kv[1]))


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime"):
            return float(line.split()[1])
    return 0.0


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# ------------------------------------------------------------------ configuration
def run_config(args: argparse.Namespace, results_dir: str) -> dict:
    from fl_app.registry import parse_override

    return {
        "strategy": "fedavg", "num-server-rounds": args.rounds, "fraction-fit": args.fraction,
        "min-fit-clients": 1, "min-available-clients": args.clients, "local-epochs": args.epochs,
        "batch-size": args.batch_size, "model": args.model, "dataset": args.dataset,
        "data-dir": str(Path(args.data_dir).resolve()), "seed": args.seed,
        "results-dir": results_dir, "run-name": "bench",
        **({"execution": "cohort", "num-virtual-clients": args.clients}
           if getattr(args, "execution_now", "per-client") == "cohort" else {}),
        **dict(parse_override(text) for text in args.overrides),
    }


def sampled_partitions(seed: int, draw: int, num_partitions: int, fraction: float, min_fit: int = 1) -> list[int]:
    """The partitions ``SeededClientManager.sample`` picks in its ``draw``-th call: Flower's
    FedAvg asks for max(int(N * fraction), min-fit-clients) of the N nodes, which the manager
    orders by partition id and draws from ``default_rng([seed, draw])``."""
    import numpy as np

    k = max(int(num_partitions * fraction), min_fit)
    rng = np.random.default_rng([seed, draw])
    return [int(i) for i in sorted(rng.choice(num_partitions, size=k, replace=False))]


# ------------------------------------------------------------------ (a) plain PyTorch
def plain_local_fit(model, global_state: dict, x, y, cfg: dict, pid: int, rnd: int) -> None:
    """One client's local training from ``global_state``, as the simulation's FedAvg client runs
    it: FedAvg's ``LocalUpdate`` through ``tasks.functional.local_round`` (the per-client path's
    loop and optimiser), the round's learning rate, batches shuffled by (seed, partition, round);
    the new weights are loaded into ``model``."""
    import torch

    from clients.fedavg import UPDATE
    from tasks.functional import Hyper, Round, local_round, module_state

    model.load_state_dict(global_state)
    params, buffers = module_state(model)
    lr = cfg["learning-rate"] * cfg["lr-decay"] ** (rnd - 1)
    gen = torch.Generator().manual_seed(hash((cfg["seed"], pid, rnd)) & 0x7FFFFFFF)
    job = Round(UPDATE, model, params, buffers, {}, {"buffers": buffers}, Hyper.from_config(cfg, lr, UPDATE.key_names()),
                x, y, cfg["batch-size"], cfg["local-epochs"], gen)
    result = local_round(job)
    with torch.no_grad():
        for name, tensor in {**dict(model.named_parameters()), **dict(model.named_buffers())}.items():
            tensor.copy_((result.params if name in result.params else result.buffers)[name])


def plain_round(model, global_state: dict, spec, cfg: dict, chosen: list[int], rnd: int, device) -> dict:
    """The chosen clients train one after another; the new global state is their n_k-weighted mean."""
    import torch

    from tasks.partitioning import load_partition

    total = 0
    summed = {k: torch.zeros_like(v) for k, v in global_state.items()}
    for pid in chosen:
        x, y = (t.to(device) for t in load_partition(spec, pid))
        plain_local_fit(model, global_state, x, y, cfg, pid, rnd)
        with torch.no_grad():
            for k, v in model.state_dict().items():
                summed[k] += v * len(x)
        total += len(x)
    return {k: v / total for k, v in summed.items()}


def plain(args: argparse.Namespace) -> dict:
    """The simulation's FedAvg work with no Flower: one process, weights stay tensors."""
    import torch

    from fl_app.registry import validate_config
    from tasks.datasets import input_shape
    from tasks.models import build_model, default_device
    from tasks.partitioning import PartitionSpec, check_data, load_test
    from tasks.train import evaluate

    if int(args.plain_threads):
        torch.set_num_threads(int(args.plain_threads))
    started = time.perf_counter()
    cfg = validate_config(run_config(args, tempfile.gettempdir()))
    device = default_device()
    spec = PartitionSpec.from_config(cfg, args.clients)
    check_data(spec)  # the server does this too before round 1
    x_test, y_test = (t.to(device) for t in load_test(spec))
    model = build_model(cfg["model"], input_shape(cfg["dataset"]), seed=cfg["seed"]).to(device)
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    setup = time.perf_counter() - started
    rounds, accuracy = [], []
    model.load_state_dict(global_state)
    accuracy.append(evaluate(model, x_test, y_test)[1])  # round 0, as Flower does
    for rnd in range(1, cfg["num-server-rounds"] + 1):
        t0 = time.perf_counter()
        chosen = sampled_partitions(cfg["seed"], rnd - 1, args.clients, cfg["fraction-fit"], cfg["min-fit-clients"])
        global_state = plain_round(model, global_state, spec, cfg, chosen, rnd, device)
        t_fit = time.perf_counter() - t0
        model.load_state_dict(global_state)
        accuracy.append(evaluate(model, x_test, y_test)[1])
        rounds.append({"round": rnd, "fit_s": t_fit, "round_s": time.perf_counter() - t0, "clients": chosen})
    return {"total_s": time.perf_counter() - started, "setup_s": setup, "rounds": rounds,
            "final_accuracy": accuracy[-1], "accuracy": accuracy, "torch_threads": torch.get_num_threads()}


def run_plain_child(args: argparse.Namespace) -> dict:
    """(a) in a child process, its memory sampled like (b)'s."""
    out = Path(tempfile.mkdtemp(prefix="bench-plain-")) / "plain.json"
    cmd = [sys.executable, __file__, "--mode", "plain-child", "--json", str(out), *child_flags(args)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    mem = TreeMemory(proc.pid, include_root=True)
    mem.start()
    rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"plain loop failed (exit {rc})")
    result = json.loads(out.read_text())
    shutil.rmtree(out.parent, ignore_errors=True)
    return {**result, "wall_s": wall, **mem.stop()}


def child_flags(args: argparse.Namespace) -> list[str]:
    return ["--clients", str(args.clients), "--fraction", str(args.fraction), "--epochs", str(args.epochs),
            "--batch-size", str(args.batch_size), "--rounds", str(args.rounds), "--model", args.model,
            "--dataset", args.dataset, "--data-dir", args.data_dir, "--seed", str(args.seed),
            "--plain-threads", str(args.plain_threads)]


# ------------------------------------------------------------------ (b) simulation
def simulation(args: argparse.Namespace) -> dict:
    from fl_app.registry import validate_config
    from runner.launch import LocalSimulation
    from tasks.partitioning import PartitionSpec, check_data

    results = tempfile.mkdtemp(prefix="bench-sim-")
    # as run_simulation.py does: a partitioning that cannot be made fails here, with its reason
    check_data(PartitionSpec.from_config(validate_config(run_config(args, results)), args.clients))
    t0 = time.perf_counter()
    phases = StartPhases(os.getpid(), t0)
    phases.start()
    with LocalSimulation() as sim:
        started = time.perf_counter()
        phases.mark("SuperLink healthy", started)
        mem = TreeMemory(os.getpid())
        mem.start()

        def on_line(text: str) -> None:
            phases.line(text)
            if args.verbose:
                print(text)

        rc = sim.run(run_config(args, results), num_supernodes=args.clients,
                     cpus_per_client=args.cpus_per_client, gpus_per_client=args.gpus_per_client,
                     on_line=on_line)
        run_s = time.perf_counter() - started
        phases.mark("flwr run returned")
        memory = mem.stop()
    total = time.perf_counter() - t0
    phases.mark("SuperLink and its processes stopped")
    start_phases = phases.stop()
    run_dir = Path(results) / "bench"
    if rc != 0 or not (run_dir / "summary.json").exists():
        raise SystemExit(f"simulation failed (exit {rc}); --verbose shows its output")
    summary = json.loads((run_dir / "summary.json").read_text())
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    shutil.rmtree(results, ignore_errors=True)
    return {"wall_s": run_s, "with_superlink_s": total, "server_total_s": summary["total_seconds"],
            "phase_rows": [{k: float(r[k]) for k in PHASE_COLUMNS if r.get(k) not in (None, "")} for r in rows],
            "round_s": [float(r["round_seconds"]) for r in rows],
            "fit_phase_s": [float(r["fit_phase_seconds"]) for r in rows],
            "client_fit_s": [float(r["fit_seconds_mean"]) * int(r["num_clients"]) for r in rows],
            "final_accuracy": float(rows[-1]["test_accuracy"]), "start_phases": start_phases, **memory}


# metrics.csv columns the phase breakdown reads (fl_app/server/recording.py, node_client.round_timings)
PHASE_COLUMNS = ("num_clients", "round_seconds", "fit_phase_seconds", "aggregate_seconds", "evaluate_seconds",
                 "fit_seconds_mean", "prepare_seconds_mean", "train_seconds_mean", "bytes_up_per_client")
PHASES = (("preparing", "node steps, client built, data loaded/decoded, prepare_round"),
          ("training", "the local loop (cohort: the one cohort_round)"),
          ("finishing", "finish_round, reply arrays, state kept"),
          ("messages", "configure, serialising, Flower/Ray transport, an idle actor"),
          ("aggregating", "checks, screening, drift columns, aggregation"),
          ("evaluating", "the server's evaluation on the test split"),
          ("other", "recording, checkpoint, the rest of the round"))


def round_phases(row: dict, parallel: int) -> dict[str, float] | None:
    """One metrics.csv row as wall-clock seconds per phase (``PHASES``): the clients' own
    timings (summed over the round's K clients, spread over the ``parallel`` processes that run
    them: 2 one-core actors per-client, 1 cohort node), the rest of the fit phase as the
    messages, the server's aggregate and evaluate seconds as recorded. None for a row without
    the timings (an older run)."""
    need = ("num_clients", "fit_phase_seconds", "fit_seconds_mean", "prepare_seconds_mean", "train_seconds_mean",
            "aggregate_seconds", "evaluate_seconds", "round_seconds")
    if any(k not in row for k in need):
        return None
    k = row["num_clients"]
    prepare, train = k * row["prepare_seconds_mean"] / parallel, k * row["train_seconds_mean"] / parallel
    fit = k * row["fit_seconds_mean"] / parallel
    out = {"preparing": prepare, "training": train, "finishing": fit - prepare - train,
           "messages": row["fit_phase_seconds"] - fit, "aggregating": row["aggregate_seconds"],
           "evaluating": row["evaluate_seconds"]}
    out["other"] = row["round_seconds"] - row["fit_phase_seconds"] - out["aggregating"] - out["evaluating"]
    out["round"] = row["round_seconds"]
    # the replies' bytes a round (a cohort's summed reply: the node's one reply over its clients)
    out["mb_up"] = k * row.get("bytes_up_per_client", 0.0) / 1e6
    return out


def phase_breakdown(b: dict, parallel: int) -> dict[str, dict[str, float]]:
    """Seconds per phase of round 1 (start-up work lands there) and the mean of rounds 2.."""
    per_round = [round_phases(r, parallel) for r in b["phase_rows"]]
    if not per_round or any(p is None for p in per_round):
        return {}
    later = per_round[1:] or per_round
    return {"round 1": per_round[0],
            "rounds 2+": {k: statistics.fmean(p[k] for p in later) for k in per_round[0]}}


def print_phases(name: str, phases: dict[str, dict[str, float]]) -> None:
    if not phases:
        print(f"    {name}: no phase timings in metrics.csv", flush=True)
        return
    for which, p in phases.items():
        outside = p["round"] - p["training"] - p["evaluating"]
        print(f"    {name} {which}: round {p['round']:.2f} s = " + ", ".join(
            f"{k} {p[k]:.2f}" for k, _ in PHASES) + f"; outside training and evaluation {outside:.2f} s", flush=True)


def simulation_on(args: argparse.Namespace, execution: str) -> dict:
    """(b) on one path (``per-client`` or ``cohort``), with its training samples per second over
    the rounds; prints one line."""
    if execution not in ("per-client", "cohort"):
        raise SystemExit(f"--execution {execution!r}: valid paths are per-client, cohort")
    b = simulation(argparse.Namespace(**{**vars(args), "execution_now": execution}))
    b["execution"] = execution
    b["samples_per_s"] = trained_samples(args, len(b["round_s"])) / sum(b["round_s"])
    print(f"(b) {execution}: {b['samples_per_s']:,.0f} training samples/s over {len(b['round_s'])} rounds"
          f" ({sum(b['round_s']):.1f} s), final accuracy {b['final_accuracy']:.4f}", flush=True)
    b["phases"] = phase_breakdown(b, 1 if execution == "cohort" else parallel_actors(args))
    print_phases(execution, b["phases"])
    return b


def trained_samples(args: argparse.Namespace, rounds: int) -> int:
    """Training samples of ``rounds`` rounds: the sampled partitions' sizes times the epochs."""
    from fl_app.registry import validate_config
    from tasks.partitioning import PartitionSpec, federated_dataset

    fds = federated_dataset(PartitionSpec.from_config(validate_config(run_config(args, tempfile.gettempdir())),
                                                      args.clients))
    sizes = [len(fds.load_partition(i, "train")) for i in range(args.clients)]
    return args.epochs * sum(sizes[p] for draw in range(rounds)
                             for p in sampled_partitions(args.seed, draw, args.clients, args.fraction))


def parallel_actors(args: argparse.Namespace) -> int:
    """How many clients Ray runs at once: CPUs / cpus-per-client, and with
    ``--gpus-per-client`` F > 0 at most (visible GPUs) / F as well."""
    actors = max(1, int((os.cpu_count() or 1) // args.cpus_per_client))
    if args.gpus_per_client > 0:
        import torch

        actors = min(actors, max(1, int(torch.cuda.device_count() // args.gpus_per_client)))
    return actors


def check_devices(args: argparse.Namespace) -> None:
    """``--gpus-per-client`` F > 0 needs CUDA: said in one line before anything starts."""
    if args.gpus_per_client < 0:
        raise SystemExit(f"--gpus-per-client {args.gpus_per_client}: must be >= 0 (0 = CPU only)")
    if args.gpus_per_client > 0:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit(f"--gpus-per-client {args.gpus_per_client}: no CUDA device here "
                             "(torch.cuda.is_available() is False); use 0 on a CPU-only machine")


def round_breakdown(args: argparse.Namespace, b: dict) -> dict:
    """Where a simulated round's time goes, rounds 2.. (round 1 carries the start-up work).

    The fit phase (sampling to the last reply) holds the clients' own fit time, spread over
    the actors, plus transport. Flower's simulation hands a round's messages to the actors in
    node order (its extractor walks the nodes by partition id), so an actor may idle while the
    other finishes its last client; that part is modelled from the partition sizes: a client's
    fit time taken proportional to n_k (list scheduling, first come first served).
    """
    import heapq

    from fl_app.registry import validate_config
    from tasks.partitioning import PartitionSpec, federated_dataset

    actors = parallel_actors(args)
    fds = federated_dataset(PartitionSpec.from_config(validate_config(run_config(args, tempfile.gettempdir())), args.clients))
    sizes = [len(fds.load_partition(i, "train")) for i in range(args.clients)]
    out = {"actors": actors, "fit_phase": 0.0, "ideal": 0.0, "fifo": 0.0, "round": 0.0, "n": 0}
    for draw in range(1, len(b["round_s"])):
        jobs = [sizes[p] for p in sampled_partitions(args.seed, draw, args.clients, args.fraction)]
        per_sample = b["client_fit_s"][draw] / sum(jobs)
        free = [0.0] * actors
        for n in jobs:
            heapq.heappush(free, heapq.heappop(free) + n * per_sample)
        out["fifo"] += max(free)
        out["ideal"] += b["client_fit_s"][draw] / actors
        out["fit_phase"] += b["fit_phase_s"][draw]
        out["round"] += b["round_s"][draw]
        out["n"] += 1
    return {k: (v / out["n"] if k not in ("actors", "n") and out["n"] else v) for k, v in out.items()}


# ------------------------------------------------------------------ main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["both", "plain", "sim", "plain-child"], default="both")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--fraction", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--model", default="cnn")
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--data-dir", default=os.environ.get("FL_DATA_DIR", str(ROOT.parent / "shared" / "data")))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpus-per-client", type=float, default=1.0,
                   help="Ray CPUs per client (2 cores: 1 -> two 1-thread actors in parallel)")
    p.add_argument("--plain-threads", default="1,0",
                   help="torch thread counts of the plain loop, comma-separated, each run once (0 = torch's "
                        "default, one per core); the fastest is the compute floor")
    p.add_argument("--gpus-per-client", type=float, default=0.0)
    p.add_argument("--repeat", type=int, default=1,
                   help="passes of (a) then (b); each pass gives a ratio, and their median is printed")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="another run-config key for (b), e.g. overlap-evaluation=false (repeatable)")
    p.add_argument("--execution", default="per-client",
                   help="(b)'s path(s), comma-separated: per-client, cohort (each run once, side by side)")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--verbose", action="store_true", help="echo the flwr run output")
    return p.parse_args(argv)


def print_start_phases(events: dict[str, float]) -> None:
    """The start of a simulated run, event by event: seconds since launch and since the event before."""
    print("    start-up, seconds since launch (+ since the event before):", flush=True)
    before = 0.0
    for name, at in events.items():
        print(f"      {at:7.2f} s  (+{at - before:5.2f})  {name}", flush=True)
        before = at
    first_fit = events.get("round 1 fit instructions sent (first fit)")
    if first_fit is not None:
        print(f"    seconds before round 1's first fit: {first_fit:.2f} (target <= 5)", flush=True)


def print_phase_table(phases: dict[str, dict[str, dict[str, float]]]) -> None:
    """Seconds per round by phase, rounds 2.. (mean), one column per path, as a markdown table."""
    paths = [e for e, p in phases.items() if p]
    if not paths:
        return
    print("seconds per round by phase, rounds 2+ (mean); round 1 in brackets:", flush=True)
    print("| phase | what | " + " | ".join(paths) + " |", flush=True)
    print("|---|---|" + "---|" * len(paths), flush=True)
    for key, what in (*PHASES, ("round", "the whole round")):
        print(f"| {key} | {what} | " + " | ".join(
            f"{phases[e]['rounds 2+'][key]:.2f} ({phases[e]['round 1'][key]:.2f})" for e in paths) + " |", flush=True)
    print("| outside training and evaluation | | " + " | ".join(
        f"{p['round'] - p['training'] - p['evaluating']:.2f}" for p in (phases[e]['rounds 2+'] for e in paths))
        + " |", flush=True)
    print("| MB of replies a round | the clients' (a cohort's: its nodes') reply arrays | " + " | ".join(
        f"{phases[e]['rounds 2+']['mb_up']:.1f}" for e in paths) + " |", flush=True)


def plain_pass(args: argparse.Namespace, report: dict) -> None:
    """(a) once per thread count asked for, into ``report``: every run, and the fastest (the
    compute floor) as ``plain``."""
    report["plain_runs"] = []
    for threads in [int(t) for t in str(args.plain_threads).split(",")]:
        load = loadavg()
        a = run_plain_child(argparse.Namespace(**{**vars(args), "plain_threads": threads}))
        a["load_before"] = load
        report["plain_runs"].append(a)
        rounds_a = sum(r["round_s"] for r in a["rounds"])
        print(f"(a) plain PyTorch: {a['wall_s']:.1f} s wall (setup {a['setup_s']:.1f} s, rounds {rounds_a:.1f} s),"
              f" {a['torch_threads']} torch threads, final accuracy {a['final_accuracy']:.4f}, peak RSS {a['peak_rss_mib']:.0f} MiB"
              f" (PSS {a['peak_pss_mib']:.0f}; sampler {a['sampler_cpu_s']:.1f} s CPU), load {load:.2f}", flush=True)
    report["plain"] = min(report["plain_runs"], key=lambda r: r["wall_s"])  # the compute floor


def one_pass(args: argparse.Namespace) -> dict:
    """(a) and/or (b) once; with both, the ratio b / a."""
    report: dict = {}
    if args.mode in ("both", "plain"):
        plain_pass(args, report)
    if args.mode in ("both", "sim"):
        executions = [e.strip() for e in args.execution.split(",") if e.strip()]
        for execution in executions[1:]:  # the other paths first: (b) below is the first one
            report[f"sim_{execution}"] = simulation_on(args, execution)
        report["load_before_b"] = loadavg()
        b = report["sim"] = simulation_on(args, executions[0])
        print(f"(b) simulation: {b['wall_s']:.1f} s wall for flwr run ({b['with_superlink_s']:.1f} s with SuperLink"
              f" start/stop; server-side {b['server_total_s']:.1f} s; rounds {sum(b['round_s']):.1f} s),"
              f" final accuracy {b['final_accuracy']:.4f}, peak RSS {b['peak_rss_mib']:.0f} MiB"
              f" (PSS {b['peak_pss_mib']:.0f}, {b['procs_at_peak']} processes; sampler {b['sampler_cpu_s']:.1f} s CPU), load {report['load_before_b']:.2f}",
              flush=True)
        print(f"    peak PSS MiB by process kind: {b['peak_pss_mib_by_process']}", flush=True)
        print_start_phases(b["start_phases"])
        if len(b["round_s"]) > 1:
            d = report["round_breakdown"] = round_breakdown(args, b)
            print(f"    per round from round 2 (mean): {d['round']:.2f} s = fit phase {d['fit_phase']:.2f} s"
                  f" + server after the replies {d['round'] - d['fit_phase']:.2f} s; fit phase = clients' fit time"
                  f" over {d['actors']} actors {d['ideal']:.2f} s + idle actor at the round's end (modelled)"
                  f" {d['fifo'] - d['ideal']:.2f} s + transport and the rest {d['fit_phase'] - d['fifo']:.2f} s",
                  flush=True)
    if args.mode in ("both", "sim") and len(executions) > 1:
        print_phase_table({e: report['sim' if i == 0 else f'sim_{e}'].get("phases", {})
                           for i, e in enumerate(executions)})
        print("samples/s over the rounds: " + ", ".join(
            f"{e} {report['sim' if i == 0 else f'sim_{e}']['samples_per_s']:,.0f} (final accuracy"
            f" {report['sim' if i == 0 else f'sim_{e}']['final_accuracy']:.4f})" for i, e in enumerate(executions)),
            flush=True)
    if args.mode == "both":
        a, b = report["plain"], report["sim"]
        rounds_a = sum(r["round_s"] for r in a["rounds"])
        report["ratio_wall"] = b["wall_s"] / a["wall_s"]
        report["ratio_rounds"] = sum(b["round_s"]) / rounds_a
        print(f"ratio b/a (a = fastest plain loop, {a['torch_threads']} torch threads): {report['ratio_wall']:.2f} end to"
              f" end (flwr run vs plain process), {report['ratio_rounds']:.2f} over the rounds only; load now"
              f" {loadavg():.2f}", flush=True)
        for other in report["plain_runs"]:
            print(f"    vs the plain loop with {other['torch_threads']} torch threads: "
                  f"{b['wall_s'] / other['wall_s']:.2f} end to end", flush=True)
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    check_devices(args)
    if args.mode == "plain-child":
        Path(args.json).write_text(json.dumps(plain(args)))
        return 0
    desc = (f"{args.dataset} {args.model}, {args.clients} clients, C={args.fraction}, E={args.epochs},"
            f" B={args.batch_size}, {args.rounds} rounds, cpus-per-client={args.cpus_per_client}")
    print(desc, flush=True)
    report: dict = {"config": desc, "passes": []}
    for rep in range(args.repeat):
        if args.repeat > 1:
            print(f"--- pass {rep + 1}/{args.repeat}", flush=True)
        report["passes"].append(one_pass(args))
    ratios = [p["ratio_wall"] for p in report["passes"] if "ratio_wall" in p]
    if len(ratios) > 1:
        report["ratio_wall_median"] = statistics.median(ratios)
        print(f"end-to-end ratio per pass: {', '.join(f'{r:.3f}' for r in ratios)}; median "
              f"{report['ratio_wall_median']:.3f}", flush=True)
    print_acceptance(report["passes"])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def print_acceptance(passes: list[dict]) -> None:
    """The four overhead targets (end to end and per round against the base, seconds to round 1's
    first fit, peak memory), each as the median over the passes (the load is printed too: only an
    idle machine's numbers are meant to be held against them)."""
    sims = [p["sim"] for p in passes if "sim" in p]
    if not sims:
        return
    first_fit = [s["start_phases"].get("round 1 fit instructions sent (first fit)") for s in sims]
    first_fit = [t for t in first_fit if t is not None]
    rows = [("median end to end b/a", [p["ratio_wall"] for p in passes if "ratio_wall" in p], "<= 1.15"),
            ("median over the rounds b/a", [p["ratio_rounds"] for p in passes if "ratio_rounds" in p], "<= 1.05"),
            ("median seconds from launch to round 1's first fit", first_fit, "<= 5"),
            ("peak PSS of the whole run (MiB, max over passes)", [max(s["peak_pss_mib"] for s in sims)], "<= 1536")]
    print(f"acceptance (load now {loadavg():.2f}):", flush=True)
    for name, values, target in rows:
        shown = f"{statistics.median(values):.2f}" if values else "n/a (needs --mode both)"
        print(f"    {name}: {shown} (target {target})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
