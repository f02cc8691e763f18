"""The runner's checks before anything is launched or written (``validate``: resources, every
run's config, data and federation size, checkpoints, runs made with another config) and
``--check``'s report of them (``print_checks``). Every refusal is a ``ConfigError`` (or a data
error) of one line, raised before a SuperLink starts."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import math
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from fl_app.api import SUMMARY_FILE, RunFacts, check_configs, check_report, check_splits, preflight
from fl_app.api import changed_data as changed_data  # a kept run's data against the data asked for now
from fl_app.api import changed_runs as changed_in
from fl_app.config import ConfigError, did_you_mean
from fl_app.registry import method_names, parse_override
from runner.launch import visible_gpus
from runner.parallel import check_workers
from runner.plan import (
    check_axes,
    check_command_line_keys,
    check_name_length,
    check_read_by_some,
    check_run_names,
    grid_points,
    label,
    parse_grid,
    resolve_rows,
    row_axes,
    run_name,
    shown,
)
from runner.snapshot import SNAPSHOT_FOLDER
from runner.tuning import SEARCH_FOLDER, SearchPlan, committed_reuse


def planned_configs(args: argparse.Namespace, runs_dir: Path) -> list[tuple[str, int, dict]]:
    """Every (label, seed) run config as the command line and the experiment file ask for it,
    unchecked (``build_configs`` checks them); a ConfigError for the grid and the rows.

    Precedence (later wins; see runner/plan.py): the file's [run-config], its
    [methods.<label>] keys, its grids, the command line (flags and --set), --grid. A grid is a
    grid of the rows whose method reads its key (``runner.plan.row_axes``); a ``--set`` or
    ``--grid`` key that no row of the table reads is refused, and so is, for a file that lists no
    rows itself, a ``[methods.<label>]`` table of a row ``--strategy`` does not list. A relative
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
    rows = resolve_rows(names, per_method, method_names())
    if "strategies" not in experiment:  # a file without its own list: its tables are checked against this one
        check_listed(per_method, names, "--strategy")
    # the table's rows (a tuning search runs some of them: SearchPlan's args keep the table's list)
    table = [s.strip() for s in getattr(args, "table_strategy", listed).split(",") if s.strip()]
    methods = [strategy for _, strategy, _, _ in resolve_rows(table, per_method, method_names())]
    check_read_by_some([k for k in command_line if k in set_keys(args)], methods, "--set {key}=...")
    check_read_by_some(cli_grid, methods, "--grid {key}=...")
    configs = []
    for name, strategy, keys, method_grid in rows:
        axes = row_axes(strategy, {k: v for k, v in {**file_grid, **method_grid}.items() if k not in command_line},
                        cli_grid)
        for point in grid_points(axes):
            row = label(name, point)
            for seed in args.seeds:
                raw = {**base, **keys, **command_line, **point, "strategy": strategy, "seed": seed,
                       "results-dir": str(runs_dir), "run-name": run_name(row, seed)}
                given = str(raw.get("data-dir", ""))
                raw["data-dir"] = str(Path(args.cwd or ".", given)) if given and args.cwd else given
                configs.append((row, seed, raw))
    check_run_names([row for row, _, _ in configs], args.seeds)
    return configs


def set_keys(args: argparse.Namespace) -> set[str]:
    """The keys ``--set`` gives (``command_line_keys`` adds the flags' keys, which are general)."""
    return {parse_override(text)[0] for text in args.overrides}


