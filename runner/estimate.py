"""Estimated run time of a comparison on this machine, printed by ``run_simulation.py --check``
(and used by the sweep's progress lines for its ETA).

An estimate, not a measurement, given as a range. Two things are measured when it is made:

- a probe of each model the runs use (a few local SGD steps, one thread, the configured batch
  size, random inputs, and the server's forward pass): ``step`` and ``fwd``;
- a reference probe of this machine's speed now (``reference_seconds``: a fixed small torch and
  Python workload), which scales the parts of a run that no model probe sees (Flower's and Ray's
  start, the nodes' start-up, the ClientApp built each round): ``s = reference now / reference
  when the timing was recorded``; a loaded machine makes both probes, and so the estimate, slower.

The arithmetic then counts what a run does, with a ``Timing`` of this machine (what its recent
runs took, below):

    run   = outside * s + K * node * s + R * round
    round = m * (prepare * s + steps * step * cost * train_ratio) / parallel
            + N_eval * fwd * eval_ratio + flower * s
    steps = local-epochs * ceil((N_train / K) / batch-size)
    sweep = SWEEP_SECONDS * reference now / SWEEP_REFERENCE   (once: validating, packaging, the report)

with K clients (nodes), R rounds, m = max(min-fit-clients, ceil(K * fraction-fit)) clients a
round, ``cost`` the method's local step against plain SGD (``LocalUpdate.step_cost``),
N_train / N_eval the sizes of the splits (``split_sizes``: the local parquet files' rows, else
the hub's; the server evaluates the validation share of the training split when
``validation-fraction`` is set). A ``Timing`` holds, each read from one finished run:

- ``outside``: the runner's wall time of the run less the server's ``total_seconds``
  (``flwr run``'s submission, Ray's start, the actors' imports, the stop);
- ``node``: the server's start-up per node (``total_seconds`` less its rounds' ``round_seconds``,
  divided by the nodes: the initial evaluation and every node asked for its partition, which
  took 2.6-2.9 s a node at load 5-9 on the 2-core machine: the fixed 20 s of start-up an earlier
  estimate assumed was a third of it for 20 nodes);
- ``prepare``: a client's seconds a round before its local loop (node steps, the ClientApp and
  its data: ``prepare_seconds`` of metrics.csv);
- ``train_ratio``: a client's local loop (``train_seconds``) against ``steps * step * cost`` with
  the probe measured right after the run (2 processes training on 2 cores under load, not the
  probe's one quiet thread);
- ``parallel``: the clients that trained at once (their fit seconds over the fit phase's),
  measured, not assumed to be the core count;
- ``eval_ratio``: the server's evaluation against ``N_eval * fwd``;
- ``flower``: the rest of a round (messages, polls, aggregation).

Where the timings come from: the runner appends one per finished run to this machine's timing
file (``timings_file``: ``$FL_DRIFT_TIMINGS``, else ``timings.jsonl`` in ``$FL_DRIFT_CACHE`` or
``~/.cache/fl-drift``) and the
estimate reads the recent ones made on this host with this many cores (``recent_timings``);
without any it uses ``DEFAULT_TIMINGS``, measured on the project's 2-core CPU machine (listed
below with their runs).

The load. A timing records the threads running beside its run as it started (``load_now``: the
machine's runnable threads outside the runner's own process tree, so that the sweep's SuperLink
and Ray do not count and ``--check``, made before any of them start, reads the same quantity).
The estimate uses the timings recorded nearest the load now (``closest_in_load``), this
machine's own unless the defaults have one more than ``OWN_REACH`` nearer (``choose_timings``).
A timing of this machine from another load is moved to this one by a straight line,
``slowdown(b) = 1 + LOAD_SLOWDOWN * b / cores``, for the start-up, the nodes and Flower's parts
(the local steps and the evaluation follow the model's probe, which is taken now, at this
load); the defaults, from another machine, are moved by the reference probe. The range is the
used timings' spread, widened by ``1 + margin()`` either way: 1.2 idle, more the more the load
exceeds the cores, and more again the farther the timings' load is from the load now (and
``OTHER_MACHINE_MARGIN`` more with the defaults). What no estimate can see is a load that
changes during the run: a sweep started beside work that ends (or begins) part-way lands outside
its range, and the end of a sweep prints the time taken against the estimate so that the miss
is seen. Measured on the 2-core machine for the README's comparison, constant load (busy
single-thread processes), see docs/running.md.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

HUB_SIZES = {"mnist": (60000, 10000), "fashion_mnist": (60000, 10000), "cifar10": (50000, 10000),
             "cifar100": (50000, 10000)}  # (train, test) examples of the hub's splits
SYNTHETIC_PER_CLIENT = 100  # tasks/synthetic.py: lognormal(4, 2) + 50 examples a device, median about 105
SYNTHETIC_TEST = 1000
MARGIN = 0.2  # the range: the timings' spread, widened by a factor 1.2 either way on an idle machine ...
LOAD_MARGIN = 0.1  # ... and by 0.1 more for each load of the machine's cores beyond them (at most MAX_MARGIN)
MAX_MARGIN = 0.6
FAR_MARGIN = 0.25  # ... and by 0.25 more for each core's worth of load between the load now and the timings' (at most
MAX_FAR_MARGIN = 1.0  # MAX_FAR_MARGIN in all): the load model below is a straight line, fitted at loads 0 and 4
LOAD_SLOWDOWN = 1.5  # ``slowdown``: a run's start-up, nodes and rounds beside b busy threads on c cores take
# 1 + LOAD_SLOWDOWN * b / c times their idle seconds (the README's comparison, 2 cores: 37 s a run idle, 150 s
# beside 4 busy processes)
OTHER_MACHINE_MARGIN = 0.15  # ... and by 0.15 more when the timings are the defaults (another machine's: the
# README's comparison took 4.0 min idle here where they gave 5.0)
OWN_REACH = 1.0  # this machine's timings are used unless a default one was recorded this much nearer the load now
CLOSEST_TIMINGS = 8  # the timings recorded nearest the load now that the estimate uses (closest_in_load) ...
LOAD_WINDOW = 0.25  # ... none of them more than a quarter of a process's load farther from it than the closest
RECENT_DAYS = 30
KEPT_TIMINGS = 200  # the timing file keeps the latest runs only
PROBE_TTL = 300.0  # seconds a probe is reused within one process (a sweep's search and table; a test session)
_probed: dict = {}  # key -> (when, value): the probes of this process (``probed``)


@dataclass(frozen=True)
class Probe:
    """Measured on this machine: seconds per local training step (one thread, one batch)
    and seconds per example of the server's forward pass."""

    step_seconds: float
    forward_seconds_per_example: float


