"""The tuning protocol: one way of choosing every row's settings of a comparison,
the same for every method of a table, so that a claim compares methods and not their tuning.

An experiment file states it in a ``[tune]`` table::

    [tune]
    seeds = [0, 1]              # the search's seeds
    budget = 0.25               # share of the table's num-server-rounds each search run trains
    metric = "last-5-mean"      # best | final | last-5-mean (validation accuracy)
    validation-fraction = 0.1   # share of the training split held out for the scores (default 0.1)
    untuned = ["fedavg-lr0.001"]  # rows kept at the file's values (labelled, claims not counted)

    [tune.grid]                 # the search grid of every row ...
    learning-rate = [0.0003, 0.001, 0.003, 0.01]

    [tune.scaffold]             # ... or a row's own (its keys replace the shared grid's)
    learning-rate = [0.01, 0.03, 0.05, 0.1, 0.2]

The runner (``run_simulation.py --config FILE``; ``--tune`` asks for it explicitly, ``--no-tune``
skips it) first runs the search through its own grid machinery (``runner/plan.py``:
each grid point a labelled row, in ``<out>/tuning/runs``), with ``validation-fraction`` set, so
the clients never train on the held-out examples and the server scores them instead of the
test split (``tasks/partitioning.py``); then it picks, per row, the grid point with the highest
mean over the search seeds of the metric (ties: the first in grid order), writes the choice and
every point's numbers to ``<out>/tuning.json`` and runs the table with the chosen values. Each
table run records the protocol (run-config ``tuning-protocol``, in its summary.json), which is
how ``scripts/make_results.py`` tells rows tuned by one protocol from rows tuned otherwise:
a claim is counted only between rows whose protocols are the same and known.

A committed record's scores are reused: tuning.json keeps, per point and seed, what
its run was made with (``runs``: the sha256 of the app package it ran, the revision, the digest
of its run config, its data fingerprint's digest and the library versions: ``made_with``). A
search whose experiment has a committed record (``docs/results/runs/<name>/tuning.json``, where
``scripts/make_results.py --collect`` puts it) launches none of the runs that record scored with
the same code, config, data and versions (``RUN_IDENTITY``, against ``identity_now``) under the
same metric: it takes their scores and says which it reused; every other run (another code,
config, fingerprint or version, or a record written before it kept ``runs``) runs again, and
the runner says why. A widened grid on a fresh checkout of the same code then runs only its new
points.

Why ``last-5-mean`` is the metric of the FedPGVC files: the best round of a short search rewards
a rate that peaks early and then swings (fedpgvc-mnist-dir05-lr-search chose FedPGVC's Adam
0.01 on its best round; at 100 rounds that rate fell a point below its running best in 60-79
rounds); the mean of the last rounds of the search scores the rate that is still good at the
end of the budget, and is less at the mercy of one round than the final accuracy.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_app.config import ConfigError, did_you_mean
from fl_app.registry import method_names, spec
from runner.plan import check_distinct, check_keys_read, check_read_by_some, grid_points, label, row_axes, run_name
from runner.results.records import as_record, as_records
from runner.results.report import LOST_UPDATES, client_failures, diverged_runs, tail_accuracy

METRICS = ("best", "final", "last-5-mean")
TUNING_FILE = "tuning.json"
SEARCH_FOLDER = "tuning"
DEFAULT_VALIDATION = 0.1
PROTOCOL_ENTRIES = ("seeds", "budget", "metric", "validation-fraction", "untuned", "grid")
# keys the protocol sets for every search run itself: never a grid axis
SET_BY_PROTOCOL = ("num-server-rounds", "validation-fraction", "tuning-protocol", "strategy", "seed",
                   "run-name", "results-dir")
RUN_IDENTITY = ("code", "config", "fingerprint", "versions")  # what must match for a recorded score to be reused
APP_DIGEST_FILE = "app.sha256"  # in each run folder: the sha256 of the app package it ran (runner/sweep.py)
COMMITTED = Path("docs") / "results" / "runs"  # the committed records: <checkout>/docs/results/runs/<name>/tuning.json
MACHINE_KEYS = ("results-dir", "run-name", "data-dir", "resume")  # a run's config keys that say nothing of its numbers
NOT_RECORDED = "protocol not recorded"
NOT_TUNED = "not tuned (listed in [tune] untuned)"


@dataclass(frozen=True)
class Protocol:
    """A checked ``[tune]`` table: the search's seeds, budget (share of the rounds), metric,
    validation share, and per tuned row its grid (axes: run-config key -> values)."""

    seeds: tuple[int, ...]
    budget: float
    metric: str
    validation_fraction: float
    grids: dict[str, dict[str, list]] = field(default_factory=dict)
    untuned: tuple[str, ...] = ()

    def search_rounds(self, rounds: int) -> int:
        """Rounds of each search run: the budget's share of the table's, at least one."""
        return max(1, round(self.budget * rounds))

    def describe(self, rounds: int) -> str:
        """The protocol in one line, recorded by every table run it tuned (run-config
        ``tuning-protocol``): two rows tuned alike record the same text. The grids are per row
        (SGD and Adam rows need other rates) and are in tuning.json, not in this text."""
        return (f"tuned on a validation split ({self.validation_fraction:g} of the training data), seeds "
                f"{' '.join(map(str, self.seeds))}, {self.search_rounds(rounds)} of {rounds} rounds "
                f"(budget {self.budget:g}), {self.metric} validation accuracy, argmax over the row's grid")


def _where(path: Any) -> str:
    return f"experiment file {path}: " if path else ""


def read_protocol(exp: dict, rows: list[str], path: Any = None) -> Protocol | None:
    """The experiment's ``[tune]`` table checked for the listed ``rows`` (labels), or None
    without one. Every problem is a one-line ``ConfigError`` naming the entry and what is valid."""
    tune = exp.get("tune")
    if tune is None:
        return None
    where = _where(path)
    if not isinstance(tune, dict):
        raise ConfigError(f"{where}[tune] must be a table, got {tune!r}")
    listed = list(exp.get("strategies", []))
    for key, value in tune.items():
        if key not in PROTOCOL_ENTRIES and not isinstance(value, dict):
            raise ConfigError(f"{where}[tune] key {key!r} is unknown; valid keys: {', '.join(PROTOCOL_ENTRIES)},"
                              f" or a table [tune.<row>] for one of the rows {', '.join(listed)}")
        if key not in PROTOCOL_ENTRIES and key not in listed:
            raise ConfigError(f"{where}[tune.{key}] names no row of the file; valid rows: {', '.join(listed)}")
    seeds, budget, metric, fraction = _scalars(tune, where)
    untuned = tune.get("untuned", [])
    if not (isinstance(untuned, list) and all(u in listed for u in untuned)):
        raise ConfigError(f"{where}[tune] untuned = {untuned!r} is invalid: must be a list of rows of the file;"
                          f" valid rows: {', '.join(listed)}")
    if exp.get("grid") or any(isinstance(m, dict) and m.get("grid") for m in exp.get("methods", {}).values()):
        raise ConfigError(f"{where}[tune] and a [grid] in one file: a grid's points are rows of the table, a"
                          " [tune] grid is searched; give the search in [tune.grid] or [tune.<row>] only")
    shared = _axes(tune.get("grid", {}), f"{where}[tune.grid]")
    grids = {}
    tuned = [(row, row_method(exp, row)) for row in rows if row not in untuned]
    known = [method for _, method in tuned if method in method_names()]
    if len(known) == len(tuned):  # (a row that names no method is refused with the rows, runner/plan.py)
        check_read_by_some(shared, known, f"{where}[tune.grid] {{key}}")
    for row, method in tuned:
        own = _axes(tune.get(row, {}), f"{where}[tune.{row}]")
        if method in method_names():
            check_keys_read(own, method, f"{where}[tune.{row}]")
            axes = row_axes(method, shared, own)  # [tune.grid]'s keys that the row's method reads, then its own
        else:
            axes = {**shared, **own}
        if not axes:
            unread = f" (method {method!r} reads none of [tune.grid]'s keys {', '.join(shared)})" if shared else ""
            raise ConfigError(f"{where}[tune] gives row {row!r} no grid{unread}: add [tune.grid] (every row) or"
                              f" [tune.{row}], or list it in untuned")
        grids[row] = axes
    return Protocol(tuple(seeds), float(budget), metric, float(fraction), grids, tuple(untuned))


def row_method(exp: dict, row: str) -> str:
    """The method of the file's row ``row``: its ``[methods.<row>]`` strategy, else the row itself."""
    entry = exp.get("methods", {}).get(row, {})
    return entry.get("strategy", row) if isinstance(entry, dict) else row


