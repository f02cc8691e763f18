#!/usr/bin/env python
"""Write docs/results.md: our numbers next to the papers' for every experiment in experiments/.

    python scripts/make_results.py [--collect results/experiments] [--experiments experiments]
                                   [--results docs/results/runs] [--out docs/results.md]

The runs behind the tables are kept in the repository, in docs/results/runs/<name>/<row>-seed<N>/
(each run's metrics.csv and summary.json, machine paths removed; its per_class_accuracy.csv and
the clients' training label counts, client_label_counts.csv, when the run wrote per-class
accuracies), so this script regenerates docs/results.md from a clean checkout, without the data. ``--collect`` first copies the finished runs of the
runner's folder (<dir>/<name>/runs/...) into that store, replacing runs of the same name: each
new copy is built and checked beside the old one and then swapped in (runner/results/store.py),
so a failed collect leaves the store exactly as it was.

One table never mixes two data sets: each run's summary.json records a ``data_fingerprint``
(its data files' sizes and SHA-256, or the hub id and revision, and the partitioning;
fl_app/server/provenance.py), and ``--collect`` refuses, in one line naming both, runs whose
fingerprints differ from each other or from the kept runs their table shows (so does the report
for a store that holds such runs); a ``--collect`` folder that does not exist is refused too.
Each section names its fingerprint; runs made before fingerprints were recorded are counted as
"data fingerprint not recorded", never guessed: their data is unknown, so beside runs with a
fingerprint in one table they are refused like runs on other data.

For each experiment file (see run_simulation.py --config) it writes one section: a table with one
row per label (a method, a variant ``[methods."<label>"]`` or a grid point ``fedavg[learning-rate=
0.01]``): final and best test accuracy (mean +- std over seeds), rounds to the file's
`target-accuracy` (first round at or above it; mean over the seeds that reached it; else the
run-config key of its [run-config]), megabytes per client per round (down / up) and client compute
seconds per round (runner/results/report.py's cost columns; "n/a" for runs made before they were
recorded), the final minimum per-class accuracy (drift made visible: the class the global model has forgotten most),
the paper's number for the same cell and the seeds/rounds actually run; for a grid, the point with
the highest best accuracy per label; one table row per ordering the paper claims (the file's
`claims`, else the proposed methods against FedAvg and the paper's strongest baseline run): the
mean paired difference over seeds with its 95% t interval and a verdict holds / refuted /
undecided (runner/results/stats.py); the accuracy curves (docs/results/<name>-accuracy.png) and the clients' update
diversity per round (docs/results/<name>-drift.png).

Each row names how its settings were chosen (the tuning column, P1, P2, ... with a legend):
the tuning protocol its runs recorded (run-config ``tuning-protocol``, written by the runner's
``[tune]`` search, runner/tuning.py), else the experiment file's ``[chosen-by]`` statement
for the row (or ``all``), else "protocol not recorded". A claim is counted only between two rows
of the same, known protocol; otherwise its line shows the difference and says "not counted", and
the overview counts it apart; so is a claim between rows whose values a search chose on the test
split (a [chosen-by] statement beginning "searched on the test split": the protocol never looks at
the test split). A not-counted claim's verdicts read "(holds if counted)", never as a verdict. A
tuned row whose choice is the lowest or highest value of its grid is listed under the tuning record
(the search did not bracket it). A tuning record (``tuning.json``, copied by ``--collect``) is shown
beside the table: the choice and every grid point's score on the validation split.

The paper's number is compared with our best accuracy when the experiment's `paper` entry says
the table reports the best accuracy (FedPGVC), else with our final accuracy; the claims use the
same metric.
Methods or experiments without finished runs are listed as "not run yet"; no number is made up.

Beside it, the same command writes the results atlas, docs/atlas.md with docs/results/atlas.png
(``runner/results/atlas.py``): every method's rank, accuracy and claim verdicts across the files,
grouped by kind of skew and model, from the rows and claim tests the sections show (``atlas_file``),
each column with its budget as a fraction of its paper's (``budget_fraction``) and its seeds, and
rows identical by design (``runner/results/design.py``) folded into one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fl_app.api import RunRecord, as_read_now  # noqa: E402
from fl_app.config import ConfigError  # noqa: E402
from fl_app.registry import method_names, spec, validate_config  # noqa: E402
from runner.experiment import read_experiment  # noqa: E402
from runner.plan import check_axes, grid_points, label, resolve_rows, row_axes, run_name  # noqa: E402
from runner.results.atlas import AtlasFile, Entry, Verdict, write_atlas  # noqa: E402
from runner.results.clientmix import LABEL_COUNTS_FILE, PER_CLASS_FILE, client_mix_columns, run_label_counts  # noqa: E402
from runner.results.design import identical_rows  # noqa: E402
from runner.results.fingerprint import data_line, fingerprint_of, mixed_data  # noqa: E402
from runner.results.records import Run, as_records  # noqa: E402
from runner.results.report import (  # noqa: E402
    CLIENT_HEADERS,
    LOST_UPDATES,
    TAIL_KEY,
    TAIL_ROUNDS,
    accuracy_by_seed,
    client_cells,
    client_columns,
    client_failures,
    client_views,
    compute_cell,
    cost_columns,
    diverged_cell,
    diverged_runs,
    drift_columns,
    mb_cell,
    mean_std,
    plot,
    plot_drift,
    read_summary,
    rounds_to_target,
)
from runner.results.stats import (  # noqa: E402
    HOLDS,
    REFUTED,
    UNDECIDED,
    Claim,
    Paired,
    fmt_paired,
    paired_difference,
    parse_claims,
)
from runner.results.store import StoreError, discard, missing_folders, stage_run, swap_in  # noqa: E402
from runner.tuning import (  # noqa: E402
    TUNING_FILE,
    apply_choice,
    comparable,
    edge_choices,
    read_tuning,
    row_protocol,
    tuning_lines,
)

STORE = ROOT / "docs" / "results" / "runs"
MACHINE_PATHS = ("data-dir", "results-dir")  # config keys that name folders of the machine that ran

# The papers' own methods; every other strategy of an experiment is a baseline.
PROPOSED = ("ri-fedavg", "fedpgvc", "fedsol", "fedgam", "fedgam-cv")
NOT_RUN = "not run yet"


def load_experiments(folder: Path) -> list[tuple[Path, dict]]:
    """Experiment files in the order of PROPOSED (by the first proposed method each runs;
    experiments without one last), then by name."""
    exps = [(p, read_experiment(p)) for p in Path(folder).glob("*.toml")]

    def order(item: tuple[Path, dict]) -> tuple[int, str]:
        ranks = [PROPOSED.index(m) for m in item[1].get("strategies", []) if m in PROPOSED]
        return (min(ranks, default=len(PROPOSED)), item[1].get("name", item[0].stem))

    return sorted(exps, key=order)


def experiment_rows(exp: dict) -> list[tuple[str, str, str]]:
    """(row label, listed name, method) per row of the experiment, in the runner's order:
    every listed name (method or variant) times the points of its grid (``runner.plan.row_axes``:
    the file's [grid] keys that its method reads, then its own)."""
    rows = []
    file_grid = check_axes(exp.get("grid", {}), "[grid]")
    for name, strategy, _keys, grid in resolve_rows(list(exp.get("strategies", [])), exp.get("methods", {}),
                                                   method_names()):
        for point in grid_points(row_axes(strategy, file_grid, grid)):
            rows.append((label(name, point), name, strategy))
    return rows


def runs_folder(results: Path, name: str) -> Path:
    """The store's <results>/<name>, or the runner's layout <results>/<name>/runs."""
    runner = Path(results) / name / "runs"
    return runner if runner.is_dir() else Path(results) / name


def run_dirs(runs: Path, row_label: str) -> list[Path]:
    """Finished runs of one row: <runs>/<run_name(row, seed)> holding a summary.json."""
    stem = run_name(row_label, 0)[: -len("0")]
    pattern = re.compile(rf"^{re.escape(stem)}(\d+)$")
    found = [d for d in Path(runs).glob(f"{stem}*") if d.is_dir() and pattern.match(d.name)]
    found.sort(key=lambda d: int(pattern.match(d.name).group(1)))
    return [d for d in found if read_summary(d) is not None]


def expected_runs(exp: dict) -> dict[str, dict]:
    """Run folder name -> the settings the experiment file fixes for that (row, seed): its
    [run-config], the row's [methods.<label>] keys and grid point, strategy, seed, and
    ``clients`` (the number of partitions), validated as the runner validates them."""
    out = {}
    for name, point, fixed in row_settings(exp):
        for seed in exp.get("seeds", [0]):
            cfg = validate_config({**fixed, "seed": seed})
            out[run_name(label(name, point), seed)] = {
                **{k: cfg[k] for k in [*fixed, "seed"]}, "clients": exp.get("clients", 10)}
    return out


def row_settings(exp: dict) -> list[tuple[str, dict, dict]]:
    """(listed name, grid point, the settings the file fixes for it) per row, in the runner's
    order: the file's [run-config] (machine paths left out), the row's [methods.<label>] keys,
    its grid point and its strategy."""
    base = {k: v for k, v in exp.get("run-config", {}).items() if k not in MACHINE_PATHS}
    file_grid = check_axes(exp.get("grid", {}), "[grid]")
    return [(name, point, {**base, **keys, **point, "strategy": strategy})
            for name, strategy, keys, grid in resolve_rows(list(exp.get("strategies", [])), exp.get("methods", {}),
                                                           method_names())
            for point in grid_points(row_axes(strategy, file_grid, grid))]


def recorded_setting(summary: dict) -> dict:
    """The settings a finished run recorded, in the terms of ``expected_runs``: its config plus
    ``clients`` (the number of partitions)."""
    config = summary.get("config", {})
    return {**config, "clients": summary.get("num_clients") or config.get("min-available-clients")}


def setting_problems(run_dir: Path, summary: dict, expected: dict[str, dict], source: Path) -> list[str]:
    """How a finished run differs from what its experiment file fixes (empty: it matches); an
    untrained run (``fl_app/server/recording.py``) is refused too: its accuracy is the initial model's."""
    where = f"{source}: run {run_dir.name}"
    if run_dir.name not in expected:
        return [f"{where} is not a (row, seed) of the experiment file (expected one of {sorted(expected)})"]
    if summary.get("untrained"):
        return [f"{where} is untrained (no round used a client update, see rounds_without_update): not a result"]
    recorded = recorded_setting(summary)
    return [f"{where}: {key} = {recorded.get(key, '<not recorded>')!r}, the experiment file fixes {want!r}"
            for key, want in expected[run_dir.name].items() if recorded.get(key) != want]


def earlier_setting(summary: dict, want: dict) -> str | None:
    """The keys a kept run recorded with another value than the experiment file now fixes, as
    "key = recorded, the file fixes want" joined by "; "; None when the run matches. A run's
    whole recorded config (``num-server-rounds`` among it) is read as the runner reads it
    (``fl_app.api.as_read_now``: a key added since the run takes its default, the behaviour
    before it existed), so a file that now sets a new key, as ``local-clip-norm = 10``, never
    shows the older runs as its result. A key not recorded is not compared in a record that
    is not a whole config (hand-written ones); the seed is not a setting."""
    config = summary.get("config", {})
    recorded = recorded_setting(summary)
    if "num-server-rounds" in config:
        recorded = {**recorded, **as_read_now(config)}
    differ = [f"{key} = {recorded[key]!r}{' (not a key then)' if key not in config and key in spec() else ''}, "
              f"the file fixes {value!r}" for key, value in want.items()
              if key != "seed" and recorded.get(key) is not None and recorded[key] != value]
    return "; ".join(differ) or None


class KeptRuns(NamedTuple):
    """The finished runs one section shows, per row, and how many were left out.

    A section never mixes settings: when some kept runs match the experiment file (its rounds,
    epochs, partition, ...) it shows only those and counts the others as ``left_out``; when none
    match yet (the file's budget was raised and not re-run) it shows the earlier runs, with
    ``shows_earlier`` set so the section says so."""

    dirs: dict[str, list[RunRecord]]  # each row's runs, every folder read once (``as_records``)
    current: int
    left_out: int
    shows_earlier: bool
    example: str
    tuning: dict | None = None  # the experiment's tuning record (<results>/<name>/tuning.json), if any


def kept_runs(path: Path, exp: dict, results: Path) -> KeptRuns:
    runs = runs_folder(results, exp.get("name", path.stem))
    tuning = read_tuning(Path(results) / exp.get("name", path.stem))  # the tuned rows' chosen values
    expected = expected_runs(apply_choice(exp, tuning))
    seeds = exp.get("seeds", [0])
    found, current, example = {}, {}, ""
    for row, _, _ in experiment_rows(exp):
        found[row] = as_records(run_dirs(runs, row))
        want = expected.get(run_name(row, seeds[0]), {})
        current[row] = []
        for d in found[row]:
            why = earlier_setting(d.summary, want)
            if why is None:
                current[row].append(d)
            else:
                example = example or why
    n_found, n_current = (sum(len(v) for v in x.values()) for x in (found, current))
    if n_current or not n_found:
        return KeptRuns(current, n_current, n_found - n_current, False, example, tuning)
    return KeptRuns(found, 0, n_found, True, example, tuning)


def collect(source: Path, store: Path, experiments: list[tuple[Path, dict]]) -> list[str]:
    """Copy the finished runs of the experiments from the runner's folder into the store
    (metrics.csv and summary.json; machine paths blanked). Returns the runs copied.

    Every finished run is checked first against its experiment file (``setting_problems``):
    if any was made with another setting (fewer rounds or clients, another seed, a key the file
    fixes changed on the command line), nothing is copied and ``ConfigError`` names each run,
    key and both values, so one table never mixes two settings. Nor two data sets
    (``collect_mixes_data``): runs whose data fingerprints differ are refused in one line naming
    both. A ``source`` that is not a folder is refused before anything is read or written."""
    if not Path(source).is_dir():
        raise ConfigError(f"--collect {source}: no such folder (it must be the runner's results/experiments,"
                          " holding <experiment name>/runs/<row>-seed<N>/)")
    found, problems = [], []
    for path, exp in experiments:
        name = exp.get("name", path.stem)
        runs = Path(source) / name / "runs"
        expected = expected_runs(apply_choice(exp, read_tuning(Path(source) / name)))
        for d in sorted(runs.glob("*")) if runs.is_dir() else []:
            try:
                summary = read_summary(d)
            except ValueError as exc:  # a corrupt summary.json: not a run to keep, said in one line
                problems.append(f"{path}: run {d.name}: summary.json is not readable JSON ({exc})")
                continue
            if summary is not None:
                problems += setting_problems(d, summary, expected, path)
                found.append((name, d, summary))
    if problems:
        raise ConfigError(f"--collect refused: {len(problems)} finished run(s) differ from their experiment file"
                          " (re-run them with the file's settings, or leave them out of --collect's folder):\n  "
                          + "\n  ".join(problems))
    mixed = collect_mixes_data(found, store, experiments)
    if mixed:
        raise ConfigError(f"--collect refused: {mixed}; one table never mixes two data sets (re-run them on"
                          " one data set, or leave the others out of --collect's folder)")
    return put_in_store(source, store, experiments, found)


def put_in_store(source: Path, store: Path, experiments: list[tuple[Path, dict]],
                 found: list[tuple[str, Path, dict]]) -> list[str]:
    """Every checked run of ``found`` (and each experiment's tuning record) into the store,
    never losing a kept run (``runner/results/store.py``): all new copies are staged beside the
    old ones and checked first; a failure there removes them and raises ``StoreError`` (the
    store byte-identical); then each is swapped in by renames. Returns the runs copied."""
    staged, made = [], []
    try:
        for name, d, summary in found:
            parent = Path(store) / name
            made += [p for p in missing_folders(parent) if p not in made]
            staged.append(stage_run(parent, d.name, lambda folder, d=d, s=summary: store_copy(d, s, folder),
                                    summary))
        tunings = [(stage_tuning(Path(source) / name, Path(store) / name, made), Path(store) / name / TUNING_FILE)
                   for name in {exp.get("name", path.stem) for path, exp in experiments}
                   if (Path(source) / name / TUNING_FILE).is_file()]
    except (StoreError, OSError) as exc:
        discard(staged, made)
        why = exc if isinstance(exc, StoreError) else f"{exc.strerror or exc}: {exc.filename}"
        raise ConfigError(f"--collect refused: {why}; nothing in {store} was changed") from None
    for tmp, target in tunings:  # the tuning record beside the runs it chose for (runner/tuning.py)
        os.replace(tmp, target)
    for (name, d, _), new in zip(found, staged):
        swap_in(new, Path(store) / name / d.name)
    return [f"{name}/{d.name}" for name, d, _ in found]


def store_copy(d: Path, summary: dict, folder: Path) -> None:
    """The store's copy of finished run ``d`` written into ``folder``: its metrics.csv, the
    per-class accuracies and the clients' label counts when it has them, and its summary with
    the machine's paths blanked."""
    shutil.copy2(d / "metrics.csv", folder / "metrics.csv")
    if (d / PER_CLASS_FILE).exists():  # the clients' label-mix view (runner/results/clientmix.py)
        shutil.copy2(d / PER_CLASS_FILE, folder / PER_CLASS_FILE)
        counts = run_label_counts(d, compute=True)
        if counts is not None:
            shutil.copy2(d / LABEL_COUNTS_FILE, folder / LABEL_COUNTS_FILE)
    kept = json.loads(json.dumps(summary))  # a copy: the source's record is not altered
    for key in MACHINE_PATHS:
        if key in kept.get("config", {}):
            kept["config"][key] = ""
    kept.pop("data_source", None)
    (folder / "summary.json").write_text(json.dumps(kept, indent=1) + "\n")


def stage_tuning(source: Path, parent: Path, made: list[Path]) -> Path:
    """A copy of ``source``'s tuning record in a temporary file of ``parent`` (moved into place
    once every run is staged)."""
    made += [p for p in missing_folders(parent) if p not in made]
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{TUNING_FILE}.incoming-{os.getpid()}"
    try:
        shutil.copy2(source / TUNING_FILE, tmp)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def collect_mixes_data(found: list[tuple[str, Path, dict]], store: Path,
                       experiments: list[tuple[Path, dict]]) -> str | None:
    """One line naming two data fingerprints that a collect would put into one table, else
    None: per experiment, its incoming runs and the kept runs of the store that its table would
    show beside them (those of the file's current setting that are not replaced). Runs without
    a fingerprint count as data unknown: beside runs with one they are refused too
    (``runner/results/fingerprint.py``)."""
    for path, exp in experiments:
        name = exp.get("name", path.stem)
        incoming = [(f"{name}/{d.name}", fingerprint_of(summary)) for n, d, summary in found if n == name]
        if not incoming:
            continue
        kept = kept_runs(path, exp, store)
        replaced = {run for run, _ in incoming}
        beside = [] if kept.shows_earlier else [
            (f"{name}/{d.name} (kept)", fingerprint_of(d.summary)) for dirs in kept.dirs.values() for d in dirs
            if f"{name}/{d.name}" not in replaced]
        mixed = mixed_data(incoming + beside)
        if mixed:
            return f"experiment {name}: {mixed}"
    return None


def table_mixes_data(name: str, kept: KeptRuns) -> str | None:
    """One line naming two data fingerprints among the runs one section would show, else None."""
    mixed = mixed_data((d.name, fingerprint_of(d.summary)) for dirs in kept.dirs.values() for d in dirs)
    return f"experiment {name}: {mixed}" if mixed else None


def method_row(method: str, dirs: list[Run], target: float | None, paper_value: float | None) -> dict:
    dirs = as_records(dirs)
    summaries = [d.summary for d in dirs]
    drift = drift_columns(dirs) if dirs else {}
    final = mean_std([s["final_accuracy"] for s in summaries])
    best = mean_std([s["best_accuracy"] for s in summaries])
    reached = [r for r in (rounds_to_target(d.metrics, target) for d in dirs) if r is not None] if target else []
    stopped = [(d.name, s["stopped"]) for d, s in zip(dirs, summaries) if s.get("stopped")]
    return {
        "method": method, "seeds": len(summaries),
        "rounds": sorted({int(s["rounds"]) for s in summaries}),
        "final": final, "best": best,
        "reached": reached, "paper": paper_value, "stopped": stopped,
        "diverged": diverged_runs(dirs) if dirs else [],
        "min_class": (drift.get("final_min_class_accuracy_mean", math.nan),
                      drift.get("final_min_class_accuracy_std", math.nan)),
        **(client_columns(dirs) if dirs else {}),
        **(client_mix_columns(dirs) if dirs else {}),
        **(cost_columns(dirs) if dirs else {}),  # MB and client compute per round (runner/results/report.py)
    }


def fmt_acc(ms: tuple[float, float], seeds: int = 2) -> str:
    """'mean ± std', or the mean alone for one seed (n=1 has no spread to show)."""
    mean, std = ms
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.4f}" if seeds < 2 else f"{mean:.4f} ± {std:.4f}"