@dataclass(frozen=True)
class Timing:
    """What one finished run took on this machine, in the terms of the module docstring:
    ``reference`` (the reference probe when it was recorded), ``outside``, ``node``,
    ``prepare``, ``flower`` in seconds; ``train_ratio``, ``eval_ratio``, ``parallel`` as numbers."""

    reference: float
    outside: float
    node: float
    prepare: float
    train_ratio: float
    parallel: float
    eval_ratio: float
    flower: float
    background: float = -1.0  # ``load_now`` as the run started: the processes beside it; -1 unknown


# Measured on the project's 2-core CPU machine, each from one run of the runner at the load
# given (and the reference probed after it). Used only until this machine has recorded timings of its own.
# The sweep's own seconds, once (validating, packaging the app, the estimate's probes, the comparison and
# its plots): 9.4 s at the reference below (mnist cnn-small, 10 clients, 3 rounds: 54.6 s, its run 45.2 s).
# The default timings' ``outside`` is their command's wall time less this and the server's total_seconds.
SWEEP_SECONDS, SWEEP_REFERENCE = 9.4, 0.0054
DEFAULT_TIMINGS = (
    # idle: mnist cnn-small, 50 clients (pathological, 2 classes each), fraction 0.2, 10 rounds, FedAvg and
    # FedACG, 4 seeds each: 8 runs in 5.0 min from load 0.2 (the median of their 8 timings; 4.7 ms/step probed;
    # the reference as --check takes it on the idle machine, 0.0050-0.0057 s)
    Timing(reference=0.0053, outside=7.9, node=0.21, prepare=0.009, train_ratio=0.94, parallel=1.64,
           eval_ratio=0.35, flower=0.0, background=0.0),
    # the same command (6 rounds, 3 seeds) beside 4 busy processes, each in its own session (load_now 4.0-4.2):
    # 6 runs in 8.5 min (the median of their 6 timings; 12.7-18.7 ms/step probed)
    Timing(reference=0.0132, outside=14.2, node=0.55, prepare=0.022, train_ratio=1.66, parallel=1.79,
           eval_ratio=0.90, flower=0.0, background=4.0),
    # mnist cnn-small, 10 clients, fraction 0.3, 3 rounds: 104 s at load 4.4-8.8 (6.2-8.3 ms/step probed)
    Timing(reference=0.00568, outside=22.7, node=2.75, prepare=3.36, train_ratio=2.45, parallel=1.74,
           eval_ratio=4.05, flower=0.0, background=4.9),
    # mnist cnn-small, 20 clients, fraction 0.2, 3 rounds: 54 s at load 5.2-5.4
    Timing(reference=0.00562, outside=15.5, node=0.88, prepare=0.70, train_ratio=1.37, parallel=1.76,
           eval_ratio=1.18, flower=0.0, background=3.5),
    # fashion_mnist cnn-small, 10 clients, fraction 0.5, 4 rounds: 71 s at load 3.5-3.9
    Timing(reference=0.00550, outside=7.5, node=1.64, prepare=0.65, train_ratio=2.08, parallel=1.88,
           eval_ratio=2.72, flower=0.0, background=1.8),
)


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