def _scalars(tune: dict, where: str) -> tuple[list[int], float, str, float]:
    """[tune]'s seeds, budget, metric and validation-fraction, each checked."""
    for key in ("seeds", "budget", "metric"):
        if key not in tune:
            raise ConfigError(f"{where}[tune] has no {key!r}; it needs seeds (e.g. [0, 1]), budget (share of the"
                              f" rounds, in (0, 1]) and metric (one of {', '.join(METRICS)})")
    seeds = tune["seeds"]
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                      for s in seeds)):
        raise ConfigError(f"{where}[tune] seeds = {seeds!r} is invalid: must be a non-empty list of integers >= 0")
    check_distinct(seeds, f"{where}[tune] seeds = {seeds!r}", "seed")
    budget = tune["budget"]
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 1:
        raise ConfigError(f"{where}[tune] budget = {budget!r} is invalid: must be a number in (0, 1] (the share"
                          " of the table's num-server-rounds each search run trains)")
    if tune["metric"] not in METRICS:
        raise ConfigError(f"{where}[tune] metric = {tune['metric']!r} is invalid; valid choices: {', '.join(METRICS)}")
    fraction = tune.get("validation-fraction", DEFAULT_VALIDATION)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 0.5:
        raise ConfigError(f"{where}[tune] validation-fraction = {fraction!r} is invalid: must be in (0, 0.5]"
                          " (the share of the training split held out for the search's scores)")
    return seeds, budget, tune["metric"], fraction