def fmt_rounds_to_target(row: dict) -> str:
    if row["seeds"] == 0:
        return NOT_RUN
    if not row["reached"]:
        return "not reached"
    mean = sum(row["reached"]) / len(row["reached"])
    if len(row["reached"]) == row["seeds"]:
        return f"{mean:.1f}"
    return f"{mean:.1f} ({len(row['reached'])}/{row['seeds']} seeds)"


def uses_best(exp: dict) -> bool:
    return "best" in str(exp.get("paper", "")).lower()


def experiment_claims(exp: dict, rows: list[str]) -> list[Claim]:
    """The experiment's ``claims`` (``"A > B (source)"``, runner.results.stats.parse_claims); without
    them, the orderings its ``paper-results`` imply: each proposed method against FedAvg and
    against the strongest baseline of the paper's table among the rows run, in the paper's
    direction (source: the paper's two numbers). A grid without ``claims`` is a search: it
    claims nothing."""
    if "claims" in exp:
        return parse_claims(exp["claims"], rows)
    if exp.get("grid"):
        return []
    paper = exp.get("paper-results", {})
    names = [m for m in exp.get("strategies", []) if m in paper and m in rows]
    strongest = max((m for m in names if m not in PROPOSED), key=lambda m: paper[m], default=None)
    derived = []
    for p in (m for m in names if m in PROPOSED):
        for b in dict.fromkeys(b for b in ("fedavg", strongest) if b in names and b != p):
            rel = ">" if paper[p] >= paper[b] else "<"
            derived.append(f"{p} {rel} {b} (paper-results: {paper[p]:.4f} vs {paper[b]:.4f})")
    return parse_claims(derived, rows)