def eval_examples(cfg: dict) -> float:
    """Examples the server evaluates each round: the test split, or the validation share of the
    training split when the run sets ``validation-fraction`` (a tuning search)."""
    if cfg["dataset"] == "synthetic":
        return SYNTHETIC_TEST
    train, test = split_sizes(cfg)
    fraction = float(cfg.get("validation-fraction") or 0.0)
    return train * fraction if fraction > 0 else test


def clients_per_round(cfg: dict, clients: int) -> int:
    return max(cfg["min-fit-clients"], math.ceil(clients * cfg["fraction-fit"]))


def slowdown(load: float, cores: int | None = None) -> float:
    """How many times its idle seconds a run's start-up, nodes and Flower's rounds take beside
    ``load`` busy threads on ``cores`` cores: ``1 + LOAD_SLOWDOWN * load / cores`` (a straight
    line through what the 2-core machine measured idle and beside 4 busy processes)."""
    cores = cores or os.cpu_count() or 1
    return 1.0 + LOAD_SLOWDOWN * max(0.0, load) / cores


def run_seconds(cfg: dict, clients: int, probe: Probe, timing: Timing, reference: float,
                step_cost: float = 1.0, load: float | None = None) -> float:
    """Estimated seconds of one run of ``cfg`` with one ``timing`` and the reference probe now
    (``reference``; 0: not scaled by it); see the module docstring for the formula.
    ``step_cost``: the method's ``LocalUpdate.step_cost`` (its local step against one SGD step).
    ``load``: the load now, when the timing is this machine's own: its start-up, nodes and
    Flower's parts are moved from the load it was recorded at to this one (``slowdown``); its
    local steps and evaluation follow the model's probe, measured now at this load."""
    s = reference / timing.reference if timing.reference > 0 and reference > 0 else 1.0
    if load is not None and timing.background >= 0:
        s *= slowdown(load) / slowdown(timing.background)
    m = clients_per_round(cfg, clients)
    train = local_steps(cfg, clients) * probe.step_seconds * step_cost * timing.train_ratio
    fit = m * (timing.prepare * s + train) / max(1.0, min(timing.parallel, m))
    evaluate = eval_examples(cfg) * probe.forward_seconds_per_example * timing.eval_ratio
    start = (timing.outside + clients * timing.node) * s
    return start + cfg["num-server-rounds"] * (fit + evaluate + timing.flower * s)


