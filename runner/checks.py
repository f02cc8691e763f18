"""The runner's checks before anything is launched or written (``validate``: resources, every
run's config, data and federation size, checkpoints, runs made with another config) and
``--check``'s report of them (``print_checks``). Every refusal is a ``ConfigError`` (or a data
error) of one line, raised before a SuperLink starts."""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

from fl_app.api import RunFacts, check_configs, check_report, check_splits, preflight
from fl_app.api import changed_data as changed_data  # a kept run's data against the data asked for now
from fl_app.api import changed_runs as changed_in
from fl_app.config import ConfigError
from fl_app.registry import method_names, parse_override
from runner.launch import visible_gpus
from runner.parallel import check_workers
from runner.plan import (
    check_axes,
    check_command_line_keys,
    check_run_names,
    grid_points,
    label,
    parse_grid,
    resolve_rows,
    run_name,
)
from runner.tuning import SEARCH_FOLDER, SearchPlan, committed_reuse


def planned_configs(args: argparse.Namespace, runs_dir: Path) -> list[tuple[str, int, dict]]:
    """Every (label, seed) run config as the command line and the experiment file ask for it,
    unchecked (``build_configs`` checks them); a ConfigError for the grid and the rows.

    Precedence (later wins; see runner/plan.py): the file's [run-config], its
    [methods.<label>] keys, its grids, the command line (flags and --set), --grid. A relative
    ``data-dir`` of an experiment file is taken from the folder the sweep was started in
    (``args.cwd``)."""
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
                raw["data-dir"] = str(Path(args.cwd or ".", given)) if given and args.cwd else given
                configs.append((row, seed, raw))
    check_run_names([row for row, _, _ in configs])
    return configs


def where_to_run(args: argparse.Namespace) -> dict:
    """What the checks of ``fl_app.api`` need to know of this launcher: the ``$FL_DATA_DIR`` the
    sweep reads (``env_data_dir``), the GPUs it may use, whether it runs on a Ray cluster."""
    return {"env_data_dir": args.env_data_dir, "gpus": visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES")),
            "cluster": bool(getattr(args, "ray_address", None))}


def build_configs(args: argparse.Namespace, runs_dir: Path) -> list[tuple[str, int, dict]]:
    """Every (label, seed) config (``planned_configs``), checked up front as it is launched
    (``fl_app.api.check_configs``: its data-dir resolved, its path, its method, data folder and
    federation size); raises ConfigError before any launch."""
    planned = planned_configs(args, runs_dir)
    checked = check_configs([raw for _, _, raw in planned], args.clients, **where_to_run(args))
    return [(row, seed, c.raw) for (row, seed, _), c in zip(planned, checked)]


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


def changed_runs(configs: list[tuple[str, int, dict]], runs_dir: Path, env_data_dir: str | None = None,
                 clients: int | None = None) -> list[str]:
    """Runs in ``runs_dir`` (finished, or started and checkpointed) whose recorded config or data
    differs from what is asked now (``fl_app.api.changed_runs``): keeping or continuing them would
    mix two experiments."""
    return changed_in([raw for _, _, raw in configs], runs_dir, env_data_dir, clients)


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


def validate(args: argparse.Namespace, runs_dir: Path) -> list[tuple[str, int, dict]]:
    """Step 2: every check that can fail before anything is launched or written (resources,
    configs, data, checkpoints, runs made with another config: ``fl_app.api.preflight``), as
    launched; raises the first problem."""
    check_resources(args)
    check_workers(getattr(args, "parallel", None))
    planned = planned_configs(args, runs_dir)
    checked, changed = preflight([raw for _, _, raw in planned], args.clients, runs_dir, **where_to_run(args))
    if changed:
        raise ConfigError("finished or started runs would be kept or continued although config or data changed:\n  "
                          + "\n  ".join(changed) + "\nrun the changed config with another --out"
                          " (the runs there are kept as they are)")
    return [(row, seed, c.raw) for (row, seed, _), c in zip(planned, checked)]


