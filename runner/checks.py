"""The runner's checks before anything is launched or written (``validate``: resources, every
run's config, data and federation size, checkpoints, runs made with another config) and
``--check``'s report of them (``print_checks``). Every refusal is a ``ConfigError`` (or a data
error) of one line, raised before a SuperLink starts."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from fl_app.common.run_files import FINGERPRINT_FILE
from fl_app.config import ConfigError
from fl_app.registry import check_method, method_names, parse_override, resolve, validate_config
from fl_app.registry import spec as config_keys
from fl_app.server.checkpoint import CHECKPOINT, load_checkpoint
from fl_app.server.preflight import check_data_dir, check_nodes
from runner.launch import execution_for
from runner.parallel import check_workers
from runner.plan import (
    check_axes,
    check_command_line_keys,
    grid_points,
    label,
    parse_grid,
    resolve_rows,
    run_name,
)
from runner.results.report import read_summary
from runner.tuning import SEARCH_FOLDER, SearchPlan
from tasks.datasets import resolve_data_dir
from tasks.partition_figure import write_check_splits
from tasks.partitioning import PartitionSpec, check_data
from tasks.train import min_batch_of


def build_configs(args: argparse.Namespace, runs_dir: Path) -> list[tuple[str, int, dict]]:
    """Validate every (label, seed) config up front; raises ConfigError before any launch.

    Precedence (later wins; see runner/plan.py): the file's [run-config], its
    [methods.<label>] keys, its grids, the command line (flags and --set), --grid."""
    experiment = getattr(args, "experiment", {}) or {}
    base: dict = dict(experiment.get("run-config", {}))
    per_method: dict = experiment.get("methods", {})
    command_line = command_line_keys(args)
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


def command_line_keys(args: argparse.Namespace) -> dict:
    """The run-config keys the command line gives: its flags (``--dataset``, ``--rounds``,
    ``--fraction``, ``--alpha``, ``--data-dir``), then ``--set KEY=VALUE`` (the later wins);
    an unknown key, or one the runner sets for each run itself (``runner.plan.RUNNER_KEYS``),
    is a ConfigError."""
    command_line: dict = {}
    for flag, key in (("dataset", "dataset"), ("rounds", "num-server-rounds"),
                      ("fraction", "fraction-fit"), ("alpha", "alpha"), ("data_dir", "data-dir")):
        if getattr(args, flag) is not None:
            command_line[key] = getattr(args, flag)
    for text in args.overrides:
        key, value = parse_override(text)
        command_line[key] = value
    check_command_line_keys(command_line, "--set")
    return command_line


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
    the data asked for now does not have, or when it is a started run (a checkpoint, no summary)
    that recorded none: continuing it would train on data that cannot be shown to be the data it
    started on (the server refuses it too, ``provenance.resumed_fingerprint``). None when it
    matches, or for a finished run that recorded none (made before fingerprints were recorded:
    kept, not guessed). The fingerprint is computed only when there is one to compare."""
    from fl_app.server.provenance import data_fingerprint
    from runner.results.fingerprint import data_change, recorded_fingerprint

    recorded = recorded_fingerprint(run_dir)
    if recorded is None and read_summary(run_dir) is None and (run_dir / CHECKPOINT).exists():
        return (f"{run_dir} would continue from a checkpoint that carries no data fingerprint, and its "
                f"{FINGERPRINT_FILE} is missing: the data it started on is unknown")
    if recorded is None:
        return None
    now = data_fingerprint(wanted, clients or (recorded.get("partition") or {}).get("num-partitions"))
    return data_change(str(run_dir), recorded, now)


def check_resources(args: argparse.Namespace) -> None:
    """CPUs per client must be > 0 (0 failed inside Flower after launch, on a division by zero)
    and GPUs per client >= 0. GPUs asked for must exist: on a machine whose torch sees no CUDA
    GPU, Ray would wait for a GPU that never comes and the run fail after its start-up, in pages
    of tracebacks. (With --ray-address the GPUs are the cluster's, so they are not checked here.)"""
    cpus = getattr(args, "cpus_per_client", 1.0)
    if not (math.isfinite(cpus) and cpus > 0):  # 0 divided by zero inside Flower after launch
        raise ConfigError(f"--cpus-per-client = {cpus:g} is invalid: must be > 0 (Ray CPUs per simulated client,"
                          " e.g. 1, or 0.5 for two clients per core)")
    gpus = args.gpus_per_client
    if gpus is not None and not (math.isfinite(gpus) and gpus >= 0):
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


def validate(args: argparse.Namespace, runs_dir: Path) -> list[tuple[str, int, dict]]:
    """Step 2: every check that can fail before anything is launched or written (resources,
    configs, data, checkpoints, runs made with another config); raises the first problem."""
    check_resources(args)
    check_workers(getattr(args, "parallel", None))
    configs = build_configs(args, runs_dir)
    for spec, model in {(PartitionSpec.from_config(cfg, args.clients), cfg["model"])
                        for cfg in (validate_config(c) for _, _, c in configs)}:
        check_data(spec, min_batch_of(model, spec.dataset))  # each client at least one batch the model trains on
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
            step_costs.append(method.update.step_cost)
            paths.append(execution.path)
    for (path, reason), runs in reasons.items():  # each reason once, however many runs it explains
        print(f"{path} ({runs} of {len(configs)} runs): {reason}")
    print(describe(left, clients, kept=len(configs) - len(left), step_costs=step_costs, paths=paths))


def print_checks(args: argparse.Namespace, search: SearchPlan | None, configs: list, out: Path) -> int:
    """``--check``'s report of the tuning search (when the file has one) and the table; 0."""
    if search:
        print(f"tuning search ({search.protocol.describe(search.rounds)}):")
        print_check(search.configs, out / SEARCH_FOLDER / "runs", args.clients)
        print("the table (its tuned rows run the values the search chooses):")
    print_check(configs, out / "runs", args.clients)
    print("\n".join(write_check_splits([validate_config(c) for _, _, c in configs], out, args.clients)))
    return 0


def check_out_folder(out: Path) -> None:
    """The results folder must be a folder this user can write, or be creatable: refused in
    one line (``ConfigError``) before anything is validated or launched."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is invalid: it is a file, not a folder; give a folder for the results")
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "is not a folder" if not existing.is_dir() else "cannot be written by this user"
        raise ConfigError(f"--out {out} is invalid: {existing} {what}; give a folder you can write")