def _axes(table: Any, where: str) -> dict[str, list]:
    """A grid table: run-config keys (not one the protocol sets) to non-empty lists."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table of run-config keys to lists of values, got {table!r}")
    keys = spec()
    for key, values in table.items():
        if key not in keys:
            raise ConfigError(f"{where} key {key!r} is not a run-config key{did_you_mean(key, keys)}"
                              " (run_simulation.py --list keys)")
        if key in SET_BY_PROTOCOL:
            raise ConfigError(f"{where} key {key!r} is set by the protocol itself; searchable keys are the other"
                              " run-config keys, e.g. learning-rate")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where} {key} = {values!r} is invalid: must be a non-empty list of values")
        check_distinct(values, f"{where} {key} = {values!r}")
    return dict(table)


def search_experiment(exp: dict, protocol: Protocol, rounds: int) -> dict:
    """The experiment the search runs through the runner's grid machinery: the tuned rows,
    each with its grid as ``[methods.<row>.grid]``, the search seeds, the budget's rounds and
    the validation split; no claims (a search claims nothing)."""
    methods = {name: dict(keys) for name, keys in exp.get("methods", {}).items()}
    for row, axes in protocol.grids.items():
        methods.setdefault(row, {})["grid"] = axes
    run_config = {**exp.get("run-config", {}), "num-server-rounds": protocol.search_rounds(rounds),
                  "validation-fraction": protocol.validation_fraction}
    return {"name": f"{exp.get('name', 'experiment')}-tuning", "strategies": list(protocol.grids),
            "seeds": list(protocol.seeds), "clients": exp.get("clients", 10), "run-config": run_config,
            "methods": methods}


def run_score(run_dir: Path, metric: str) -> float | None:
    """One search run's score on the validation split: its best or final accuracy, or the
    mean over its last 5 evaluated rounds; None when it did not finish or trained nothing."""
    run = as_record(run_dir)
    summary = run.summary
    if summary is None or summary.get("rounds") == 0 or summary.get("untrained"):
        return None
    value = {"best": lambda: summary.get("best_accuracy"), "final": lambda: summary.get("final_accuracy"),
             "last-5-mean": lambda: tail_accuracy(run)}[metric]()
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def score_points(protocol: Protocol, runs_dir: Path, reused: dict | None = None) -> dict[str, list[dict]]:
    """Per tuned row, every grid point with its score per search seed and their mean (None
    unless every seed finished: a point is compared on all seeds or not at all), the runs
    in which sampled clients failed (``client_failures``: a score then comes from fewer clients),
    the runs that diverged (``diverged_runs``: ``choose`` takes such a point last), and per seed
    what its run was made with (``runs``: ``made_with``). ``reused``: run name -> a committed
    record's run (``reusable_runs``), used for a seed whose run did not finish here."""
    reused = reused or {}
    table = {}
    for row, axes in protocol.grids.items():
        points = []
        for point in grid_points(axes):
            names = [run_name(label(row, point), seed) for seed in protocol.seeds]
            dirs = as_records(Path(runs_dir) / name for name in names)
            scores, made, carried = {}, {}, {"client-failures": [], "diverged": []}
            for seed, name, d in zip(protocol.seeds, names, dirs):
                scores[seed] = run_score(d, protocol.metric)
                if scores[seed] is None and name in reused:
                    scores[seed] = reused[name]["score"]
                    made[str(seed)] = {**reused[name]["made-with"], "reused-from": reused[name]["from"]}
                    for key in carried:
                        carried[key] += reused[name][key]
                else:
                    made[str(seed)] = made_with(Path(runs_dir) / name)
            done = [s for s in scores.values() if s is not None]
            points.append({"values": point, "scores": {str(k): v for k, v in scores.items()},
                           "mean": sum(done) / len(done) if len(done) == len(scores) else None,
                           "client-failures": client_failures(dirs) + carried["client-failures"],
                           "diverged": diverged_runs(dirs) + carried["diverged"], "runs": made})
        table[row] = points
    return table