def claim_tests(exp: dict, dirs: dict[str, list[Path]]) -> list[tuple[Claim, Paired | None, Paired | None, str]]:
    """Each claimed ordering with its paired difference (better - worse, per seed) on the metric
    the paper reports and on the mean of the last TAIL_ROUNDS rounds, and why it is not counted
    ("" when it is: ``why_not_counted``); (claim, None, None, "") when a side has no finished run.
    The one place a verdict is computed: the section's claims table and the overview's counts
    both read it."""
    key = "best" if uses_best(exp) else "final"
    protocols = row_protocols(exp, dirs)
    tests = []
    for c in experiment_claims(exp, list(dirs)):
        a, b = (accuracy_by_seed(dirs[m], f"{key}_accuracy") for m in (c.better, c.worse))
        if not a or not b:
            tests.append((c, None, None, ""))
            continue
        tail = paired_difference(*(accuracy_by_seed(dirs[m], TAIL_KEY) for m in (c.better, c.worse)))
        tests.append((c, paired_difference(a, b), tail, why_not_counted(c, protocols[c.better], protocols[c.worse])))
    return tests


NOT_COUNTED = "not counted"
# A [chosen-by] statement that begins so names values picked by their test accuracy: a search that
# saw the test split, which the tuning protocol forbids (choose on a validation split, never
# the test split), so its rows are shown but decide no claim, however alike they were searched.
TEST_SPLIT_SEARCH = "searched on the test split"


