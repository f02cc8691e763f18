"""The sweep: ``run_comparison`` validates (``runner.checks``), records the arguments for
``--resume`` and freezes the app, launches one ``flwr run`` per (row, seed) on private
SuperLinks (``runner.parallel``), prints each run's progress and result, and writes the
comparison (``runner.results.report``); an experiment file's ``[tune]`` search runs first
(``run_search``). Finished runs are kept, checkpointed ones continue."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from fl_app.api import (
    CHECKPOINT,
    METRICS_FILE,
    DataUnavailableError,
    PartitionError,
    atomic_write_text,
    code_revision,
    read_summary,
    with_app_digest,
    write_run_config,
)
from fl_app.config import ConfigError
from runner.checks import changed_runs, check_out_folder, print_checks, validate
from runner.cli import runner_record
from runner.launch import APP_DIR, LocalSimulation
from runner.parallel import Failed, Machine, Pool, default_workers, say, split
from runner.processes import FolderInUse, MissingTool, lock_folder, release_folder
from runner.progress import Progress
from runner.quiet import HeldTraceback, for_output, is_noise, is_progress, plain
from runner.results.fingerprint import split_by_data
from runner.results.records import as_record, read_rows
from runner.results.report import (
    compare,
    missing_metrics,
    plot,
    plot_curves,
    plot_drift,
    setup_title,
    terminal_summary,
    write_comparison,
)
from runner.snapshot import DIGEST_FILE, snapshot_app
from runner.tuning import (
    APP_DIGEST_FILE,
    SEARCH_FOLDER,
    SearchPlan,
    apply_choice,
    committed_reuse,
    diverged_points,
    edge_choices,
    plan_search,
    read_tuning,
    tuning_record,
    write_tuning,
)


@dataclass
class Outcome:
    """What the launch step hands the report step: the kept runs per row, and the names of
    the runs that failed (no summary), stopped before their last round, or lost their metrics.csv."""

    runs: dict[str, list[Path]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)  # kept finished runs whose metrics.csv is gone


def plan(args: argparse.Namespace, out: Path) -> float:
    """Step 3: record the arguments for --resume and the code revision; the GPUs per client
    (default: 0, or a share of the GPU when CUDA is present)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "runner.json", json.dumps(runner_record(args), indent=1))
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


def progress_printer(args: argparse.Namespace, tail: list[str], lead: str = "    ",
                     progress: Progress | None = None, index: int = 0):
    """The callback for one run's output lines: keeps the last 40 in ``tail``, prints what
    --quiet / --verbose ask for, each line after ``lead`` (the run's tag when runs go in parallel);
    unless --verbose, the traceback of a run that stopped itself is left out (``HeldTraceback``).
    With ``progress`` (``runner/progress.py``), each ``round k/N`` line of run ``index`` gets the
    run's and the sweep's elapsed time and time left."""
    held = HeldTraceback()  # the traceback of a run's own stop is hidden: the runner says why it stopped

    def on_line(line: str) -> None:
        tail.append(line)
        del tail[:-40]
        for shown in ([line] if args.verbose else held.feed(line)):
            if args.quiet:
                show = is_progress(shown)
            else:
                show = args.verbose or not is_noise(shown)
            if show:
                say(lead + for_output(progress.line(index, shown) if progress else shown))

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
        kept = as_record(run_dir)
        earlier = kept.summary
        if earlier is None:
            jobs.append((i, row, seed, cfg))
            continue
        how = f"stopped earlier ({earlier['stopped']})" if earlier.get("stopped") else "finished earlier"
        if trained_nothing(earlier):
            how = f"failed earlier: {trained_nothing(earlier)}"
            parts[-1].failed.append(cfg["run-name"])
        elif earlier.get("stopped"):
            parts[-1].stopped.append(cfg["run-name"])
        if missing_metrics([kept]):  # its summary stays a result; the lost per-round record is said
            parts[-1].incomplete.append(cfg["run-name"])
            how += f", but its {METRICS_FILE} is missing (removed after it finished)"
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
        outcome.incomplete += part.incomplete
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
    progress = job_progress(args, jobs, n)
    if n > 1:
        say(f"running {len(jobs)} runs {n} at a time (--parallel {n}), each on its own SuperLink and Ray with "
            + "; ".join(sorted({share.describe() for share in shares})))

    def start(share) -> tuple[LocalSimulation, float]:
        return start_worker(share, app, cluster, lock)

    def work(worker: tuple[LocalSimulation, float], job: tuple[int, str, int, dict]) -> None:
        (sim, gpus_per_client), (i, row, seed, cfg) = worker, job
        run_dir, lead = runs_dir / cfg["run-name"], "    " if n == 1 else f"  [{i}/{total}] "
        cfg = open_run_folder(args, (row, seed, cfg), runs_dir, app, parts[i - 1], lead)
        if cfg is None:
            return
        times = progress.start(i)
        say(f"[{i}/{total}] {row} seed {seed} -> {run_dir}" + (" (resuming)" if cfg.get("resume") else "")
            + f" ({times})")
        tail: list[str] = []
        before = probe_before(cfg)  # this machine's speed as the run starts, for its recorded timing
        started = time.monotonic()
        sim.run(cfg, num_supernodes=args.clients, cpus_per_client=args.cpus_per_client,
                gpus_per_client=gpus_per_client, on_line=progress_printer(args, tail, lead, progress, i))
        progress.finish(i)
        if not pool.stopping.is_set():  # stopped by Ctrl-C: not a result, nothing to report
            record_run(row, cfg["run-name"], run_dir, tail, parts[i - 1], lead)
            if not cfg.get("resume"):  # this machine's timing, for later estimates (runner/estimate.py)
                record_timing(run_dir, time.monotonic() - started, args.clients, before)

    pool = Pool(jobs, shares, start=start, stop=lambda worker: worker[0].close(), work=work)
    for (i, _, _, cfg), result in zip(jobs, pool.results()):
        if isinstance(result, Failed):  # the runner's own error in one run (the others went on)
            parts[i - 1].failed.append(cfg["run-name"])
            error = result.error  # a file it could not write (a full disk) in one line; a bug with its traceback
            say(f"  [{i}/{total}] run failed in the runner: " + (file_problem(error) if isinstance(
                error, OSError) else "".join(traceback.format_exception(error)).rstrip()), sys.stderr)
    say(progress.summary())