def config_digest(raw: dict) -> str:
    """The first 12 hex digits of the sha256 of a run's validated config (``validate_config``,
    as its run-config.json holds it) without the keys that name only where it ran
    (``MACHINE_KEYS``): two runs of one digest trained with the same settings."""
    from fl_app.registry import validate_config

    cfg = {k: v for k, v in validate_config(raw).items() if k not in MACHINE_KEYS}
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:12]


def made_with(run_dir: Path) -> dict:
    """What a finished search run was made with, as tuning.json records it per seed: ``code`` (the
    sha256 of the app package it ran, ``APP_DIGEST_FILE``), ``revision``, ``config``
    (``config_digest`` of its run-config.json), ``fingerprint`` (its data fingerprint's digest) and
    ``versions`` (python, flwr, torch, ...); an entry it did not record is None (never reused)."""
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    try:
        code = (run_dir / APP_DIGEST_FILE).read_text().strip() or None
    except OSError:
        code = None
    try:
        config = config_digest(json.loads((run_dir / "run-config.json").read_text()))
    except (OSError, ValueError, ConfigError):
        config = None
    fingerprint = summary.get("data_fingerprint")
    return {"code": code, "revision": summary.get("code_revision"), "config": config,
            "fingerprint": fingerprint.get("digest") if isinstance(fingerprint, dict) else None,
            "versions": summary.get("versions")}


def identity_now(raw: dict, clients: int, code: str | None) -> dict:
    """What a search run of ``raw`` would be made with now (``made_with``'s entries): ``code``
    (this sweep's app package), its config's digest, the data fingerprint of the data it would
    read and the versions installed."""
    from fl_app.api import data_fingerprint, resolve, software_versions

    cfg, _ = resolve(raw)
    return {"code": code, "config": config_digest(raw), "fingerprint": data_fingerprint(cfg, clients)["digest"],
            "versions": software_versions()}