def why_not_counted(claim: Claim, better: str, worse: str) -> str:
    """Why a claim between rows chosen by the protocols ``better`` and ``worse`` is not counted
    ("not counted: ..."), or "" when it is: only between rows of one known protocol
    (``runner.tuning.comparable``) that did not choose on the test split."""
    if not comparable(better, worse):
        return (f"{NOT_COUNTED}: {claim.better} and {claim.worse} were tuned differently" if better != worse else
                f"{NOT_COUNTED}: how the rows were tuned is not recorded")
    if better.startswith(TEST_SPLIT_SEARCH):
        return f"{NOT_COUNTED}: the rows' values were chosen on the test split"
    return ""


def row_protocols(exp: dict, dirs: dict[str, list[Path]]) -> dict[str, str]:
    """Row label -> how its settings were chosen (``runner.tuning.row_protocol``: the
    protocol its runs recorded, else the file's [chosen-by], else "protocol not recorded")."""
    names = {row: name for row, name, _ in experiment_rows(exp)}
    return {row: row_protocol(exp, names.get(row, row), d) for row, d in dirs.items()}


def protocol_legend(protocols: dict[str, str], labels: list[str]) -> tuple[dict[str, str], list[str]]:
    """Short names (P1, P2, ...) for the protocols of the shown rows, in order of first use, and
    the legend lines; a claim is counted only between rows of one protocol."""
    short: dict[str, str] = {}
    for row in labels:
        short.setdefault(protocols[row], f"P{len(short) + 1}")
    if not short:
        return {}, []
    lines = ["How each row's settings were chosen (the tuning column; a claim is counted only between rows of "
             "the same protocol, never one whose protocol is not recorded or whose values were chosen on the test "
             "split):", ""]
    lines += [f"- {p}: {text}" for text, p in short.items()]
    return {row: short[protocols[row]] for row in labels}, lines + [""]


