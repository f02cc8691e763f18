#!/usr/bin/env python
"""Compare methods on the same split, model and budget with Flower's simulation (`flwr run`).

Example:
    FL_DATA_DIR=/path/to/data python run_simulation.py --strategy fedavg,fedprox \\
        --dataset mnist --rounds 3 --clients 20 --fraction 0.25 --seeds 0 1

Every (strategy, seed) is one `flwr run` on a private local SuperLink (started here, stopped
at exit). Results: <out>/runs/<label>-seed<seed>/{metrics.csv,summary.json}, and in <out>:
comparison.csv, comparison.md, accuracy.png (accuracy and loss; and roughness.png when ri-fedavg ran).

`--config FILE` reads an experiment file (TOML, see experiments/): its `strategies`, `seeds`,
`clients`, `[run-config]` (keys for every run), `[methods.<label>]` (keys for one row; with
`strategy = "<method>"` a label is a variant, so one method can be listed twice with different
settings) and `[grid]` / `[methods.<label>.grid]` (KEY = [values]: one row per value, labelled
`<label>[KEY=value]`). Flags given on the command line (`--set` included) override the file.
Output defaults to results/experiments/<name>.

`--grid KEY=V1,V2` (repeatable) runs every method once per value (the product over several
`--grid` keys), each a labelled row in comparison.md/.csv and the plots.

An experiment file's `[tune]` table (the tuning protocol, docs/experiments.md; `--tune` asks for
it explicitly, `--no-tune` skips it) first searches each row's grid on a validation split held out
of the training data, in <out>/tuning, writes the choice and every point's numbers to
<out>/tuning.json, then runs the table with the chosen values (runner/tuning.py).

`--list [methods|models|datasets|keys]` prints what can be chosen; `--check` validates every
run (config, data, federation size) and exits without launching anything.
An output folder's finished runs are never re-run: re-running the same command continues.

`--resume DIR` continues an interrupted comparison in DIR with the arguments it was started
with (saved in DIR/runner.json): finished runs are kept, unfinished ones continue from their
last checkpoint (run-config `resume = true`), missing ones start.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path


def missing_data_dir(argv: list[str]) -> tuple[str, str] | None:
    """(folder, dataset) when an explicit ``--data-dir`` / ``--set data-dir=`` folder does not
    exist, else None. Checked before torch and Flower are imported (seconds on a small machine),
    so this typo fails at once; every other check runs after the imports, in ``main``."""
    given: dict[str, str] = {}
    for i, arg in enumerate(argv):
        for key in ("data-dir", "dataset"):
            if arg == f"--{key}" and i + 1 < len(argv):
                given[key] = argv[i + 1]
            elif arg.startswith(f"--{key}="):
                given[key] = arg.split("=", 1)[1]
            elif arg == "--set" and i + 1 < len(argv) and argv[i + 1].replace(" ", "").startswith(f"{key}="):
                given[key] = argv[i + 1].split("=", 1)[1].strip().strip("'\"")
    folder, dataset = given.get("data-dir"), given.get("dataset", "<dataset>")
    if not folder or dataset == "synthetic" or {"--resume", "--list", "--config"} & set(argv):
        return None
    return None if Path(folder).expanduser().is_dir() else (folder, dataset)


if __name__ == "__main__" and missing_data_dir(sys.argv[1:]):
    from tasks.catalogue import DATASETS  # plain data: no torch

    bad, dataset = missing_data_dir(sys.argv[1:])
    hub = f" {DATASETS[dataset].hub_id}" if dataset in DATASETS else ""
    print(f"error: run-config key 'data-dir' = {bad!r} is invalid: no such folder ({Path(bad).expanduser().resolve()});"
          f" it must hold {dataset}/train.parquet and {dataset}/test.parquet (leave it out to use $FL_DATA_DIR"
          f" or the Hugging Face hub id{hub})", file=sys.stderr)
    sys.exit(2)


from fl_app.config import ConfigError
from fl_app.registry import DEFAULT_METHOD, method_names, parse_override, resolve, validate_config
from fl_app.registry import spec as config_keys
from fl_app.server.checkpoint import CHECKPOINT, load_checkpoint
from fl_app.server.preflight import check_data_dir, check_nodes
from fl_app.server.provenance import with_app_digest
from runner.experiment import read_experiment
from runner.launch import APP_DIR, LocalSimulation, execution_for
from runner.parallel import Failed, Machine, Pool, check_workers, default_workers, say, split
from runner.plan import (
    check_axes,
    check_command_line_keys,
    grid_points,
    label,
    parse_grid,
    resolve_rows,
    run_name,
)
from runner.processes import FolderInUse, MissingTool, lock_folder
from runner.quiet import for_output, is_noise, is_progress, plain, quiet_libraries
from runner.results.report import (
    compare,
    plot,
    plot_curves,
    plot_drift,
    read_summary,
    terminal_summary,
    write_comparison,
)
from runner.snapshot import snapshot_app
from runner.tuning import (
    SEARCH_FOLDER,
    SearchPlan,
    apply_choice,
    plan_search,
    read_tuning,
    tuning_record,
    write_tuning,
)
from strategies.base import build_strategy
from tasks.datasets import DataUnavailableError, PartitionError, resolve_data_dir
from tasks.partitioning import PartitionSpec, check_data


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from fl_app.config import DATASETS, GENERAL_KEYS, MODELS

    d = {k: GENERAL_KEYS[k].default for k in GENERAL_KEYS}
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"methods: {', '.join(method_names())}\nmodels: {', '.join(MODELS)}\n"
                                       f"datasets: {', '.join(DATASETS)}\nevery key with its default and range:"
                                       " run_simulation.py --list keys")
    p.add_argument("--config",
                   help="experiment file (TOML): strategies, seeds, clients, run-config, per-method keys, grid")
    p.add_argument("--strategy", help=f"method name or comma list (--list methods) (default: {DEFAULT_METHOD})")
    p.add_argument("--dataset", help=f"{', '.join(DATASETS)} (default: {d['dataset']})")
    p.add_argument("--rounds", type=int, help=f"num-server-rounds (default: {d['num-server-rounds']})")
    p.add_argument("--clients", type=int, help="number of simulated SuperNodes (partitions) (default: 10)")
    p.add_argument("--fraction", type=float,
                   help=f"fraction-fit: share of clients sampled per round (default: {d['fraction-fit']})")
    p.add_argument("--alpha", type=float, help=f"Dirichlet concentration (default: {d['alpha']})")
    p.add_argument("--seeds", type=int, nargs="+", help="one or more seeds (default: 0)")
    p.add_argument("--data-dir",
                   help="folder with <dataset>/{train,test}.parquet (default: $FL_DATA_DIR, else the hub)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="any run-config key (repeatable; --list keys); wins over the experiment file")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="one labelled row per value, e.g. learning-rate=0.01,0.05 (repeatable: the product)")
    p.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                   help="run the experiment file's [tune] search first and the table with its choice (the default"
                        " when the file has a [tune] table); --no-tune runs the file's values, untuned")
    p.add_argument("--out", help="output folder (default: results/compare-<time>)")
    p.add_argument("--cpus-per-client", type=float, default=1.0, help="Ray CPUs per simulated client (default: 1)")
    p.add_argument("--gpus-per-client", type=float, default=None,
                   help="Ray GPUs per client (default: 0, or 1/clients-in-parallel when CUDA is present)")
    p.add_argument("--ray-address", help="run on this running Ray cluster (head host:port; README: 'On a Ray"
                   " cluster') instead of a private Ray on this machine")
    p.add_argument("--parallel", type=int, metavar="N",
                   help="runs at a time, each on its own private SuperLink and Ray with 1/N of the machine (default:"
                        " as many as the cores, GPUs and memory hold, 1 on a machine under 8 cores; docs/running.md)")
    p.add_argument("--quiet", action="store_true", help="print only the per-round progress lines")
    p.add_argument("--verbose", action="store_true",
                   help="also print Flower's, Ray's and MLflow's own log lines and the libraries' deprecation warnings")
    p.add_argument("--resume", metavar="DIR", help="continue the interrupted comparison in DIR")
    p.add_argument("--list", nargs="?", const="all", choices=("all", "methods", "models", "datasets", "keys"),
                   help="print methods (one line each), models, datasets, run-config keys (default, range); exit")
    p.add_argument("--check", action="store_true", help="validate every run (config, data, nodes) and exit")
    args = p.parse_args(argv)
    if args.list:
        return args
    if args.resume:
        args = argparse.Namespace(**{"grid": [], "verbose": False, "list": None, "tune": None, "parallel": None,
                                     "env_data_dir": None, "cwd": None, **read_runner_record(args.resume, p),
                                     "resume": args.resume, "out": args.resume, "quiet": args.quiet,
                                     "check": args.check,
                                     **({"parallel": args.parallel} if args.parallel is not None else {})})
    else:
        args.env_data_dir = resolve_data_dir("")  # recorded in runner.json: a new shell may differ
        args.cwd = os.getcwd()  # relative data-dir values resolve against it, on --resume too
    return resolve_experiment(args, p)


RECORD_TYPES = {"strategy": str, "seeds": list, "clients": int, "overrides": list}  # what a resume needs


def read_runner_record(folder: str, parser: argparse.ArgumentParser) -> dict:
    """``<folder>/runner.json`` as saved by ``runner_record``; a missing, unreadable or altered
    one is a one-line parser error naming the file."""
    saved = Path(folder) / "runner.json"
    if not saved.exists():
        parser.error(f"--resume {folder}: no runner.json there (not a run_simulation.py output folder)")
    try:
        record = json.loads(saved.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        parser.error(f"--resume {folder}: {saved} is not readable JSON ({exc}); it is written by"
                     " run_simulation.py: start the comparison again with its command and --out")
    for key, kind in RECORD_TYPES.items():
        if not isinstance(record, dict) or not isinstance(record.get(key), kind):
            parser.error(f"--resume {folder}: {saved} has no {kind.__name__} {key!r} (corrupt or not written by"
                         " run_simulation.py): start the comparison again with its command and --out")
    return record


def resolve_experiment(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill strategy/seeds/clients from --config (flags win) and the plain defaults."""
    args.experiment = {}
    if getattr(args, "config", None):
        path = Path(args.config)
        if not path.is_file():
            parser.error(f"--config {args.config}: no such file")
        try:
            exp = read_experiment(path)
        except ConfigError as exc:
            parser.error(f"--config: {exc}")
        args.experiment = exp
        args.strategy = args.strategy or ",".join(exp.get("strategies", []))
        args.seeds = args.seeds or exp.get("seeds")
        args.clients = exp.get("clients") if args.clients is None else args.clients
        args.out = args.out or f"results/experiments/{exp.get('name', path.stem)}"
    if args.strategy is not None and not [s for s in args.strategy.split(",") if s.strip()]:
        parser.error(f"--strategy {args.strategy!r} names no method; give one or a comma list (--list methods)")
    args.strategy = args.strategy or config_keys()["strategy"].default
    args.seeds = args.seeds or [0]
    args.clients = 10 if args.clients is None else args.clients  # --clients 0 is refused, not replaced
    return args