def start_worker(share, app: Path, cluster: str | None, lock: int | None) -> tuple[LocalSimulation, float]:
    """One worker of the sweep: a private SuperLink and Ray with its ``share`` of the machine
    (``runner/parallel.py``), holding the folder's ``lock``; and its GPUs per client."""
    sim = LocalSimulation(app_dir=app, ray_address=cluster, hold=(lock,) if lock else ())
    sim.ray_resources = {k: v for k, v in (("num-cpus", share.ray_cpus), ("num-gpus", share.ray_gpus))
                         if v is not None}
    if share.cuda_devices is not None:
        sim.env["CUDA_VISIBLE_DEVICES"] = share.cuda_devices
    sim.start()
    return sim, share.gpus_per_client


def open_run_folder(args: argparse.Namespace, job: tuple[str, int, dict], runs_dir: Path, app: Path,
                    part: Outcome, lead: str) -> dict | None:
    """The run's folder made ready, just before it starts: its config as launched (``resume``
    when it has a checkpoint) and the app it ships recorded. Checked again now, not only
    before the sweep: a folder another run of this sweep wrote meanwhile, or one made by hand,
    is refused (None, the run filed as failed), never resumed or overwritten under this run's
    settings."""
    row, seed, cfg = job
    run_dir = runs_dir / cfg["run-name"]
    if changed := changed_runs([(row, seed, cfg)], runs_dir, getattr(args, "env_data_dir", None), args.clients):
        part.failed.append(cfg["run-name"])
        say(f"{lead}run refused, its folder kept as it is: {changed[0]}", sys.stderr)
        return None
    if (run_dir / CHECKPOINT).exists():
        cfg = {**cfg, "resume": True}
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_config(run_dir, cfg)
    record_app(run_dir, app, bool(cfg.get("resume")))
    return cfg


def record_app(run_dir: Path, app: Path, resumed: bool) -> None:
    """``<run>/app.sha256``: the digest of the app package the run ships (the sweep's snapshot,
    ``runner/snapshot.py``), which a tuning record keeps per search run (``runner.tuning.made_with``)
    so that a later search reuses the score only for the same code. A run resumed under another
    package has no single code: its digest file is removed (its score is never reused)."""
    try:
        digest = (app / DIGEST_FILE).read_text().strip()
    except OSError:
        digest = ""
    marker = run_dir / APP_DIGEST_FILE
    try:
        earlier = marker.read_text().strip() if marker.exists() else None
    except OSError:
        earlier = None
    if resumed and earlier != digest:
        marker.unlink(missing_ok=True)
    elif digest:
        atomic_write_text(marker, digest + "\n")