def edge_lines(record: dict | None) -> list[str]:
    """The tuned rows whose choice is at the edge of its grid (``runner.tuning.edge_choices``),
    as a warning list under the section's tuning lines; nothing when every choice is inside."""
    lines = [f"- {line}" for line in edge_choices(record)]
    if not lines:
        return []
    return (["**Choices at the edge of their grid** (the search did not bracket them: a better value may lie "
             "outside; widen the file's [tune] grid past it and run the search again):", ""] + lines + [""])


def claims_decided(exp: dict, dirs: dict[str, list[Path]]) -> str:
    """The overview's count of verdicts on the paper's metric ("2 holds, 1 refuted, 3 undecided"),
    claims without runs counted apart; "-" when the experiment claims nothing (a search)."""
    tests = claim_tests(exp, dirs)
    if not tests:
        return "-"
    counts = Counter(NOT_COUNTED if why else d.verdict if d is not None else NOT_RUN for _, d, _, why in tests)
    order = (HOLDS, REFUTED, UNDECIDED, NOT_COUNTED, NOT_RUN)
    return ", ".join(f"{counts[v]} {v}" for v in order if counts[v])


def claim_lines(exp: dict, dirs: dict[str, list[Path]]) -> list[str]:
    """One table row per claimed ordering: the paired difference (better - worse, per seed, on
    the metric the paper reports) with its 95% t interval over seeds and the verdict."""
    tests = claim_tests(exp, dirs)
    if not tests:
        return []
    key = "best" if uses_best(exp) else "final"
    paper = exp.get("paper-results", {})
    short, _ = protocol_legend(row_protocols(exp, dirs), list(dirs))  # the results table's P1, P2, ...
    lines = [f"Claimed orderings ({key} accuracy, paired by seed: same partition and client sampling; mean "
             "difference better − worse with its 95% Student t interval over seeds; `holds` = interval above "
             "0, `refuted` = below 0, `undecided` = contains 0 or fewer than 2 paired seeds; `not counted` = "
             "the two rows were not tuned by one known protocol, or their values were chosen on the test split, see the "
             "tuning column). The verdict is "
             f"on the paper's metric; the column after it is the same test on each run's mean accuracy over "
             f"its last {TAIL_ROUNDS} rounds, which tells an ordering lost in one round's swing from one that "
             "is not there:", "",
             f"| claim | source | paper | difference here [95% CI] | paired seeds | verdict "
             f"| last {TAIL_ROUNDS} rounds [95% CI] | tuning (better / worse) |",
             "|---|---|---|---|---|---|---|---|"]
    for c, d, t, why in tests:
        if c.better in paper and c.worse in paper:
            pv = f"{paper[c.better] - paper[c.worse]:+.4f}"
        else:
            pv = "-"
        tuning = f"{short.get(c.better, '-')} / {short.get(c.worse, '-')}"
        if d is None:
            lines.append(f"| {c.text()} | {c.source or '-'} | {pv} | {NOT_RUN} | 0 | {NOT_RUN} | - | {tuning} |")
            continue
        tail = "-" if not t.n else f"{fmt_paired(t)} ({t.verdict} if counted)" if why else f"{fmt_paired(t)} {t.verdict}"
        verdict = f"{why} ({d.verdict} if counted)" if why else f"**{d.verdict}**"
        lines.append(f"| {c.text()} | {c.source or '-'} | {pv} | {fmt_paired(d)} | {d.n} | {verdict} "
                     f"| {tail} | {tuning} |")
    return lines + [""]


def section_rows(exp: dict, kept: KeptRuns) -> dict[str, dict]:
    """Row label -> its results-table row (``method_row``) over the runs the section shows: read
    once, for the section and the atlas."""
    paper = exp.get("paper-results", {})
    return {row: method_row(row, kept.dirs[row], experiment_target(exp), paper.get(row))
            for row, _, _ in experiment_rows(exp)}


def section(path: Path, exp: dict, kept: KeptRuns, figures: Path, md_dir: Path,
            rows: dict[str, dict] | None = None) -> list[str]:
    name = exp.get("name", path.stem)
    lines = section_header(path, exp)
    table = experiment_rows(exp)
    labels = [row for row, _, _ in table]
    dirs = kept.dirs
    if not any(dirs.values()):
        earlier = [f"Findings: {exp['findings']}", ""] if exp.get("findings") else []
        return lines + [f"**{NOT_RUN}.**", ""] + earlier
    if kept.shows_earlier:
        lines += [f"**Earlier setting.** All {kept.left_out} kept runs were made with an earlier setting of this "
                  f"file (e.g. {kept.example}): the tables below show them until the file's setting is run; "
                  "they are not a result of the plan above.", ""]
    elif kept.left_out:
        lines += [f"Left out: {kept.left_out} kept runs made with an earlier setting of this file (e.g. "
                  f"{kept.example}); a section never mixes two settings, and re-running the file replaces "
                  "them.", ""]
    rows = section_rows(exp, kept) if rows is None else rows
    short, legend = protocol_legend(row_protocols(exp, dirs), labels)
    for row in labels:
        rows[row]["tuning"] = short[row]
    lines += provenance_line([d for row in labels for d in dirs[row]])
    lines += data_line((d.name, fingerprint_of(d.summary)) for row in labels for d in dirs[row])
    lines += results_table(exp, table, rows)
    lines += legend + tuning_lines(kept.tuning) + edge_lines(kept.tuning)
    lines += grid_winners(table, rows)
    stops = [f"- {run}: {why}" for m in labels if rows[m]["seeds"] for run, why in rows[m]["stopped"]]
    if stops:
        lines += ["Runs stopped before their last round (final accuracy = the last round reached; a "
                  "round where too few clients return a finite update stops the run, see "
                  "`min-fit-fraction`):", ""] + stops + [""]
    diverged = [f"- {row}: {text}" for row in labels for text in rows[row]["diverged"]]
    if diverged:
        lines += ["Runs that diverged (training loss or a method's state norm past its bound, or accuracy back at "
                  "chance after clearly exceeding it: `fl_app/common/divergence.py`; their final accuracy is a "
                  "blow-up, most often a step size too big for the method, not its level):", ""] + diverged + [""]
    failed = [f"- {row}: {text}" for row in labels for text in client_failures(dirs[row])]
    if failed:
        lines += [f"Runs in which sampled clients' updates were lost ({LOST_UPDATES}):", ""] + failed + [""]
    lines += claim_lines(exp, dirs)
    if exp.get("findings"):  # written by whoever ran the config: causes, extra runs
        lines += [f"Findings: {exp['findings']}", ""]
    png = Path(figures) / f"{name}-accuracy.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    if plot({m: d for m, d in dirs.items() if d}, "test_accuracy", "test accuracy (mean over seeds)", png,
            title=name):
        lines += [f"![{name} accuracy]({_rel(png, md_dir)})", ""]
    lines += drift_figure(name, dirs, figures, md_dir)
    return lines