def check_method(raw: dict) -> dict:
    """The ServerApp's own checks of the method (``fl_app.registry.resolve``) and its
    strategy built once, as the ServerApp will: method-specific refusals (a BN model for FedBN,
    enough Linear layers for FedPGVC, an optimiser SCAFFOLD cannot use, a screening mode the
    method does not allow, ...) then fail here, before any launch. The validated config."""
    cfg, method = resolve(raw)
    build_strategy(method.strategy, cfg)
    return cfg


def build_configs(args: argparse.Namespace, runs_dir: Path) -> list[tuple[str, int, dict]]:
    """Validate every (label, seed) config up front; raises ConfigError before any launch.

    Precedence (later wins; see runner/plan.py): the file's [run-config], its
    [methods.<label>] keys, its grids, the command line (flags and --set), --grid."""
    experiment = getattr(args, "experiment", {}) or {}
    base: dict = dict(experiment.get("run-config", {}))
    per_method: dict = experiment.get("methods", {})
    command_line: dict = {}
    for flag, key in (("dataset", "dataset"), ("rounds", "num-server-rounds"),
                      ("fraction", "fraction-fit"), ("alpha", "alpha"), ("data_dir", "data-dir")):
        if getattr(args, flag) is not None:
            command_line[key] = getattr(args, flag)
    for text in args.overrides:
        key, value = parse_override(text)
        command_line[key] = value
    check_command_line_keys(command_line, "--set")
    cli_grid = parse_grid(getattr(args, "grid", []) or [])
    both = sorted(set(cli_grid) & set(command_line))
    if both:
        raise ConfigError(f"{both} given both by --set/flags and by --grid; give each key one way")
    file_grid = check_axes(experiment.get("grid", {}), "[grid]")
    if args.clients < 1:
        raise ConfigError(f"--clients = {args.clients} is invalid: must be >= 1")
    base.setdefault("min-available-clients", args.clients)
    if "target-accuracy" in experiment:  # the file's target: comparison.md's rounds to it, as docs/results.md
        base.setdefault("target-accuracy", experiment["target-accuracy"])
    listed = command_line.pop("strategy", base.pop("strategy", args.strategy))
    names = [s.strip() for s in listed.split(",") if s.strip()]
    configs = []
    for name, strategy, keys, method_grid in resolve_rows(names, per_method, method_names()):
        axes = {k: v for k, v in {**file_grid, **method_grid}.items() if k not in command_line}
        axes.update(cli_grid)
        for point in grid_points(axes):
            row = label(name, point)
            for seed in args.seeds:
                raw = {**base, **keys, **command_line, **point, "strategy": strategy, "seed": seed,
                       "results-dir": str(runs_dir), "run-name": run_name(row, seed)}
                given = str(raw.get("data-dir", ""))
                given = str(Path(args.cwd or ".", given)) if given and args.cwd else given
                raw["data-dir"] = resolve_data_dir(given, args.env_data_dir)
                raw, _ = execution_for(raw, args.clients, cluster=bool(getattr(args, "ray_address", None)))
                cfg = check_method(raw)
                check_data_dir(cfg)
                check_nodes(cfg, args.clients)
                configs.append((row, seed, raw))
    return configs