def print_check(configs: list[tuple[str, int, dict]], runs_dir: Path, clients: int, facts: list[RunFacts]) -> None:
    """`--check`'s report: one line per run saying whether a launch would run it, continue it
    or keep it, and on which execution path; each path's reason once; the estimated time of
    what is left (finished runs cost nothing; a continued run costs its start and its
    remaining rounds). ``facts``: each run's, from ``fl_app.api.check_report``."""
    from runner.estimate import describe

    left, step_costs, paths, reasons = [], [], [], {}
    for (row, seed, raw), run in zip(configs, facts):
        cfg, execution, rounds = run.cfg, run.execution, run.rounds_left
        status = ("finished, kept" if rounds == 0 else
                  f"continues after round {cfg['num-server-rounds'] - rounds}" if rounds < cfg["num-server-rounds"]
                  else "to run")
        print(f"ok: {row} seed {seed} -> {runs_dir / raw['run-name']} ({status}; {execution.path})")
        reasons[execution.path, execution.reason] = reasons.get((execution.path, execution.reason), 0) + 1
        if rounds:
            left.append({**cfg, "num-server-rounds": rounds})
            step_costs.append(run.step_cost)
            paths.append(execution.path)
    for (path, reason), runs in reasons.items():  # each reason once, however many runs it explains
        print(f"{path} ({runs} of {len(configs)} runs): {reason}")
    print(describe(left, clients, kept=len(configs) - len(left), step_costs=step_costs, paths=paths))


def print_checks(args: argparse.Namespace, search: SearchPlan | None, configs: list, out: Path) -> int:
    """``--check``'s report of the tuning search (when the file has one) and the table
    (``print_check``), then a line per picture of the table's splits; 0. ``out`` is only named:
    a check creates no results folder and writes nothing into one (with or without ``--out``);
    its pictures go into a new folder of the system's temporary directory (``check_folder``),
    which the split lines name."""
    groups = ([(search.configs, out / SEARCH_FOLDER / "runs")] if search else []) + [(configs, out / "runs")]
    runs = [(runs_dir / raw["run-name"], raw) for group, runs_dir in groups for _, _, raw in group]
    facts = check_report(runs, args.clients, visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES")))
    splits = check_splits([raw for _, _, raw in configs], check_folder(), args.clients) if configs else []
    if search:
        print(f"tuning search ({search.protocol.describe(search.rounds)}):")
        reused = search_reuse(args, search, groups[0][1])
        kept = [(c, f) for c, f in zip(search.configs, facts) if c[2]["run-name"] not in reused]
        print_check([c for c, _ in kept], groups[0][1], args.clients, [f for _, f in kept])
        print("the table (its tuned rows run the values the search chooses):")
    print_check(configs, out / "runs", args.clients, facts[-len(configs):] if configs else [])
    print("\n".join(splits))
    return 0


def search_reuse(args: argparse.Namespace, search: SearchPlan, runs: Path) -> dict:
    """The search runs a launch would not run because the committed tuning record scored them
    with the same code, config, data and versions (``runner.tuning.committed_reuse``, the code
    being the package the checkout makes now), said in its lines; {} when the app cannot be
    packaged (the launch would refuse it)."""
    import hashlib

    from flwr.cli.build import build_fab_from_disk

    from runner.launch import APP_DIR

    try:
        code = hashlib.sha256(build_fab_from_disk(APP_DIR)).hexdigest()
    except ValueError:
        return {}
    reused, lines = committed_reuse(args, search, runs, code, APP_DIR)
    for line in lines:
        print(line)
    return reused


def check_folder() -> Path:
    """Where ``--check`` draws its splits: a new folder ``fl-drift-check-*`` in the system's
    temporary directory (``$TMPDIR``), never the results folder, so that a check leaves no
    ``results/compare-<time>`` behind and adds nothing to an ``--out`` a sweep will use."""
    return Path(tempfile.mkdtemp(prefix="fl-drift-check-"))


def check_out_folder(out: Path) -> None:
    """The results folder must be a folder this user can write, or be creatable: refused in
    one line (``ConfigError``) before anything is validated or launched."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is invalid: it is a file, not a folder; give a folder for the results")
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "is not a folder" if not existing.is_dir() else "cannot be written by this user"
        raise ConfigError(f"--out {out} is invalid: {existing} {what}; give a folder you can write")