def budget(exp: dict) -> float:
    """Training budget of an experiment: rounds x local epochs x participation (fraction-fit),
    summed over its grid points (the file's [run-config] with each point of its [grid]).

    It counts passes over the training split: a round's clients (fraction-fit x N) each train
    local-epochs passes over their partition (1/N of the split on average), so a round is
    fraction-fit x local-epochs passes, whatever N is. Every file trains on its whole training
    split (no key subsamples it), so this is the share of the training the papers' numbers
    were reached with, the model's size apart (``budget_fraction``)."""
    rc = exp.get("run-config", {})
    total = 0.0
    for point in grid_points(check_axes(exp.get("grid", {}), "[grid]")):
        cfg = {**rc, **point}
        total += cfg.get("num-server-rounds", 3) * cfg.get("local-epochs", 1) * cfg.get("fraction-fit", 0.5)
    return total


def paper_setting(path: Path) -> Path | None:
    """The paper's own setting of experiment file ``path``: experiments/paper/<file name> beside
    it (else the repository's); None when there is none."""
    for paper_file in (Path(path).parent / "paper" / Path(path).name, ROOT / "experiments" / "paper" / Path(path).name):
        if paper_file.is_file():
            return paper_file
    return None


def budget_fraction(path: Path, exp: dict) -> float | None:
    """The file's ``budget`` over its paper setting's (``paper_setting``); None without one."""
    paper_file = paper_setting(path)
    return None if paper_file is None else budget(exp) / budget(read_experiment(paper_file))


def budget_line(path: Path, exp: dict) -> list[str]:
    """'Budget: x of the paper's' from the paper's own setting, experiments/paper/<file name>."""
    paper_file = paper_setting(path)
    if paper_file is None:
        return []
    paper = read_experiment(paper_file)
    ours, theirs = budget(exp), budget(paper)
    seeds = f"; seeds {len(exp.get('seeds', [0]))} (paper file: {len(paper.get('seeds', [0]))})"
    return [f"Budget (rounds x local epochs x participation): {ours:g} against the paper's {theirs:g} "
            f"(`{_display_path(paper_file).as_posix()}`), **{ours / theirs:.3g} of the paper's**{seeds}.", ""]


def section_header(path: Path, exp: dict) -> list[str]:
    """Title, the paper's cell, description, reduction, the budget as a fraction of the
    paper's (``budget_line``) and the planned runs of one experiment."""
    rc = exp.get("run-config", {})
    lines = [f"## {exp.get('name', path.stem)}", "", f"Paper: {exp.get('paper', '?')}", ""]
    if exp.get("description"):
        lines += [exp["description"], ""]
    if exp.get("reduction"):
        lines += [f"Reduction: {exp['reduction']}", ""]
    lines += budget_line(path, exp)
    return lines + [f"Config: `{path.as_posix()}`; planned {rc.get('num-server-rounds', '?')} rounds, seeds "
                    f"{exp.get('seeds', [0])}, {exp.get('clients', '?')} clients. Run with "
                    f"`FL_DATA_DIR=/path/to/data python run_simulation.py --config {path.as_posix()} --quiet`.", ""]


def short_revision(revision: str) -> str:
    """'<commit>+dirty.<digest12>' as '<commit[:7]>+dirty.<digest12>': the commit shortened,
    whatever follows it (the app package's digest of a dirty checkout) kept whole."""
    commit, plus, rest = revision.partition("+")
    return f"{commit[:7]}{plus}{rest}"


def provenance_line(dirs: list[Run]) -> list[str]:
    """Which code made the table's runs: each recorded revision (short) with its run count, and
    the runs that recorded none ("unknown": made where the commit could not be read), so a table
    whose rows or seeds come from several revisions says so (two uncommitted states of one
    commit differ by their app digest)."""
    counts = Counter(str((d.summary or {}).get("code_revision") or "unknown") for d in as_records(dirs))
    if not counts:
        return []
    named = sorted((r for r in counts if r != "unknown"), key=lambda r: -counts[r])
    parts = [f"`{short_revision(r)}` ({counts[r]} runs)" for r in named]
    if counts.get("unknown"):
        parts.append(f"not recorded ({counts['unknown']} runs: made outside a git checkout, or by a version "
                     "of the code that failed to read its revision)")
    return [f"Code that made the kept runs (git revision): {', '.join(parts)}.", ""]


def experiment_target(exp: dict) -> float | None:
    """The file's ``target-accuracy``, else its [run-config]'s (the run-config key); None if neither."""
    return exp.get("target-accuracy") or exp.get("run-config", {}).get("target-accuracy") or None