def committed_record(root: Path, name: str) -> tuple[Path, dict | None]:
    """The committed tuning record of experiment ``name``: ``<root>/docs/results/runs/<name>/
    tuning.json``, where ``scripts/make_results.py --collect`` puts it beside the table's runs
    (``COMMITTED``); its path, and the record or None."""
    folder = Path(root) / COMMITTED / name
    try:
        return folder / TUNING_FILE, read_tuning(folder)
    except ConfigError:  # an unreadable committed record: nothing to reuse from it
        return folder / TUNING_FILE, None


def reusable_runs(record: dict | None, source: Path, protocol: Protocol, configs: list[tuple[str, int, dict]],
                  clients: int, code: str | None) -> tuple[dict, list[str]]:
    """The search runs of ``configs`` (label, seed, raw) whose score a committed tuning record
    (``record``, read from ``source``) holds for a run made with the same app code, run config,
    data fingerprint and library versions (``RUN_IDENTITY``, compared with ``identity_now``) and
    scored by the same metric: run name -> {score, made-with, from, client-failures, diverged};
    and per other run found in the record, one line of why it runs again. A record written before
    tuning.json kept what each run was made with (``runs`` per point) reuses nothing."""
    if not record:
        return {}, []
    if record.get("metric") != protocol.metric:
        return {}, [f"{source}: scored on {record.get('metric')}, this search on {protocol.metric}: nothing reused"]
    found: dict[str, tuple[dict, str]] = {}  # run name -> (the record's point, seed)
    for row, entry in record.get("rows", {}).items():
        for p in entry.get("points", []):
            for seed in p.get("scores", {}):
                found[run_name(label(row, p.get("values", {})), int(seed))] = (p, seed)
    reused, why_not = {}, []
    for _, _, raw in configs:
        name = raw["run-name"]
        if name not in found:
            continue
        point, key = found[name]
        made = (point.get("runs") or {}).get(key)
        score = (point.get("scores") or {}).get(key)
        if not made:
            why_not.append(f"{name}: no record of what its run was made with (written before tuning.json kept it)")
            continue
        if score is None:
            why_not.append(f"{name}: no score in the record (not finished)")
            continue
        now = identity_now(raw, clients, code)
        differs = [k for k in RUN_IDENTITY if made.get(k) is None or made.get(k) != now[k]]
        if differs:
            why_not.append(f"{name}: another {', '.join(differs)} than now")
            continue
        mine = lambda texts, n=name: [t for t in texts or [] if t.startswith(f"{n}:")]  # noqa: E731
        reused[name] = {"score": score, "made-with": {k: v for k, v in made.items() if k != "reused-from"},
                        "from": str(source), "client-failures": mine(point.get("client-failures")),
                        "diverged": mine(point.get("diverged"))}
    return reused, why_not


def choose(points: list[dict]) -> dict | None:
    """The values of the point with the highest mean score (the first in grid order on a tie)
    among the points none of whose search runs diverged (a point's ``diverged``); only when every
    finished point diverged, the best of those (``tuning_lines`` and the runner say so). None
    when no point finished on every seed. A diverged point is never chosen over one that did not
    diverge: a rate that blows up on one seed is not a rate to run a table with, whatever its
    mean (a search run that peaked before blowing up scores well on ``best``)."""
    done = [p for p in points if p["mean"] is not None]
    if not done:
        return None
    steady = [p for p in done if not p.get("diverged")] or done
    return max(steady, key=lambda p: p["mean"])["values"]  # max keeps the first of equal keys