# by design: continuation flag; the folder may move; the target only reads the accuracies afterwards
IGNORED_ON_RERUN = {"resume", "results-dir", "target-accuracy"}


def as_read_now(recorded: dict) -> dict:
    """A run's recorded config as this code reads it: a key added since the run was made takes
    its default (a new key's default is the behaviour before it existed), so asking for another
    value of it is a change too; keys removed since are kept as recorded. A recorded config
    this code refuses is compared as it stands."""
    keys = config_keys()
    try:
        return {**recorded, **validate_config({k: v for k, v in recorded.items() if k in keys})}
    except ConfigError:
        return recorded


def changed_runs(configs: list[tuple[str, int, dict]], runs_dir: Path, env_data_dir: str | None = None,
                 clients: int | None = None) -> list[str]:
    """Runs in ``runs_dir`` (finished, or started and checkpointed) whose recorded config
    differs from what is asked now, or whose recorded data fingerprint differs from the data
    asked for now (``changed_data``: same folder, other files): keeping or continuing them would
    mix two experiments."""
    problems = []
    for _, _, raw in configs:
        run_dir = runs_dir / raw["run-name"]
        summary = read_summary(run_dir)
        started = run_dir / "run-config.json"
        recorded = summary["config"] if summary else json.loads(started.read_text()) if started.exists() else None
        if recorded is None:
            continue
        wanted = validate_config(raw)
        recorded = {**as_read_now(recorded), "data-dir": resolve_data_dir(recorded.get("data-dir", ""), env_data_dir)}
        diff = [f"{k} {recorded[k]!r} -> {wanted[k]!r}" for k in wanted
                if k in recorded and k not in IGNORED_ON_RERUN and recorded[k] != wanted[k]]
        if diff:
            problems.append(f"{run_dir} was run with a different config ({'; '.join(diff)})")
        elif (data := changed_data(run_dir, wanted, clients)) is not None:
            problems.append(data)
    return problems