def check_listed(per_method: dict, names: list[str], where: str) -> None:
    """Refuse a ``[methods.<label>]`` table for a label that ``names`` does not list: its keys
    would reach no run."""
    for name in per_method:
        if name not in names:
            raise ConfigError(f"[methods.{name}] is a table for a row {where} does not list{did_you_mean(name, names)};"
                              f" listed: {', '.join(names)}; list it, or remove the table")


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
    check_run_folders(planned, runs_dir)
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
    which the split lines name and the next check removes."""
    groups = ([(search.configs, out / SEARCH_FOLDER / "runs")] if search else []) + [(configs, out / "runs")]
    runs = [(runs_dir / raw["run-name"], raw) for group, runs_dir in groups for _, _, raw in group]
    facts = check_report(runs, args.clients, visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES")))
    splits = []
    if configs:
        with check_folder() as folder:
            splits = check_splits([raw for _, _, raw in configs], folder, args.clients)
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


CHECK_PREFIX = "fl-drift-check-"  # a check's folder in the system's temporary directory
IN_USE = ".in-use"  # in a check's folder: locked (fcntl.flock) while the check draws in it
LEFTOVER_AGE = 60.0  # seconds: an older folder without IN_USE is a leftover (of a check before IN_USE)


@contextlib.contextmanager
def check_folder():
    """Where ``--check`` draws its splits: a new folder ``fl-drift-check-*`` in the system's
    temporary directory (``$TMPDIR``), never the results folder, so that a check leaves no
    ``results/compare-<time>`` behind and adds nothing to an ``--out`` a sweep will use. The
    folder stays after the check (its ``split:`` lines name its pictures) until the next check,
    which removes this user's earlier check folders first (``remove_idle``): one is left, not
    one per check. While the check draws, its folder's ``IN_USE`` file is locked, so a check
    running beside it never removes it."""
    for earlier in Path(tempfile.gettempdir()).glob(CHECK_PREFIX + "*"):
        remove_idle(earlier)
    folder = Path(tempfile.mkdtemp(prefix=CHECK_PREFIX))
    fd = os.open(folder / IN_USE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        os.close(fd)  # the lock goes with it; the folder stays for its pictures


def remove_idle(folder: Path) -> None:
    """Remove an earlier check's ``folder`` if it is this user's (a real folder, not a link) and
    no check draws in it now (its ``IN_USE`` lock is free; a folder without one is removed once
    it is ``LEFTOVER_AGE`` old: a check makes the lock at once). Anything else is left alone."""
    try:
        info = folder.lstat()
    except OSError:  # removed meanwhile
        return
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return
    try:
        fd = os.open(folder / IN_USE, os.O_RDWR)
    except FileNotFoundError:
        if time.time() - info.st_mtime > LEFTOVER_AGE:
            shutil.rmtree(folder, ignore_errors=True)
        return
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # a check is drawing in it
        os.close(fd)
        return
    shutil.rmtree(folder, ignore_errors=True)
    os.close(fd)


def check_out_folder(out: Path) -> None:
    """The results folder must be a folder this user can write, or be creatable, and what the
    launch makes in it (``runs``, ``tuning``, ``app``, ``runner.json``) must be of its kind and
    writable where it exists: refused in one line (``ConfigError``) before anything is
    validated or launched, by ``--check`` as by the launch. Each name of the path fits
    ``NAME_MAX``. Writable is tried, not asked (``write_problem``): ``os.access`` answers yes
    to root on a file system that refuses every write (sysfs, a read-only mount)."""
    for part in out.parts:
        check_name_length(part, f"--out {shown(str(out))}", "give a shorter --out")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is invalid: it is a file, not a folder; give a folder for the results")
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"--out {out} is invalid: {existing} is not a folder; give a folder you can write")
    folders = [existing] + [out / name for name in ("runs", SEARCH_FOLDER, f"{SEARCH_FOLDER}/runs", SNAPSHOT_FOLDER)]
    for folder in folders:
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"--out {out} is invalid: {folder} is a file, where the runner makes a folder; remove it"
                              " or give another --out")
        if folder.is_dir() and (problem := write_problem(folder)):
            raise ConfigError(f"--out {out} is invalid: {folder} cannot be written by this user ({problem}); give a"
                              " folder you can write")
    if (out / "runner.json").is_dir():
        raise ConfigError(f"--out {out} is invalid: {out / 'runner.json'} is a folder, where the runner writes its"
                          " record for --resume; remove it or give another --out")


def write_problem(folder: Path) -> str:
    """'' when a folder can be made in ``folder`` (one is made and removed at once, so nothing
    is left), else the reason the system gives ("Permission denied", "Read-only file system")."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fl-drift-write-check-", dir=folder))
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def check_run_folders(configs: list[tuple[str, int, dict]], runs_dir: Path) -> None:
    """Each run's folder, where it exists already (a kept or interrupted run, or something made
    by hand), is a folder, and one the run can write when the launch will run it again (no
    summary.json): refused in one line, not at its launch."""
    for row, seed, raw in configs:
        run_dir = Path(runs_dir) / raw["run-name"]
        if run_dir.exists() and not run_dir.is_dir():
            raise ConfigError(f"{row} seed {seed}: {run_dir} is a file, where the run makes its folder; remove it or"
                              " give another --out")
        if run_dir.is_dir() and not (run_dir / SUMMARY_FILE).exists() and (problem := write_problem(run_dir)):
            raise ConfigError(f"{row} seed {seed}: its folder {run_dir} cannot be written by this user ({problem});"
                              " fix its permissions or give another --out")