def measure(cfg: dict, steps: int = 30, budget: float = 0.4) -> Probe:
    """The median time of an SGD step of the configured model on random inputs of the configured
    batch size (after two warm-up steps; up to ``steps`` steps, stopping after ``budget`` seconds
    and 5 steps), and the median of 3 forward passes of 256 examples per example; one thread.
    Medians: on a loaded machine single steps swing by 2x (a 5-step mean moved estimates by a third
    from one call to the next)."""
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
        times: list[float] = []
        began = time.perf_counter()
        for i in range(steps + 2):
            started = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if i >= 2:  # two warm-up steps
                times.append(time.perf_counter() - started)
            if len(times) >= 5 and time.perf_counter() - began > budget:
                break
        forwards = []
        with torch.no_grad():
            xs = torch.randn(256, *_dims(shape))
            for _ in range(3):
                started = time.perf_counter()
                model(xs)
                forwards.append((time.perf_counter() - started) / 256)
    finally:
        torch.set_num_threads(threads)
    return Probe(statistics.median(times), statistics.median(forwards))


def reference_seconds(repeats: int = 9, pause: float = 0.03) -> float:
    """This machine's speed now: the median of ``repeats`` timings of a fixed workload (a small
    MLP's SGD steps on one thread and a loop of Python arithmetic, about 5 ms at load 3 on the
    2-core machine), ``pause`` seconds apart so that one burst of another process does not decide
    it; the start-up and Flower's parts of a run scale with it (a loaded machine makes it slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        x, y = torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)
        times = []
        for i in range(repeats + 1):
            started = time.perf_counter()
            for _ in range(10):
                model.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
            total = 0
            for k in range(30000):
                total += k * k % 7
            if i:  # the first is a warm-up
                times.append(time.perf_counter() - started)
                time.sleep(pause)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


def probed(key: tuple, probe: Callable[[], Any]) -> Any:
    """``probe()``, or its value from this process when it was taken under ``PROBE_TTL`` seconds
    ago: the first probe of a process costs seconds (torch's first steps), and a sweep estimates
    its search and its table a minute apart."""
    now = time.monotonic()
    if key in _probed and now - _probed[key][0] < PROBE_TTL:
        return _probed[key][1]
    value = probe()
    _probed[key] = (now, value)
    return value


def _dims(shape) -> tuple[int, ...]:
    return (shape.size,) if shape.channels == 0 else (shape.channels, shape.size, shape.size)


# ---- this machine's timings: recorded by the runner after every finished run ----------------

def timings_file() -> Path:
    """``$FL_DRIFT_TIMINGS``, else ``timings.jsonl`` in fl-drift's disk cache (``$FL_DRIFT_CACHE``,
    else ``~/.cache/fl-drift``, as ``tasks/partition_cache.py``; the tests keep it to themselves)."""
    if os.environ.get("FL_DRIFT_TIMINGS"):
        return Path(os.environ["FL_DRIFT_TIMINGS"]).expanduser()
    return Path(os.environ.get("FL_DRIFT_CACHE") or Path.home() / ".cache" / "fl-drift").expanduser() / "timings.jsonl"


def _here() -> dict:
    return {"host": socket.gethostname(), "cores": os.cpu_count() or 1}


def recent_timings(path: Path | None = None, now: float | None = None) -> list[Timing]:
    """The timings recorded on this host with this many cores in the last ``RECENT_DAYS``
    (the newest last); none when there is no timing file or it cannot be read."""
    path = path or timings_file()
    now = time.time() if now is None else now
    here, found = _here(), []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    names = {f.name for f in fields(Timing)}
    for line in lines:
        try:
            entry = json.loads(line)
            if (entry.get("host"), entry.get("cores")) != (here["host"], here["cores"]):
                continue
            if now - float(entry.get("time", 0)) > RECENT_DAYS * 86400:
                continue
            timing = Timing(**{k: float(entry[k]) for k in names if k != "background"},
                            background=float(_background_of(entry)))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
        values = asdict(timing)
        if all(math.isfinite(v) and (v >= 0 or k == "background") for k, v in values.items()) and timing.parallel > 0:
            found.append(timing)
    return found


def timing_of_run(run_dir: Path, wall: float, clients: int, before: tuple[float, Probe] | None = None) -> Timing | None:
    """The ``Timing`` of one finished run (its summary.json and metrics.csv) that the runner
    saw take ``wall`` seconds, against ``before``: the reference and the model's probe taken
    before the run started, as ``--check`` takes them (the sweep does); without them, probed now
    (right after a run, its processes' ends still load the machine: the reference then reads slow
    and the estimates made with it come out short). None when the run has no complete record of
    its rounds' seconds (an older run, a failed or stopped one)."""
    import csv

    from fl_app.registry import get_method

    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
        with open(Path(run_dir) / "metrics.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("round") not in (None, "", "0")]
        cfg = summary["config"]
        if summary.get("stopped") or not rows or summary.get("rounds") != len(rows):
            return None
        number = {k: [float(r[k]) for r in rows if r.get(k) not in (None, "")] for k in (
            "round_seconds", "fit_phase_seconds", "fit_seconds_mean", "num_clients", "prepare_seconds_mean",
            "train_seconds_mean", "evaluate_seconds", "aggregate_seconds")}
        step_cost = get_method(cfg["strategy"]).update.step_cost
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if any(len(v) != len(rows) for k, v in number.items() if k != "evaluate_seconds") or not estimable(cfg):
        return None
    reference, probe = before[:2] if before else (reference_seconds(), measure(cfg))
    mean = statistics.fmean
    total = float(summary["total_seconds"])
    busy = sum(f * n for f, n in zip(number["fit_seconds_mean"], number["num_clients"]))
    evaluated = mean(number["evaluate_seconds"]) if number["evaluate_seconds"] else 0.0
    expected_eval = eval_examples(cfg) * probe.forward_seconds_per_example
    rest = [r - f - a for r, f, a in zip(number["round_seconds"], number["fit_phase_seconds"],
                                         number["aggregate_seconds"])]
    return Timing(
        reference=reference,
        outside=max(0.0, wall - total),
        node=max(0.0, total - sum(number["round_seconds"])) / max(1, clients),
        prepare=mean(number["prepare_seconds_mean"]),
        train_ratio=mean(number["train_seconds_mean"]) / max(1e-9, local_steps(cfg, clients) * probe.step_seconds
                                                             * step_cost),
        parallel=max(1.0, busy / max(1e-9, sum(number["fit_phase_seconds"]))),
        eval_ratio=evaluated / expected_eval if expected_eval > 0 else 1.0,
        flower=max(0.0, mean(rest) - evaluated),
        background=before[2] if before and len(before) > 2 else -1.0)


def record_timing(run_dir: Path, wall: float, clients: int, path: Path | None = None,
                  before: tuple[float, Probe] | None = None) -> Timing | None:
    """Append the ``Timing`` of a finished run to this machine's timing file (keeping the latest
    ``KEPT_TIMINGS``); the timing, or None when the run gives none. A file that cannot be
    written is left as it is: a timing is a help for estimates, never a reason to fail a run."""
    timing = timing_of_run(run_dir, wall, clients, before)
    if timing is None:
        return None
    path = path or timings_file()
    entry = {"time": time.time(), **_here(), "run": Path(run_dir).name, **asdict(timing)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = path.read_text().splitlines() if path.exists() else []
        lines = (lines + [json.dumps(entry)])[-KEPT_TIMINGS:]
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass
    return timing


# ---- the estimate -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Estimate:
    """Estimated seconds of each estimated run (the middle value), of the sweep's own work
    (``sweep``) and of all of it (``seconds``, ``low`` to ``high``), the probes, how many timings
    of this machine it used (0: ``DEFAULT_TIMINGS``), and the runs not estimated (unknown data
    size)."""

    runs: list[float]
    low: float
    high: float
    probes: dict
    timings: int
    unsized: list[str]
    sweep: float = 0.0  # the sweep's own seconds (SWEEP_SECONDS, scaled to this machine now)
    own: bool = False  # made with this machine's timings (else the default ones: ``choose_timings``)

    @property
    def seconds(self) -> float:
        return self.sweep + sum(self.runs)


def runnable_threads() -> dict[int, tuple[int, int]]:
    """Every process now: pid -> (parent pid, its threads running or ready to run, state ``R``
    in ``/proc/<pid>/task/<tid>/stat``); a process that ends while it is read is left out."""
    out: dict[int, tuple[int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            running = 0
            for task in os.scandir(f"/proc/{entry.name}/task"):
                with open(f"/proc/{entry.name}/task/{task.name}/stat") as f:
                    running += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry.name)] = (parent, running)
    return out


def beside_tree(processes: dict[int, tuple[int, int]], root: int) -> int:
    """The runnable threads of ``processes`` (``runnable_threads``) outside the process tree of
    ``root`` (it and every descendant), and never the reading process itself."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    mine, todo = {root, os.getpid()}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in mine:
                mine.add(child)
                todo.append(child)
    return sum(running for pid, (_, running) in processes.items() if pid not in mine)


def load_now(samples: int = 10, interval: float = 0.05, root: int | None = None) -> float:
    """The threads running or ready to run now beside the process tree of ``root`` (default:
    this process): the mean of ``samples`` counts ``interval`` seconds apart (``beside_tree``).
    Beside the tree, not the whole machine's count: a sweep measures the load before each run
    with its own SuperLink, Ray and their polls alive (about 1 thread on the idle 2-core
    machine), ``--check`` with none of them, and both must read the user's other work only. Not
    the 1-minute load average either: a ``--check`` that has just drawn its splits for seconds
    raises that by 0.3-0.5 on an idle 2-core machine. The 1-minute load average where there is
    no /proc (not Linux)."""
    root = os.getpid() if root is None else root
    counts = []
    try:
        for _ in range(samples):
            time.sleep(interval)
            counts.append(beside_tree(runnable_threads(), root))
    except OSError:
        return os.getloadavg()[0]
    return statistics.fmean(counts) if counts else os.getloadavg()[0]


def _background_of(entry: dict) -> float:
    """A timing file entry's background load: recorded (``background``), else read from an
    older entry's 1-minute load average at the run's end less the clients that trained at once
    (``load`` - ``parallel``: a rough reading, as the run's other processes and the average's lag
    are in it), else -1."""
    if "background" in entry:
        return float(entry["background"])
    if "load" in entry:
        return max(0.0, float(entry["load"]) - float(entry["parallel"]))
    return -1.0


def closest_in_load(pool: list[Timing], load: float, keep: int = CLOSEST_TIMINGS) -> list[Timing]:
    """At most ``keep`` timings of ``pool`` whose background load was closest to ``load`` (the
    load now, before the runs start), the newest first among equals, and none more than
    ``LOAD_WINDOW`` farther than the closest; the whole pool when no timing recorded its load.
    Why: a run's start-up, its nodes and Flower's polls slow down with the processes beside it
    far more than the one-thread reference probe does (the node start-up took 0.17-0.20 s a node
    beside nothing, 2.6-2.9 s at load 5-9 on the same 2-core machine), so the median of timings
    taken at other loads missed by 2-3x (an idle sweep estimated at 14 min took 5.0)."""
    known = [t for t in reversed(pool) if t.background >= 0]
    if not known:
        return list(pool)
    distance = {id(t): abs(t.background - load) for t in known}
    nearest = min(distance.values())
    near = [t for t in known if distance[id(t)] <= nearest + LOAD_WINDOW]
    return sorted(near, key=lambda t: distance[id(t)])[:keep]


def choose_timings(own: list[Timing], load: float) -> tuple[list[Timing], bool]:
    """The timings an estimate at ``load`` uses, and whether they are this machine's: its own
    nearest the load (``closest_in_load``) unless the defaults' nearest is more than
    ``OWN_REACH`` nearer (a timing of this machine is worth that much load). Why: a
    machine that has only run idle has no timing of a loaded run, and its idle ones moved to load
    4 by the straight-line model missed by 2x (8.2 min estimated, 15 min taken), where the default
    timings measured beside 4 busy processes held (13 min, range 10 to 18)."""
    defaults = closest_in_load(list(DEFAULT_TIMINGS), load)
    if not own:
        return defaults, False
    near = closest_in_load(own, load)
    if any(t.background < 0 for t in near):
        return near, True
    mine, theirs = (min(abs(t.background - load) for t in pool) for pool in (near, defaults))
    return (near, True) if mine <= theirs + OWN_REACH else (defaults, False)


def estimate(configs: list[dict], clients: int, step_costs: list[float] | None = None,
             timings: list[Timing] | None = None, load: float | None = None) -> Estimate:
    """The estimate of ``configs`` (validated run configs), one probe per (dataset, model,
    batch); ``timings``: this machine's (default: ``recent_timings``), of which those nearest
    the load now (``load``, default ``load_now``) are used, or the default timings where they
    are nearer (``choose_timings``). Each run's middle value uses the median timing (per entry);
    the range is the least and most any one timing gives, widened by ``margin`` (more the farther
    the timings' load is from the load now). A run of unknown data size counts 0 and is listed in
    ``unsized``."""
    own = list(timings) if timings is not None else recent_timings()
    now = probed(("load",), load_now) if load is None else load
    pool, mine = choose_timings(own, now)
    middle = Timing(**{f.name: statistics.median(getattr(t, f.name) for t in pool) for f in fields(Timing)})
    costs = step_costs or [1.0] * len(configs)
    probes: dict[tuple, Probe] = {}
    reference = probed(("reference",), reference_seconds) if any(estimable(c) for c in configs) else 0.0
    sweep = SWEEP_SECONDS * reference / SWEEP_REFERENCE if reference > 0 else 0.0
    runs, lows, highs, unsized = [], sweep, sweep, []
    # this machine's own timings are moved to the load now by the load model (``slowdown``), not by the
    # reference, which a sweep takes as the previous run's processes end (0.0067-0.0078 s before the
    # runs of an idle sweep against 0.0050-0.0057 s from --check); the default timings, from another
    # machine, are scaled to this one's speed now by the reference (it slows with the load too)
    scale_to, at = (0.0, now) if mine else (reference, None)
    for cfg, cost in zip(configs, costs):
        if not estimable(cfg):
            runs.append(0.0)
            unsized.append(cfg["dataset"])
            continue
        key = (cfg["dataset"], cfg["model"], cfg["batch-size"])
        if key not in probes:
            probes[key] = probed(key, lambda cfg=cfg: measure(cfg))
        each = [run_seconds(cfg, clients, probes[key], t, scale_to, cost, load=at) for t in pool]
        runs.append(run_seconds(cfg, clients, probes[key], middle, scale_to, cost, load=at))
        lows += min(each)
        highs += max(each)
    recorded = [abs(t.background - now) for t in pool if t.background >= 0]
    widen = 1 + margin(now, far=min(recorded) if recorded else 0.0) + (0.0 if mine else OTHER_MACHINE_MARGIN)
    return Estimate(runs, lows / widen, highs * widen, probes, len(own), unsized, sweep, mine)


def margin(load: float | None = None, cores: int | None = None, far: float = 0.0) -> float:
    """How much wider than the timings' spread the range is (a factor ``1 + margin`` either way):
    ``MARGIN`` idle, ``LOAD_MARGIN`` more per load of the cores beyond them (at most
    ``MAX_MARGIN``), and ``FAR_MARGIN`` more per core's worth of load between the load now and
    the nearest timing's (``far``; at most ``MAX_FAR_MARGIN`` in all): a timing from another
    load is moved by a model, not measured."""
    load = load_now() if load is None else load
    cores = cores or os.cpu_count() or 1
    base = min(MAX_MARGIN, MARGIN + LOAD_MARGIN * max(0.0, load / cores - 1))
    return min(MAX_FAR_MARGIN, base + FAR_MARGIN * far / cores) if far > 0 else base


def minutes(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``12 min``, ``2.1 h``: a duration as a person reads it."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def describe(configs: list[dict], clients: int, kept: int = 0, step_costs: list[float] | None = None,
             paths: list[str] | None = None, timings: list[Timing] | None = None) -> str:
    """The estimate for a list of validated run configs in one line (``estimate``): the middle
    value and the range; ``kept``: runs that already finished and cost nothing (named, not
    counted); ``step_costs``: each config's method's ``LocalUpdate.step_cost`` (default 1 each);
    ``paths``: each run's execution path (``fl_app/common/execution_path.py``). The arithmetic is
    the per-client path's: a cohort run's speed depends on the device (faster on a GPU; 0.45-0.83x
    the per-client loop on a CPU, ``bench/cohort.py``), so for cohort runs the line says it is the
    per-client estimate. Runs whose data size is unknown (``split_sizes``) are named, not estimated."""
    kept_text = f" ({kept} finished runs kept)" if kept else ""
    if not configs:
        return f"estimated run time on this machine: nothing left to run{kept_text}"
    est = estimate(configs, clients, step_costs, timings)
    n = len(configs) - len(est.unsized)
    unsized = sorted(set(est.unsized))
    unsized_text = (f"; {len(est.unsized)} runs on {', '.join(unsized)} not estimated: its size is read"
                    " from a local data folder (--data-dir), and the hub's is not known here") if unsized else ""
    if not n:
        return f"estimated run time on this machine: unknown{kept_text}{unsized_text}"
    measured = "; ".join(f"{m} on {d}, batch {b}: {p.step_seconds * 1000:.1f} ms/step"
                         for (d, m, b), p in est.probes.items())
    cohort = sum(p == "cohort" for p in paths or [])
    cohort_text = (f"; {cohort} of them on the cohort path, estimated as per-client runs: faster on a GPU, slower on"
                   " a CPU (bench/cohort.py)") if cohort else ""
    source = (f"the timings of the {min(CLOSEST_TIMINGS, est.timings)} of {est.timings} runs recorded on this machine"
              f" nearest this load ({timings_file()})" if est.own else
              "the default timings of a 2-core CPU machine nearest this load (this one has recorded "
              + (f"{est.timings} runs, none as near this load)" if est.timings else "no run yet)"))
    load = probed(("load",), load_now)
    return (f"estimated run time on this machine: {minutes(est.seconds)} (range {minutes(est.low)} to "
            f"{minutes(est.high)}) for {n} runs{kept_text}, at load {load:.1f} on {os.cpu_count()} cores "
            f"(probed now: {measured}; start-up, nodes and Flower's rounds from {source}{cohort_text}"
            f"{unsized_text})")