def results_table(exp: dict, table: list[tuple[str, str, str]], rows: dict[str, dict]) -> list[str]:
    """One row per label; the clients' accuracy column only when some run evaluated clients.
    The cost columns (MB per client per round, client compute per round) read 'n/a' for runs
    made before they were recorded."""
    target = experiment_target(exp)
    key = "best" if uses_best(exp) else "final"
    tt = f"rounds to {target:.0%}" if target else "rounds to target"
    views = client_views(rows.values())
    lines = [f"| method | final accuracy | best accuracy | {tt} | MB per client per round (down / up) "
             f"| client compute s per round | min-class accuracy (final) | paper ({key}) "
             "| seeds | rounds | tuning |" + "".join(f" {CLIENT_HEADERS[v]} |" for v in views),
             "|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(views)]
    for m, _, strategy in table:
        r = rows[m]
        pv = f"{r['paper']:.4f}" if r["paper"] is not None else "-"
        name_cell = f"**{m}**" if strategy in PROPOSED else m
        spread = "".join(f" {client_cells(r, v)} |" for v in views)
        if r["seeds"] == 0:
            lines.append(f"| {name_cell} | {NOT_RUN} | {NOT_RUN} | {NOT_RUN} | - | - | - | {pv} | 0 | - "
                         f"| {r.get('tuning', '-')} |{spread}")
            continue
        rounds = "/".join(str(x) for x in r["rounds"])
        final = (fmt_acc(r["final"], r["seeds"]) + (f" (stopped: {len(r['stopped'])}/{r['seeds']} seeds)" if r["stopped"]
                                                    else "") + diverged_cell(len(r["diverged"]), r["seeds"]))
        lines.append(f"| {name_cell} | {final} | {fmt_acc(r['best'], r['seeds'])} | "
                     f"{fmt_rounds_to_target(r)} | {mb_cell(r)} | {compute_cell(r)} | "
                     f"{fmt_acc(r['min_class'], r['seeds'])} | {pv} | {r['seeds']} | {rounds} "
                     f"| {r.get('tuning', '-')} |" + spread)
    return lines + [""]


def grid_winners(table: list[tuple[str, str, str]], rows: dict[str, dict]) -> list[str]:
    """For each listed name with several grid points: the point with the highest best accuracy
    (mean over its seeds), the selection rule of the experiments that search a grid."""
    by_name: dict[str, list[str]] = {}
    for row, name, _ in table:
        by_name.setdefault(name, []).append(row)
    lines = []
    for name, points in by_name.items():
        ran = [p for p in points if rows[p]["seeds"] and math.isfinite(rows[p]["best"][0])]
        if len(points) < 2 or not ran:
            continue
        win = grid_choice(points, rows)
        others = ", ".join(f"{p[len(name):]} {rows[p]['best'][0]:.4f}" for p in points if p in ran and p != win)
        rest = f"; {others}" if others else ""
        lines.append(f"- {name}: **{win[len(name):]}** (best accuracy {rows[win]['best'][0]:.4f}{rest})")
    if not lines:
        return []
    return ["Chosen grid point per method (highest best accuracy):", ""] + lines + [""]


def grid_choice(points: list[str], rows: dict[str, dict]) -> str | None:
    """The row of ``points`` (one listed name's grid points) with the highest best accuracy
    (mean over its seeds), None when none ran: the point ``grid_winners`` names and the atlas shows."""
    ran = [p for p in points if rows[p]["seeds"] and math.isfinite(rows[p]["best"][0])]
    return max(ran, key=lambda p: rows[p]["best"][0]) if ran else None


def atlas_file(path: Path, exp: dict, kept: KeptRuns, rows: dict[str, dict]) -> AtlasFile:
    """The experiment file as the atlas shows it: per listed name (method or variant) the row its
    section shows (a grid's chosen point, ``grid_choice``) with the mean of the paper's metric,
    the counted claims (``claim_tests``, the sections' verdicts) between two listed names, and
    its budget as a fraction of its paper's (``budget_fraction``). Listed names identical by
    design (``runner.results.design``, from the settings the runs were made with: the file's,
    with the tuning record's choices) are one entry, named 'a = b'; a claim between two of them
    compares a row with itself and is left out."""
    name = exp.get("name", "?")
    key = "best" if uses_best(exp) else "final"
    table = experiment_rows(exp)
    same = identical_rows(row_configs(apply_choice(exp, kept.tuning)))
    folded = {member: " = ".join(group) for group in same for member in group}
    listed: dict[str, list[str]] = {}
    variants = {}
    for row, listed_name, strategy in table:
        listed.setdefault(listed_name, []).append(row)
        if listed_name != strategy:
            variants.setdefault(folded.get(listed_name, listed_name), strategy)
    config = {**{k: v.default for k, v in spec().items()}, **exp.get("run-config", {})}
    shown = any(kept.dirs.values())
    planned = len(table) * len(exp.get("seeds", [0]))
    status = (NOT_RUN if not shown else "earlier setting" if kept.shows_earlier
              else "complete" if kept.current >= planned else "partial")
    common = {"methods": tuple(dict.fromkeys(folded.get(n, n) for n in listed)), "variants": variants,
              "budget": budget_fraction(path, exp), "folded": {" = ".join(g): g for g in same}}
    if not shown:
        return AtlasFile(name, config, key, status, **common)
    entries = {}
    strategy_of = {listed_name: strategy for _, listed_name, strategy in table}
    for listed_name, points in listed.items():
        row = grid_choice(points, rows) if len(points) > 1 else points[0]
        shown_name = folded.get(listed_name, listed_name)
        if row is None or not rows[row]["seeds"] or shown_name in entries:
            continue
        mean, std = rows[row][key]
        entries[shown_name] = Entry(shown_name, strategy_of[listed_name], row, mean, std, rows[row]["seeds"],
                                    len(rows[row]["diverged"]), row[len(listed_name):].strip("[]"))
    of = {row: folded.get(listed_name, listed_name) for row, listed_name, _ in table}
    verdicts, not_counted = [], []
    for c, d, _, why in claim_tests(exp, kept.dirs):
        if d is not None and of[c.better] != of[c.worse]:
            (not_counted if why else verdicts).append(Verdict(of[c.better], of[c.worse], d.verdict, c.text()))
    return AtlasFile(name, config, key, status, entries, verdicts, not_counted, **common)


def row_configs(exp: dict) -> dict[str, list[dict]]:
    """Listed name -> the validated run config of each of its grid points (the file's first
    seed), what ``runner.results.design.identical_rows`` compares."""
    seed = exp.get("seeds", [0])[0]
    out: dict[str, list[dict]] = {}
    for name, _, fixed in row_settings(exp):
        out.setdefault(name, []).append(validate_config({**fixed, "seed": seed}))
    return out


def drift_figure(name: str, dirs: dict[str, list[Path]], figures: Path, md_dir: Path) -> list[str]:
    """The experiment's update-diversity plot (runner.results.report.plot_drift), or nothing when its
    runs predate the drift columns."""
    png = Path(figures) / f"{name}-drift.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    if not plot_drift({m: d for m, d in dirs.items() if d}, png, title=f"{name}: client update diversity"):
        return []
    return [f"![{name} update diversity]({_rel(png, md_dir)})", "",
            "Update diversity = sum_k p_k ||Delta_k||^2 / ||sum_k p_k Delta_k||^2 per round (1 = the "
            "clients' updates agree; larger = they pull apart); line: mean over seeds, band: min-max.", ""]


def _rel(path: Path, start: Path) -> str:
    import os

    return Path(os.path.relpath(Path(path).resolve(), Path(start).resolve())).as_posix()


def make_results(experiments: Path, results: Path, out: Path) -> str:
    out = Path(out)
    figures = out.parent / out.stem
    lines = ["# Reproducing the papers' comparisons", "",
             "Generated by `scripts/make_results.py` from `experiments/*.toml` and the runs kept in "
             f"`{_display_path(Path(results)).as_posix()}` (each run's per-round metrics.csv and summary.json); "
             "do not edit by hand. Accuracies are test accuracy on the full test split (fractions), mean ± std "
             "over seeds; the minimum class accuracy is the global model's accuracy on its worst class after "
             "the last round (label-skewed clients make a model forget classes; 0 = one class never predicted). "
             "Client accuracy on label mixes: each client's accuracy of the final global model on its own label "
             "mix (the per-class test accuracies weighted by the client's training label counts; "
             "`runner/results/clientmix.py`), mean, std and mean of the worst 10% over all clients, then mean "
             "over seeds: the fairness view of label skew, computed from the runs without holding data back. "
             "The runs are reduced versions of the papers' settings (each section says how), so the papers' "
             "numbers are a reference, not a target. Run time: the runs' own time (start of the ServerApp to "
             "its end, summed over runs; launching and stopping each run adds about 12 s, docs/performance.md, "
             "\"Per-client simulation, 2-core CPU\"), on the machine that made them "
             "(each summary.json names the code revision and library versions).", "",
             f"Across the files: the [results atlas]({ATLAS_PAGE}), each method's rank, accuracy and verdicts per "
             "file, grouped by kind of skew and model, in one table and one picture.", ""]
    exps = load_experiments(experiments)
    if not exps:
        lines += [f"No experiment files in `{experiments}`.", ""]
    else:
        lines += ["The claims column counts the verdicts on the paper's metric of each section's claimed "
                  "orderings (over the runs the section shows).", "",
                  "| experiment | paper | finished runs | status | claims | run time |",
                  "|---|---|---|---|---|---|"]
    kept = [kept_runs(path, exp, results) for path, exp in exps]  # read once: the overview and the sections agree
    for (path, exp), k in zip(exps, kept):  # before anything is written
        mixed = table_mixes_data(exp.get("name", path.stem), k)
        if mixed:
            raise ConfigError(f"the kept runs mix two data sets: {mixed}; one table never does (move the runs of"
                              f" one data set out of {_display_path(Path(results)).as_posix()}, or --collect runs"
                              " made on the other's data over them)")
    lines += [overview_row(path, exp, k) for (path, exp), k in zip(exps, kept)] + ([""] if exps else [])
    rows = [section_rows(exp, k) if any(k.dirs.values()) else {} for (path, exp), k in zip(exps, kept)]
    for (path, exp), k, r in zip(exps, kept, rows):
        lines += section(_display_path(path), exp, k, figures, out.parent, rows=r)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines).rstrip() + "\n"
    out.write_text(text)
    write_atlas([atlas_file(path, exp, k, r) for (path, exp), k, r in zip(exps, kept, rows)], atlas_path(out), out,
                figures / ATLAS_PICTURE)
    return text