def changed_data(run_dir: Path, wanted: dict, clients: int | None) -> str | None:
    """One line when ``run_dir`` recorded a data fingerprint (fl_app/server/provenance.py) that
    the data asked for now does not have; None when it matches or the run recorded none (made
    before fingerprints were recorded: not guessed). The fingerprint is computed only then."""
    from fl_app.server.provenance import data_fingerprint
    from runner.results.fingerprint import data_change, recorded_fingerprint

    recorded = recorded_fingerprint(run_dir)
    if recorded is None:
        return None
    now = data_fingerprint(wanted, clients or (recorded.get("partition") or {}).get("num-partitions"))
    return data_change(str(run_dir), recorded, now)


def check_resources(args: argparse.Namespace) -> None:
    """GPUs asked for must exist: on a machine whose torch sees no CUDA GPU, Ray would wait for
    a GPU that never comes and the run fail after its start-up, in pages of tracebacks. (With
    --ray-address the GPUs are the cluster's, so they are not checked here.)"""
    gpus = args.gpus_per_client
    if gpus is not None and gpus < 0:
        raise ConfigError(f"--gpus-per-client = {gpus:g} is invalid: must be >= 0")
    if gpus and not getattr(args, "ray_address", None):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"--gpus-per-client = {gpus:g} is invalid: torch sees no CUDA GPU on this machine"
                              " (check CUDA_VISIBLE_DEVICES and the torch build); use --gpus-per-client 0")