def committed_reuse(args: Any, search: SearchPlan, runs: Path, code: str | None, root: Path) -> tuple[dict, list[str]]:
    """The search runs (``search.configs``, not finished in ``runs``: a run there is its own
    record) whose scores the experiment's committed record (``committed_record``: the experiment
    file's ``name``, else its file name) holds for the same app code (``code``: the sha256 of the
    app package the runs would ship), run config, data and versions (``reusable_runs``), and the
    lines that say which were reused and, each reason once, why the record's others run again."""
    from fl_app.api import read_summary

    name = (getattr(args, "experiment", None) or {}).get("name") or Path(
        getattr(args, "config", None) or "experiment").stem
    source, record = committed_record(root, name)
    if record is None:
        return {}, []
    todo = [c for c in search.configs if read_summary(Path(runs) / c[2]["run-name"]) is None]
    reused, why_not = reusable_runs(record, source, search.protocol, todo, args.clients, code)
    lines = [f"tuning: reused {len(reused)} search runs' scores from {source} (same code, config, data and"
             f" versions): {', '.join(sorted(reused))}"] if reused else []
    if why_not:  # one line, each reason once with the runs it holds (a few named)
        reasons: dict[str, list[str]] = {}
        for line in why_not:
            run, why = line.split(": ", 1)
            reasons.setdefault(why, []).append(run)
        lines.append(f"tuning: {len(why_not)} runs of {source} run again: " + "; ".join(
            f"{len(names)} with {why} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
            for why, names in reasons.items()))
    return reused, lines


def tuning_record(protocol: Protocol, rounds: int, runs_dir: Path, reused: dict | None = None) -> dict:
    """tuning.json's content: the protocol, and per row the choice and every point's numbers
    (``score_points``; ``reused``: runs whose scores come from a committed record).
    ``ConfigError`` when a row has no point that finished on every seed (the table is not run:
    a row cannot be said to be tuned without a choice)."""
    table = score_points(protocol, runs_dir, reused)
    rows, failed = {}, []
    for row, points in table.items():
        chosen = choose(points)
        if chosen is None:
            failed.append(row)
        rows[row] = {"chosen": chosen, "points": points}
    if failed:
        raise ConfigError(f"tuning chose nothing for {', '.join(failed)}: no grid point finished on every search seed"
                          f" (see {runs_dir}); widen or fix the grid and run again")
    return {"protocol": protocol.describe(rounds), "metric": protocol.metric, "seeds": list(protocol.seeds),
            "budget": protocol.budget, "rounds": rounds, "search-rounds": protocol.search_rounds(rounds),
            "validation-fraction": protocol.validation_fraction, "scored-on": "validation split",
            "untuned": list(protocol.untuned), "rows": rows}


def edge_choices(record: dict | None) -> list[str]:
    """One line per tuned row whose chosen value of a numeric axis is the lowest or highest of
    its grid (of two or more values), e.g. "fedavg: learning-rate = 0.1 is the highest value of
    its grid (0.003, 0.01, 0.03, 0.1)": the search did not bracket that choice, so a better
    value may lie outside the grid and the row is not known to be tuned as well as one chosen
    inside it. A choice at the end of what its key allows (FedRS's alpha 0, a momentum of 0:
    ``beyond_allowed``) has nothing outside it to try and is not listed. Empty when every
    choice is inside its grid or at such an end, or without a record. The runner prints these
    after its search and docs/results.md lists them (scripts/make_results.py)."""
    if not record:
        return []
    keys = spec()
    lines = []
    for row, entry in record["rows"].items():
        for key, value in (entry.get("chosen") or {}).items():
            grid = [p["values"].get(key) for p in entry["points"]]
            if len(set(grid)) < 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in grid):
                continue
            end = "highest" if value == max(grid) else "lowest" if value == min(grid) else None
            if end and not beyond_allowed(keys.get(key), value, +1 if end == "highest" else -1):
                lines.append(f"{row}: {key} = {value:g} is the {end} value of its grid "
                             f"({', '.join(f'{v:g}' for v in sorted(set(grid)))})")
    return lines


def beyond_allowed(key: Any, value: float, direction: int) -> bool:
    """True when ``key`` (a ``protocol.keys.Key``) refuses every value just past ``value`` in
    ``direction`` (+1 up, -1 down): ``value`` is the end of the key's allowed range, so a grid
    ending there is bracketed in effect. Probed through the key's own check (the one place its
    range is written) a relative 1e-9 past the value; an unknown key or one without a check
    allows anything."""
    if key is None or key.check is None:
        return False
    step = max(abs(value) * 1e-9, 1e-12)
    try:
        return not key.check(value + direction * step)
    except (TypeError, ValueError):
        return False