ATLAS_PAGE, ATLAS_PICTURE = "atlas.md", "atlas.png"


def atlas_path(out: Path) -> Path:
    """The atlas page beside the results page (docs/atlas.md beside docs/results.md)."""
    return Path(out).parent / ATLAS_PAGE


def overview_row(path: Path, exp: dict, kept: KeptRuns) -> str:
    """The experiment's line of the overview: finished runs against the planned ones; runs
    made with an earlier setting of the file (``kept_runs``: e.g. fewer rounds before a budget
    was raised) are counted apart, so a raised budget shows as not complete until it is re-run;
    the claims and run time are those of the runs the section shows."""
    name = exp.get("name", path.stem)
    labels = [row for row, _, _ in experiment_rows(exp)]
    planned = len(labels) * len(exp.get("seeds", [0]))
    shown = [d for row in labels for d in kept.dirs[row]]
    status = NOT_RUN if not shown else ("complete" if kept.current >= planned else "partial")
    if kept.left_out:
        status += f" ({kept.left_out} more runs from an earlier setting)"
    cell = str(exp.get("paper", "")).split(":")[0]
    seconds = sum(d.summary.get("total_seconds") or 0 for d in shown)
    spent = f"{seconds / 60:.1f} min" if shown else "-"
    verdicts = claims_decided(exp, kept.dirs)
    return f"| [{name}](#{name}) | {cell} | {kept.current}/{planned} | {status} | {verdicts} | {spent} |"


def _display_path(path: Path) -> Path:
    try:
        return Path(path).resolve().relative_to(ROOT)
    except ValueError:
        return Path(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiments", default=str(ROOT / "experiments"), help="folder of experiment TOMLs")
    p.add_argument("--results", default=str(STORE),
                   help="folder holding <name>/<row>-seed<N>/ (or the runner's <name>/runs/<row>-seed<N>/)")
    p.add_argument("--collect", metavar="DIR",
                   help="first copy the finished runs of DIR/<name>/runs/ (the runner's results/experiments)"
                        " into --results")
    p.add_argument("--out", default=str(ROOT / "docs" / "results.md"),
                   help="markdown file; figures go to <its folder>/<its stem>/")
    args = p.parse_args(argv)
    try:
        if args.collect:
            copied = collect(Path(args.collect), Path(args.results), load_experiments(Path(args.experiments)))
            print(f"collected {len(copied)} runs into {args.results}")
        make_results(Path(args.experiments), Path(args.results), Path(args.out))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