def check_checkpoints(configs: list[tuple[str, int, dict]], runs_dir: Path) -> None:
    """Every unfinished run's checkpoint that a re-run would continue from is checked now
    (readable, its SHA-256, written for this model): ``CheckpointError`` before any launch."""
    from tasks.datasets import input_shape
    from tasks.models import build_model, get_weights

    for _, _, raw in configs:
        run_dir = runs_dir / raw["run-name"]
        if read_summary(run_dir) is None and (run_dir / CHECKPOINT).exists():
            cfg = validate_config(raw)
            shapes = [w.shape for w in get_weights(build_model(cfg["model"], input_shape(cfg["dataset"])))]
            load_checkpoint(run_dir, cfg["model"], shapes)


def runner_record(args: argparse.Namespace) -> dict:
    """The arguments saved in runner.json for --resume, with what a new shell would resolve
    differently made explicit: ``--data-dir`` and the experiment file by absolute path, and the
    ``$FL_DATA_DIR`` of this shell as ``env_data_dir``, and the working directory (``cwd``) that
    an experiment file's relative ``data-dir`` was meant from. The two data sources are kept apart, so
    a resume replays the same precedence (an experiment file's ``data-dir`` still beats
    ``$FL_DATA_DIR``) and therefore the same configuration."""
    saved = {k: v for k, v in vars(args).items() if k not in ("resume", "experiment", "list", "check")}
    saved["data_dir"] = resolve_data_dir(args.data_dir) if args.data_dir else None
    saved["env_data_dir"] = args.env_data_dir
    saved["cwd"] = args.cwd
    if saved.get("config"):
        saved["config"] = str(Path(saved["config"]).resolve())
    return saved


@dataclass
class Outcome:
    """What the launch step hands the report step: the kept runs per row, and the names of
    the runs that failed (no summary) or stopped before their last round."""

    runs: dict[str, list[Path]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)


def validate(args: argparse.Namespace, runs_dir: Path) -> list[tuple[str, int, dict]]:
    """Step 2: every check that can fail before anything is launched or written (resources,
    configs, data, checkpoints, runs made with another config); raises the first problem."""
    check_resources(args)
    check_workers(getattr(args, "parallel", None))
    configs = build_configs(args, runs_dir)
    for spec in {PartitionSpec.from_config(validate_config(c), args.clients) for _, _, c in configs}:
        check_data(spec)
    check_checkpoints(configs, runs_dir)
    changed = changed_runs(configs, runs_dir, args.env_data_dir, args.clients)
    if changed:
        raise ConfigError("finished or started runs would be kept or continued although config or data changed:\n  "
                          + "\n  ".join(changed) + "\nrun the changed config with another --out"
                          " (the runs there are kept as they are)")
    return configs


def rounds_left(cfg: dict, run_dir: Path) -> int:
    """Rounds a launch would still train for this run: 0 once it has finished (it is kept),
    the rounds after its checkpoint when it continues from one, else all of them."""
    if read_summary(run_dir) is not None:
        return 0
    ckpt = load_checkpoint(run_dir)
    return cfg["num-server-rounds"] - (ckpt.round if ckpt else 0)


def print_check(configs: list[tuple[str, int, dict]], runs_dir: Path, clients: int) -> None:
    """`--check`'s report: one line per run saying whether a launch would run it, continue it
    or keep it, and on which execution path; each path's reason once; the estimated time of
    what is left (finished runs cost nothing; a continued run costs its start and its
    remaining rounds)."""
    from runner.estimate import describe

    left, step_costs, paths, reasons = [], [], [], {}
    for row, seed, raw in configs:
        (cfg, method), run_dir = resolve(raw), runs_dir / raw["run-name"]
        asked = {k: v for k, v in raw.items() if k != "num-virtual-clients"}  # that key is the runner's own
        _, execution = execution_for(asked, clients)  # the path the run takes, and why
        rounds = rounds_left(cfg, run_dir)
        status = ("finished, kept" if rounds == 0 else
                  f"continues after round {cfg['num-server-rounds'] - rounds}" if rounds < cfg["num-server-rounds"]
                  else "to run")
        print(f"ok: {row} seed {seed} -> {run_dir} ({status}; {execution.path})")
        reasons[execution.path, execution.reason] = reasons.get((execution.path, execution.reason), 0) + 1
        if rounds:
            left.append({**cfg, "num-server-rounds": rounds})
            step_costs.append(method.client.STEP_COST)
            paths.append(execution.path)
    for (path, reason), runs in reasons.items():  # each reason once, however many runs it explains
        print(f"{path} ({runs} of {len(configs)} runs): {reason}")
    print(describe(left, clients, kept=len(configs) - len(left), step_costs=step_costs, paths=paths))