def write_tuning(out: Path, record: dict) -> Path:
    path = Path(out) / TUNING_FILE
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def read_tuning(folder: Path) -> dict | None:
    """``<folder>/tuning.json``, or None when there is none; an unreadable one is a ConfigError."""
    path = Path(folder) / TUNING_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if not isinstance(record.get("rows"), dict) or not isinstance(record.get("protocol"), str):
            raise ValueError("no 'rows' table or 'protocol' text")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a tuning record ({exc}); it is written by run_simulation.py's tuning:"
                          " remove it and run the tuning again") from None
    return record


def apply_choice(exp: dict, record: dict | None) -> dict:
    """The experiment with each tuned row's chosen values and the protocol's text
    (``tuning-protocol``) in its ``[methods.<row>]`` keys: what the table's runs use, and what
    make_results expects them to have recorded. Rows the record does not tune are unchanged."""
    if not record:
        return exp
    methods = {name: dict(keys) for name, keys in exp.get("methods", {}).items()}
    for row, entry in record["rows"].items():
        if entry.get("chosen") is not None:  # also a row given by --strategy only
            methods.setdefault(row, {}).update({**entry["chosen"], "tuning-protocol": record["protocol"]})
    return {**exp, "methods": methods}


# ---- make_results: which protocol chose each row's settings --------------------------------

def row_protocol(exp: dict, name: str, dirs: list[Path]) -> str:
    """How the settings of row ``name`` (a listed label) were chosen, for the runs shown: the
    protocol the runs recorded (``tuning-protocol``); for runs that recorded none, the file's
    ``[chosen-by]`` statement for the row (or its ``all``), else "not tuned" for a row the
    [tune] table leaves untuned, else "protocol not recorded" (never guessed)."""
    recorded = {str(((d.summary or {}).get("config") or {}).get("tuning-protocol") or "") for d in as_records(dirs)}
    tuned = sorted(r for r in recorded if r)
    if len(tuned) > 1 or (tuned and "" in recorded):
        return "mixed protocols: " + " | ".join(tuned + ([NOT_RECORDED] if "" in recorded else []))
    if tuned:
        return tuned[0]
    stated = exp.get("chosen-by", {})
    if name in stated:
        return stated[name]
    if "all" in stated:
        return stated["all"]
    if name in (exp.get("tune") or {}).get("untuned", []):
        return NOT_TUNED
    return NOT_RECORDED


def comparable(a: str, b: str) -> bool:
    """A claim between two rows is counted only when they were tuned by the same, known protocol."""
    return a == b and a != NOT_RECORDED and not a.startswith("mixed protocols")


def tuning_lines(record: dict | None) -> list[str]:
    """docs/results.md's account of a tuning record: the protocol, and per row the chosen
    values and every grid point's mean score (validation accuracy, the protocol's metric), a
    point whose search runs diverged marked "(diverged)" and its runs listed."""
    if not record:
        return []
    lines = [f"Tuning (`tuning.json`): {record['protocol']}; scores are {record['metric']} accuracy on the "
             f"validation split, mean over the search seeds (chosen in bold; `-` = not finished on every seed):", ""]
    for row, entry in record["rows"].items():
        cells = []
        for p in entry["points"]:
            values = ", ".join(f"{k}={v}" for k, v in p["values"].items())
            score = "-" if p["mean"] is None else f"{p['mean']:.4f}"
            score += " (!)" if p.get("client-failures") else ""
            score += " (diverged)" if p.get("diverged") else ""
            cells.append(f"**{values}: {score}**" if p["values"] == entry.get("chosen") else f"{values}: {score}")
        lines.append(f"- {row}: " + "; ".join(cells))
    failed = [text for entry in record["rows"].values() for p in entry["points"]
              for text in p.get("client-failures", [])]
    if failed:
        lines += ["", f"(!) search runs that lost client updates ({LOST_UPDATES}): " + "; ".join(failed)]
    lines += diverged_points(record, "(diverged) ")
    return lines + [""]