def job_progress(args: argparse.Namespace, jobs: list[tuple[int, str, int, dict]], workers: int) -> Progress:
    """The ``Progress`` of the runs to launch, with the estimate of each (``runner.estimate``:
    probed now, with this machine's recorded timings); without one (a config the estimate cannot
    size, or any error of the estimate: it is a help, never a reason to stop) only elapsed times."""
    try:
        from fl_app.api import resolve
        from runner.estimate import estimate

        resolved = [resolve(cfg) for _, _, _, cfg in jobs]
        est = estimate([c for c, _ in resolved], args.clients, [m.update.step_cost for _, m in resolved])
    except Exception:  # noqa: BLE001 - the estimate only adds times to the progress lines
        return Progress({}, workers=workers)
    runs_share = 1 - est.sweep / est.seconds if est.seconds > 0 else 0.0  # the runs' part of the range
    low, high = est.low * runs_share, est.high * runs_share
    return Progress({i: s for (i, _, _, _), s in zip(jobs, est.runs) if s > 0}, low, high, workers)


def probe_before(cfg: dict) -> tuple | None:
    """(reference, model probe, background load) as a run starts (``runner.estimate``: the
    reference, 0.1 s; the model's probe of the sweep's estimate, reused; ``load_now``, 0.5 s):
    what its recorded timing is measured against, as ``--check`` measures before a run; None on
    any error (a timing is only a help)."""
    try:
        from fl_app.api import resolve
        from runner.estimate import load_now, measure, probed, reference_seconds

        resolved, _ = resolve(cfg)
        key = (resolved["dataset"], resolved["model"], resolved["batch-size"])
        return reference_seconds(repeats=5, pause=0.02), probed(key, lambda: measure(resolved)), load_now()
    except Exception:  # noqa: BLE001
        return None


def record_timing(run_dir: Path, wall: float, clients: int, before: tuple | None = None) -> None:
    """This machine's timing of a finished run (``runner.estimate.record_timing``), against the
    probes taken ``before`` it; any error is ignored: a timing helps later estimates and never
    fails a run."""
    try:
        from runner.estimate import record_timing as record

        record(run_dir, wall, clients, before=before)
    except Exception:  # noqa: BLE001
        pass


def record_run(row: str, name: str, run_dir: Path, tail: list[str], outcome: Outcome, lead: str = "    ") -> None:
    """After one run: print its result (or why it failed), each line after ``lead``, and file
    it in ``outcome``."""
    summary = read_summary(run_dir)  # only the summary: the report reads the rest once
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
    if summary.get("status") == "diverged" and summary.get("diverged"):
        say(f"{lead}diverged in round {summary['diverged'].get('round')}: {summary['diverged'].get('text')}")
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
    """Step 5: comparison.csv/.md and the plots; the exit code (1 when a run failed or a kept
    run lost its metrics.csv). A row whose runs were made on different data (kept runs beside new
    ones) is split, in the table and the plots alike (``split_by_data``): no mean is taken over
    two data sets."""
    read = read_rows(outcome.runs)  # each run folder read once, for the table and the plots
    table = compare(read)
    setup = setup_title(read)  # the split (partitioner, its keys, noise, client sizes) and the model
    write_comparison(table, out, setup)
    runs, _ = split_by_data(read)
    plot_curves(runs, out / "accuracy.png")
    plot(runs, "ri_mean", "roughness index (mean over clients)", out / "roughness.png")
    plot_drift(runs, out / "drift.png")
    print(terminal_summary(table, out, setup))
    print(f"results in {out}")
    if outcome.stopped:  # a result (e.g. a method diverging), kept and reported, but worth a look
        print(f"note: {len(outcome.stopped)} run(s) stopped before their last round (see 'stopped' in their "
              f"summary.json; to redo one, run again with another --out): {', '.join(outcome.stopped)}",
              file=sys.stderr)
    if outcome.incomplete:
        print(f"error: {len(outcome.incomplete)} finished run(s) have no {METRICS_FILE} (removed after they finished;"
              f" their rows use summary.json, their curves and per-round columns are missing): "
              f"{', '.join(outcome.incomplete)}; run them again with another --out", file=sys.stderr)
    if outcome.failed:
        print(f"error: {len(outcome.failed)} run(s) failed: {', '.join(outcome.failed)}", file=sys.stderr)
    return 1 if outcome.failed or outcome.incomplete else 0