def plan(args: argparse.Namespace, out: Path) -> float:
    """Step 3: record the arguments for --resume and the code revision; the GPUs per client
    (default: 0, or a share of the GPU when CUDA is present)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "runner.json").write_text(json.dumps(runner_record(args), indent=1))
    from fl_app.server.provenance import code_revision

    os.environ.setdefault("FL_DRIFT_REVISION", code_revision())  # the installed app has no .git
    if args.gpus_per_client is not None:
        return args.gpus_per_client
    import torch

    return min(1.0, args.cpus_per_client / 2) if torch.cuda.is_available() else 0.0


def snapshot(out: Path) -> Path:
    """Step 3b: the app every run of this sweep ships, frozen now (``runner/snapshot.py``), so an
    edit of the checkout during the sweep reaches none of its runs; a ``+dirty`` revision gets the
    package's digest (``with_app_digest``), so runs of two different uncommitted states never
    record one revision. A one-line ``ConfigError`` when Flower cannot package it."""
    try:
        app, digest = snapshot_app(APP_DIR, out)
    except ValueError as exc:
        raise ConfigError(f"the app in {APP_DIR} cannot be packaged for a run: {exc}") from None
    revision = with_app_digest(os.environ.get("FL_DRIFT_REVISION", "unknown"), digest)
    os.environ["FL_DRIFT_REVISION"] = revision  # what every run of the sweep records
    say(f"app: every run ships {app} (packaged now, sha256 {digest[:12]}; revision {revision})")
    return app


def progress_printer(args: argparse.Namespace, tail: list[str], lead: str = "    "):
    """The callback for one run's output lines: keeps the last 40 in ``tail``, prints what
    --quiet / --verbose ask for, each line after ``lead`` (the run's tag when runs go in parallel)."""
    def on_line(line: str) -> None:
        tail.append(line)
        del tail[:-40]
        if args.quiet:
            show = is_progress(line)
        else:
            show = args.verbose or not is_noise(line)
        if show:
            say(lead + for_output(line))

    return on_line


def launch(args: argparse.Namespace, configs: list[tuple[str, int, dict]], runs_dir: Path, gpus: float,
           lock: int | None = None, app: Path = APP_DIR) -> Outcome:
    """Step 4: one `flwr run` per (row, seed) on a private SuperLink, ``--parallel`` runs at a
    time (runner/parallel.py: a SuperLink, Ray and watchdog per worker, each with its
    share of the machine); finished runs are kept, checkpointed ones continue. Every worker's
    watchdog also holds the folder ``lock``, so after a ``kill -9`` of this runner the folder
    stays taken until all their processes are gone. The outcome lists the runs in the sweep's
    order however many ran at once, so the comparison is written the same way. ``app``: the folder
    every run ships (the sweep's snapshot, ``runner/snapshot.py``; the checkout by default)."""
    parts: list[Outcome] = []  # one per config, merged in order
    jobs: list[tuple[int, str, int, dict]] = []
    for i, (row, seed, cfg) in enumerate(configs, 1):
        parts.append(Outcome())
        run_dir = runs_dir / cfg["run-name"]
        earlier = read_summary(run_dir)
        if earlier is None:
            jobs.append((i, row, seed, cfg))
            continue
        how = f"stopped earlier ({earlier['stopped']})" if earlier.get("stopped") else "finished earlier"
        if trained_nothing(earlier):
            how = f"failed earlier: {trained_nothing(earlier)}"
            parts[-1].failed.append(cfg["run-name"])
        elif earlier.get("stopped"):
            parts[-1].stopped.append(cfg["run-name"])
        say(f"[{i}/{len(configs)}] {row} seed {seed}: {how}, kept")
        parts[-1].runs.setdefault(row, []).append(run_dir)
    if jobs:
        run_all(args, jobs, len(configs), runs_dir, gpus, lock, parts, app)
    outcome = Outcome()
    for part in parts:
        for row, run_dirs in part.runs.items():
            outcome.runs.setdefault(row, []).extend(run_dirs)
        outcome.failed += part.failed
        outcome.stopped += part.stopped
    return outcome


def run_all(args: argparse.Namespace, jobs: list[tuple[int, str, int, dict]], total: int, runs_dir: Path,
            gpus: float, lock: int | None, parts: list[Outcome], app: Path = APP_DIR) -> None:
    """The runs still to launch (``jobs``: index in the sweep, row, seed, config), each filed
    in ``parts[index - 1]``; on ``--parallel`` workers (default: ``default_workers``)."""
    cluster = getattr(args, "ray_address", None)
    machine = Machine.here()
    n = min(len(jobs), getattr(args, "parallel", None)
            or default_workers(machine, len(jobs), args.cpus_per_client, gpus, cluster=bool(cluster)))
    shares = split(n, machine, args.cpus_per_client, gpus, cluster=bool(cluster),
                   visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    if n > 1:
        say(f"running {len(jobs)} runs {n} at a time (--parallel {n}), each on its own SuperLink and Ray with "
            + "; ".join(sorted({share.describe() for share in shares})))

    def start(share) -> tuple[LocalSimulation, float]:
        sim = LocalSimulation(app_dir=app, ray_address=cluster, hold=(lock,) if lock else ())
        sim.ray_resources = {k: v for k, v in (("num-cpus", share.ray_cpus), ("num-gpus", share.ray_gpus))
                             if v is not None}
        if share.cuda_devices is not None:
            sim.env["CUDA_VISIBLE_DEVICES"] = share.cuda_devices
        sim.start()
        return sim, share.gpus_per_client

    def work(worker: tuple[LocalSimulation, float], job: tuple[int, str, int, dict]) -> None:
        (sim, gpus_per_client), (i, row, seed, cfg) = worker, job
        run_dir, lead = runs_dir / cfg["run-name"], "    " if n == 1 else f"  [{i}/{total}] "
        if (run_dir / CHECKPOINT).exists():
            cfg = {**cfg, "resume": True}
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run-config.json").write_text(json.dumps(validate_config(cfg), indent=1))
        say(f"[{i}/{total}] {row} seed {seed} -> {run_dir}" + (" (resuming)" if cfg.get("resume") else ""))
        tail: list[str] = []
        sim.run(cfg, num_supernodes=args.clients, cpus_per_client=args.cpus_per_client,
                gpus_per_client=gpus_per_client, on_line=progress_printer(args, tail, lead))
        if not pool.stopping.is_set():  # stopped by Ctrl-C: not a result, nothing to report
            record_run(row, cfg["run-name"], run_dir, tail, parts[i - 1], lead)

    pool = Pool(jobs, shares, start=start, stop=lambda worker: worker[0].close(), work=work)
    for (i, _, _, cfg), result in zip(jobs, pool.results()):
        if isinstance(result, Failed):  # the runner's own error in one run (the others went on)
            parts[i - 1].failed.append(cfg["run-name"])
            say(f"  [{i}/{total}] run failed in the runner: "
                + "".join(traceback.format_exception(result.error)).rstrip(), sys.stderr)


def record_run(row: str, name: str, run_dir: Path, tail: list[str], outcome: Outcome, lead: str = "    ") -> None:
    """After one run: print its result (or why it failed), each line after ``lead``, and file
    it in ``outcome``."""
    summary = read_summary(run_dir)
    if summary is None:
        outcome.failed.append(name)
        causes = [plain(t).split("fl-drift:", 1)[1].strip() for t in tail if "fl-drift:" in t]
        say(lead + "run failed" + (f": {causes[0]}" if causes else "") + "; last lines:\n"
            + "\n".join(lead + for_output(t, sys.stderr) for t in tail[-15:]), sys.stderr)
        return
    if trained_nothing(summary):  # kept: the comparison shows it as "no result"
        outcome.failed.append(name)
        say(f"{lead}run failed: {trained_nothing(summary)}", sys.stderr)
    elif summary.get("rounds_without_update"):
        say(f"{lead}warning: no client update was used in rounds {summary['rounds_without_update']}", sys.stderr)
    if summary.get("stopped") and not trained_nothing(summary):
        outcome.stopped.append(name)
        say(f"{lead}stopped after {summary['rounds']} rounds: {summary['stopped']}")
    say(f"{lead}final accuracy {_fmt(summary['final_accuracy'])}, best {_fmt(summary['best_accuracy'])},"
        f" {summary['total_seconds']:.0f}s")
    outcome.runs.setdefault(row, []).append(run_dir)


def trained_nothing(summary: dict) -> str:
    """Why a run that wrote a summary is still a failure ('' when it is a result): it stopped
    before any round (every sampled client failed or was rejected in round 1), or no client
    update was used in any round (``untrained``: its accuracies are the initial model's)."""
    if summary.get("rounds") == 0:
        return f"no round completed ({summary.get('stopped') or 'stopped before round 1'})"
    if summary.get("untrained"):
        return (f"no client update was used in any of its {summary['rounds']} rounds (every sampled client failed"
                " or was rejected): the model was never trained, not a result")
    return ""


def report(outcome: Outcome, out: Path) -> int:
    """Step 5: comparison.csv/.md and the plots; the exit code (1 when a run failed)."""
    table = compare(outcome.runs)
    write_comparison(table, out)
    plot_curves(outcome.runs, out / "accuracy.png")
    plot(outcome.runs, "ri_mean", "roughness index (mean over clients)", out / "roughness.png")
    plot_drift(outcome.runs, out / "drift.png")
    print(terminal_summary(table, out))
    print(f"results in {out}")
    if outcome.stopped:  # a result (e.g. a method diverging), kept and reported, but worth a look
        print(f"note: {len(outcome.stopped)} run(s) stopped before their last round (see 'stopped' in their "
              f"summary.json; to redo one, run again with another --out): {', '.join(outcome.stopped)}",
              file=sys.stderr)
    if outcome.failed:
        print(f"error: {len(outcome.failed)} run(s) failed: {', '.join(outcome.failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """parse -> validate -> plan -> launch -> report. Exit codes: 0 done, 1 a run failed,
    2 refused before anything was launched."""
    # SIGTERM (a job scheduler, `timeout`) unwinds like Ctrl-C, so the private SuperLink and
    # everything it started are stopped; finished runs and checkpoints stay for --resume.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    args = parse_args(argv)
    quiet_libraries(args.verbose)  # runner/quiet.py: hidden unless --verbose
    if args.list:
        from runner.listing import listing

        print(listing(args.list))
        return 0
    out = Path(args.out or f"results/compare-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    with contextlib.ExitStack() as held:  # the folder's lock, released on return (or by the kernel at death)
        try:
            check_out_folder(out)
            # a folder that exists may be another runner's: refused before its runs are read
            lock = None if args.check or not out.exists() else take_folder(out, held)
            search = plan_search(args)  # the [tune] search (runner/tuning.py), or None
            if search:
                args.experiment = apply_choice(args.experiment, read_tuning(out))  # a finished search's choice
                search.configs = validate(search.args, out / SEARCH_FOLDER / "runs")
            configs = validate(args, out / "runs")
            if args.check:
                if search:
                    print(f"tuning search ({search.protocol.describe(search.rounds)}):")
                    print_check(search.configs, out / SEARCH_FOLDER / "runs", args.clients)
                    print("the table (its tuned rows run the values the search chooses):")
                print_check(configs, out / "runs", args.clients)
                return 0
            lock = lock or take_folder(out, held)
            gpus = plan(args, out)
            app = snapshot(out)
        except (ConfigError, DataUnavailableError, PartitionError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            if search:
                configs = run_search(args, search, out, gpus, lock, app)
            outcome = launch(args, configs, out / "runs", gpus, lock, app)
        except MissingTool as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except (ConfigError, DataUnavailableError, PartitionError) as exc:  # the search chose nothing
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return report(outcome, out)


def run_search(args: argparse.Namespace, search: SearchPlan, out: Path, gpus: float, lock: int | None,
               app: Path = APP_DIR) -> list:
    """The [tune] search (its runs kept in <out>/tuning like any comparison's), its record
    <out>/tuning.json, and the table's configs with the chosen values (checked again, so a
    table run made with another choice is refused, not kept)."""
    runs = out / SEARCH_FOLDER / "runs"
    print(f"tuning search: {search.protocol.describe(search.rounds)}; its accuracies are on the validation split",
          flush=True)
    report(launch(search.args, search.configs, runs, gpus, lock, app), out / SEARCH_FOLDER)
    record = tuning_record(search.protocol, search.rounds, runs)
    print(f"tuning: wrote {write_tuning(out, record)}; chosen: " + "; ".join(
        f"{row} {entry['chosen']}" for row, entry in record["rows"].items()), flush=True)
    args.experiment = apply_choice(args.experiment, record)
    return validate(args, out / "runs")


def check_out_folder(out: Path) -> None:
    """The results folder must be a folder this user can write, or be creatable: refused in
    one line (``ConfigError``) before anything is validated or launched."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is invalid: it is a file, not a folder; give a folder for the results")
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "is not a folder" if not existing.is_dir() else "cannot be written by this user"
        raise ConfigError(f"--out {out} is invalid: {existing} {what}; give a folder you can write")


def take_folder(out: Path, held: contextlib.ExitStack) -> int:
    """Hold ``out``'s lock (``lock_folder``) until ``held`` closes; a folder in use by another
    runner or one that cannot be written is a one-line ``ConfigError``."""
    try:
        fd = lock_folder(out)
        held.callback(os.close, fd)
        return fd
    except FolderInUse as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"--out {out} cannot be written ({exc.strerror or exc}): give a folder you can"
                          " write") from None


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4f}"


if __name__ == "__main__":
    sys.exit(main())