def diverged_points(record: dict | None, lead: str = "") -> list[str]:
    """The search runs that diverged, in one line after ``lead`` (none: []), and, for a row
    whose every finished point diverged, a line saying its choice is such a point: the search
    then chose a rate that blows up, and the grid wants smaller values. The runner prints these
    after its search; ``tuning_lines`` writes them into docs/results.md."""
    if not record:
        return []
    runs = [text for entry in record["rows"].values() for p in entry["points"] for text in p.get("diverged") or []]
    if not runs:
        return []
    lines = ["", f"{lead}search runs that diverged (never chosen over a point that did not): " + "; ".join(runs)]
    for row, entry in record["rows"].items():
        chosen = [p for p in entry["points"] if p["values"] == entry.get("chosen")]
        if chosen and chosen[0].get("diverged"):
            lines.append(f"{row}: every finished grid point diverged on some seed; the chosen one too: extend the"
                         " grid to smaller step sizes")
    return lines


# ---- the runner: the search before the table ------------------------------------------------

@dataclass
class SearchPlan:
    """The [tune] search of one runner call: its protocol, the table's rounds it is a share of,
    a copy of the runner's arguments that runs it (``args``), and its checked configs."""

    protocol: Protocol
    rounds: int
    args: Any
    configs: list = field(default_factory=list)


def plan_search(args: Any) -> SearchPlan | None:
    """The search the runner's arguments ask for: with an experiment file's ``[tune]`` table
    (``--tune`` asks for it explicitly and is refused without one; ``--no-tune`` skips it), a
    copy of ``args`` running the listed tuned rows' grids (``search_experiment``); None without
    tuning. A key both fixed on the command line and searched is refused (one line), as are
    ``--grid`` and a ``validation-fraction`` given on the command line: the protocol sets them."""
    import copy

    from fl_app.config import GENERAL_KEYS
    from fl_app.registry import parse_override

    exp = getattr(args, "experiment", None) or {}
    wanted = getattr(args, "tune", None)
    if wanted is False:
        return None
    if "tune" not in exp:
        if wanted:
            raise ConfigError("--tune needs an experiment file with a [tune] table (--config FILE; see"
                              " docs/experiments.md, 'Tuning protocol')")
        return None
    names = [s.strip() for s in args.strategy.split(",") if s.strip()]
    protocol = read_protocol(exp, names, getattr(args, "config", None))
    if not protocol.grids:
        return None
    if getattr(args, "grid", None):
        raise ConfigError(f"--grid {' '.join(args.grid)} and the file's [tune] search in one call: the search's grid is"
                          " [tune]'s; drop --grid, or add --no-tune to run a plain grid")
    command = dict(parse_override(t) for t in args.overrides)
    if getattr(args, "rounds", None) is not None:
        command["num-server-rounds"] = args.rounds
    fixed = sorted(({k for axes in protocol.grids.values() for k in axes} | {"validation-fraction", "tuning-protocol"})
                   & set(command))
    if fixed:
        raise ConfigError(f"{fixed} given on the command line, and the [tune] protocol searches or sets them; give"
                          " each key one way (or add --no-tune to run the file's values untuned)")
    rounds = int(command.get("num-server-rounds", exp.get("run-config", {}).get(
        "num-server-rounds", GENERAL_KEYS["num-server-rounds"].default)))
    search = copy.copy(args)
    search.experiment = search_experiment(exp, protocol, rounds)
    search.strategy = ",".join(protocol.grids)
    search.table_strategy = args.strategy  # the table's rows: a --set key read by an untuned row is no stray
    search.seeds = list(protocol.seeds)
    search.rounds = None
    search.overrides = [t for t in args.overrides if parse_override(t)[0] != "num-server-rounds"]
    return SearchPlan(protocol, rounds, search)