def run_comparison(args: argparse.Namespace, out: Path) -> int:
    """validate -> plan -> launch -> report into ``out``, holding its lock (kept when Ctrl-C
    unwinds this, released by the kernel at the runner's end; removed on a normal return)."""
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
                return print_checks(args, search, configs, out)
            lock = lock or take_folder(out, held)
            gpus = plan(args, out)
            app = snapshot(out)
        except (ConfigError, DataUnavailableError, PartitionError, OSError) as exc:
            print(f"error: {file_problem(exc, out) if isinstance(exc, OSError) else exc}", file=sys.stderr)
            return 2
        try:
            if search:
                configs = run_search(args, search, out, gpus, lock, app)
            return report(launch(args, configs, out / "runs", gpus, lock, app), out)
        except MissingTool as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except (ConfigError, DataUnavailableError, PartitionError) as exc:  # the search chose nothing
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:  # the runner's own files: a full disk while writing the comparison, ...
            print(f"error: {file_problem(exc, out)}", file=sys.stderr)
            return 1


def file_problem(exc: OSError, out: Path | None = None) -> str:
    """One line for an ``OSError`` on the runner's own files (a full disk, a folder made
    read-only under it): the file and the reason, and with ``out`` that what is finished there
    stays for --resume; for a name too long (``ENAMETOOLONG``), which --resume would meet again,
    what to shorten instead. (Every file is written through a temp file and a rename, so none is
    left half written.)"""
    where = f" {exc.filename}" if exc.filename else ""
    line = f"cannot write{where}: {exc.strerror or exc}"
    if exc.errno == errno.ENAMETOOLONG:  # --resume keeps the names, so it would meet the same error
        return line + ("; the names come from --out and the row labels, which --resume keeps: run again with a"
                       " shorter --out or shorter labels")
    return line + (f"; the finished runs and checkpoints in {out} are kept: free space (or fix the folder) and"
                   f" continue with run_simulation.py --resume {out}" if out else "")


def run_search(args: argparse.Namespace, search: SearchPlan, out: Path, gpus: float, lock: int | None,
               app: Path = APP_DIR) -> list:
    """The [tune] search (its runs kept in <out>/tuning like any comparison's), its record
    <out>/tuning.json, and the table's configs with the chosen values (checked again, so a
    table run made with another choice is refused, not kept)."""
    runs = out / SEARCH_FOLDER / "runs"
    print(f"tuning search: {search.protocol.describe(search.rounds)}; its accuracies are on the validation split",
          flush=True)
    reused = reuse_committed(args, search, runs, app)
    configs = [c for c in search.configs if c[2]["run-name"] not in reused]
    if configs:
        report(launch(search.args, configs, runs, gpus, lock, app), out / SEARCH_FOLDER)
    record = tuning_record(search.protocol, search.rounds, runs, reused)
    print(f"tuning: wrote {write_tuning(out, record)}; chosen: " + "; ".join(
        f"{row} {entry['chosen']}" for row, entry in record["rows"].items()), flush=True)
    for line in edge_choices(record):  # said now, not only in docs/results.md: the table is about to cost more
        print(f"tuning: not bracketed: {line}; a better value may lie outside it: widen the file's [tune] grid"
              " past it and run again (the kept search runs are reused)", flush=True)
    for line in diverged_points(record):
        if line:
            print(f"tuning: {line}", flush=True)
    args.experiment = apply_choice(args.experiment, record)
    return validate(args, out / "runs")


def reuse_committed(args: argparse.Namespace, search: SearchPlan, runs: Path, app: Path = APP_DIR,
                    root: Path | None = None) -> dict:
    """The search runs whose scores the experiment's committed tuning record holds for the same
    app code (this sweep's package, ``app``), run config, data and library versions
    (``runner.tuning.committed_reuse``): they are not launched; the runner says which were reused
    and why the record's other runs run again."""
    try:
        code = (app / DIGEST_FILE).read_text().strip() or None
    except OSError:
        code = None
    reused, lines = committed_reuse(args, search, runs, code, root or APP_DIR)
    for line in lines:
        print(line, flush=True)
    return reused


def take_folder(out: Path, held: contextlib.ExitStack) -> int:
    """Hold ``out``'s lock (``lock_folder``) until ``held`` closes, its file removed when the
    runner leaves cleanly (``release_folder``: every watchdog has been dismissed by then); a
    folder in use by another runner or one that cannot be written is a one-line ``ConfigError``."""
    try:
        fd = lock_folder(out)
        held.push(lambda kind, exc, tb: release_folder(out, fd, remove=kind is None))  # removed on a clean exit
        return fd
    except FolderInUse as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"--out {out} cannot be written ({exc.strerror or exc}): give a folder you can"
                          " write") from None


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4f}"
