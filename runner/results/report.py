"""Read finished runs' results and write the comparison files and plots. A row's runs are given
as folders or as their records read already (``runner.results.records``): each folder is read
once, by the function that is given it."""

from __future__ import annotations

import csv
import math
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from fl_app.api import atomic_write_text, replacing, run_divergence, split_words
from fl_app.api import read_metrics as read_metrics  # the readers of a run folder, for the callers of this module
from fl_app.api import read_summary as read_summary
from runner.results.clientmix import MIX_COLUMNS, client_mix_columns
from runner.results.fingerprint import split_by_data
from runner.results.records import Run, as_record, as_records, read_rows
from runner.results.stats import Paired, fmt_paired, paired_difference


def mean_std(values: list[float]) -> tuple[float, float]:
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def missing_metrics(dirs: list[Run]) -> list[str]:
    """Finished runs (a summary.json) whose metrics.csv is gone (deleted or moved after they
    finished): their per-round columns cannot be computed, so they are named, never skipped."""
    return [r.name for r in as_records(dirs) if r.summary is not None and not r.has_metrics]


def update_gaps(dirs: list[Run]) -> list[str]:
    """Runs that had rounds with no usable client update (``rounds_without_update`` in their
    summary.json), one text each: '<run>: untrained' (no round had one) or '<run>: rounds [..]'."""
    gaps = []
    for d in as_records(dirs):
        s = d.summary or {}
        if s.get("untrained"):
            gaps.append(f"{d.name}: untrained (no round used a client update)")
        elif s.get("rounds_without_update"):
            gaps.append(f"{d.name}: no client update used in rounds {s['rounds_without_update']}")
    return gaps


def diverged_runs(dirs: list[Run]) -> list[str]:
    """The runs that diverged (``fl_app.api.run_divergence``: training loss or a method's state
    norm past its bound, or accuracy back at chance after clearly exceeding it), one text each:
    '<run>: diverged in round R: <reason>'. Such a run is a result (the method at that step size
    blew up), kept in the means, but it is not a method that "does not work": the row says so."""
    found = []
    for d in as_records(dirs):
        if d.summary is None:
            continue
        why = run_divergence(d)
        if why:
            found.append(f"{d.name}: diverged in round {why['round']}: {why['text']}")
    return found


def diverged_cell(diverged: int, seeds) -> str:
    """' (diverged: k/n seeds)' after a row's final accuracy when k of its runs diverged, else ''."""
    return f" (diverged: {diverged}/{seeds} seeds)" if diverged else ""


# Why a lost client update matters, worded once for every page that lists such runs.
LOST_UPDATES = ("failed: the client raised or timed out; rejected: its update was not finite, did not match the"
                " model, or was screened out; either way it is left out of its round, so these runs trained on"
                " fewer clients than they sampled")


def _lost_in_round(row: dict) -> tuple[int, int]:
    """(failed, rejected) client updates of one metrics.csv row; ``num_rejected`` is absent in
    runs recorded before it existed and counts 0 there."""
    rejected = row.get("num_rejected")
    return int(row["num_failures"]), int(rejected) if isinstance(rejected, (int, float)) else 0


def client_failures(dirs: list[Run]) -> list[str]:
    """Runs in which sampled clients' updates were lost, one text each: '<run>: F failed and J
    rejected client updates in R of N rounds' (either part alone when the other is 0; 'every
    round' when so). Failed: the client raised or timed out (``num_failures`` in metrics.csv);
    rejected: its update arrived but was not finite, did not match the model, or was screened out
    (``num_rejected``: a diverging method's clients show up here). Either way the update is left
    out of its round (``LOST_UPDATES``), so such a run trained on fewer clients than it sampled; a
    client that fails every round (a data or model problem, not chance) silently makes the
    federation smaller, which a comparison must show."""
    found = []
    for d in as_records(dirs):
        rounds = [_lost_in_round(r) for r in d.metrics if isinstance(r.get("num_failures"), (int, float))]
        lost = [(f, j) for f, j in rounds if f > 0 or j > 0]
        if lost:
            failed, rejected = sum(f for f, _ in lost), sum(j for _, j in lost)
            counts = " and ".join(t for t in (f"{failed} failed" if failed else "",
                                              f"{rejected} rejected" if rejected else "") if t)
            every = " (every round)" if len(lost) == len(rounds) else ""
            noun = "update" if failed + rejected == 1 else "updates"
            found.append(f"{d.name}: {counts} client {noun} in {len(lost)} of {len(rounds)} rounds{every}")
    return found


def compare(runs: dict[str, list[Run]]) -> list[dict]:
    """One row per method: final and best accuracy as mean and std over its seeds, what they
    cost (``cost_columns``: rounds to the target accuracy, megabytes per client per round, client
    compute per round), and (with >= 2 seeds) the paired differences to the reference row
    (``add_paired_columns``). Untrained
    runs (summary ``untrained``: every round without a usable client update) are not a result:
    they are left out of the means and counted in ``untrained_runs``; ``update_gaps`` names the
    runs with such rounds and ``client_failures`` the runs in which sampled clients failed (both
    shown under comparison.md, the row marked (!)); ``diverged_runs`` counts the runs that
    diverged (``diverged_runs``: their final accuracy is a blow-up, not the method's level) and
    ``diverged`` names them with the reason (comparison.md: '(diverged: k/n seeds)' after the
    final accuracy, (!) and a list under the table). A row whose runs were made on different data,
    or on unknown data beside known, is never averaged: it is split into one row per data set
    (``split_by_data``), each with the line naming the runs in ``data_split``."""
    table = []
    runs, split = split_by_data(read_rows(runs))
    for method, dirs in runs.items():
        summaries = [d.summary for d in dirs if d.summary is not None]
        trained = [s for s in summaries if not s.get("untrained")]
        final = mean_std([s["final_accuracy"] for s in trained])
        best = mean_std([s["best_accuracy"] for s in trained])
        secs = mean_std([s["total_seconds"] for s in summaries])
        one = len(trained) < 2  # no spread from a single seed: std left empty, not 0
        diverged = diverged_runs(dirs)
        table.append({
            "method": method, "seeds": len(trained),
            "rounds": max((s["rounds"] for s in summaries), default=0),
            "final_accuracy_mean": final[0], "final_accuracy_std": None if one else final[1],
            "best_accuracy_mean": best[0], "best_accuracy_std": None if one else best[1],
            "seconds_mean": secs[0],
            **cost_columns([d for d in dirs if not (d.summary or {}).get("untrained")]),
            "tail_rounds": _span(tail_rounds(d) for d in dirs),
            **drift_columns(dirs),
            "untrained_runs": len(summaries) - len(trained), "update_gaps": "; ".join(update_gaps(dirs)),
            "client_failures": "; ".join(client_failures(dirs)),
            "diverged_runs": len(diverged), "diverged": "; ".join(diverged),
            "data_split": split.get(method, ""),
            "missing_metrics": "; ".join(missing_metrics(dirs)),
            **client_columns(dirs),
            **client_mix_columns(dirs, compute=True),
        })
    add_paired_columns(table, runs)
    return table


def reference_row(labels: list[str]) -> str | None:
    """The row every other row is compared with: the registry's ``REFERENCE_METHOD`` (FedAvg)
    when it ran, else the first row."""
    from fl_app.registry import REFERENCE_METHOD

    return REFERENCE_METHOD if REFERENCE_METHOD in labels else (labels[0] if labels else None)


TAIL_ROUNDS = 5
TAIL_KEY = "tail_accuracy"  # accuracy_by_seed's key for tail_accuracy


def tail_accuracy(run_dir: Run, rounds: int = TAIL_ROUNDS) -> float | None:
    """Mean test accuracy over the run's last ``rounds`` evaluated rounds (None without any):
    the end of a run less at the mercy of one round, since a label-skewed run's accuracy swings
    by points from one round to the next."""
    accs = [r["test_accuracy"] for r in as_record(run_dir).metrics
            if isinstance(r.get("test_accuracy"), (int, float)) and math.isfinite(r["test_accuracy"])]
    return sum(accs[-rounds:]) / len(accs[-rounds:]) if accs else None


def tail_rounds(run_dir: Run, rounds: int = TAIL_ROUNDS) -> int:
    """How many rounds ``tail_accuracy`` averages for this run: ``rounds``, or fewer when the
    run evaluated fewer (a 3-round run: 3)."""
    evaluated = [r for r in as_record(run_dir).metrics
                 if isinstance(r.get("test_accuracy"), (int, float)) and math.isfinite(r["test_accuracy"])]
    return min(rounds, len(evaluated))


def _span(values) -> int | str | None:
    """One value as itself, several as 'lowest-highest', none as None."""
    seen = sorted(set(values))
    return None if not seen else seen[0] if len(seen) == 1 else f"{seen[0]}-{seen[-1]}"


COMPUTE_KEY = "client_fit_seconds"  # value_by_seed's key for mean_client_seconds


def accuracy_by_seed(dirs: list[Run], key: str = "final_accuracy") -> dict[int, float]:
    """{seed: the run's final (or best) accuracy, or with ``TAIL_KEY`` its ``tail_accuracy``}
    (``value_by_seed``)."""
    return value_by_seed(dirs, key)


def value_by_seed(dirs: list[Run], key: str = "final_accuracy") -> dict[int, float]:
    """{seed: the run's summary value ``key`` (final or best accuracy), its ``tail_accuracy``
    (``TAIL_KEY``) or its mean client compute per round (``COMPUTE_KEY``)} over the finished
    runs of one row; the seed is the run's recorded config seed, else the ``-seed<N>`` ending of
    its folder name (runs whose seed is neither are left out: they cannot be paired; untrained
    runs are no result and are left out too)."""
    out = {}
    for d in as_records(dirs):
        s = d.summary
        if s is None or s.get("untrained"):
            continue
        seed = s.get("config", {}).get("seed")
        if seed is None and re.search(r"-seed(\d+)$", d.name):
            seed = re.search(r"-seed(\d+)$", d.name).group(1)
        value = (tail_accuracy(d) if key == TAIL_KEY else
                 mean_column(d.metrics, FIT_SECONDS) if key == COMPUTE_KEY else s.get(key))
        if value is not None and seed is not None:
            out[int(seed)] = float(value)
    return out


def add_paired_columns(table: list[dict], runs: dict[str, list[Run]]) -> None:
    """When some row has >= 2 seeds: per row, its final accuracy minus the reference row's
    (``reference_row``), paired by seed, as the mean and its 95% t interval over the seeds
    both ran (``runner.results.stats``), and the same for the mean accuracy over the last
    ``TAIL_ROUNDS`` rounds (``tail_*``, with its own seed count: runs without metrics.csv have
    none) and for the mean client compute seconds per round (``compute_*``: same seed, same
    partition, so the data size cancels); empty cells for the reference itself and for n < 2.
    Megabytes per round are not paired: they are the arrays' sizes, the same for every seed."""
    ref = reference_row(list(runs))
    if ref is None or max((r["seeds"] for r in table), default=0) < 2:
        return
    for prefix, key, seeds in (("final", "final_accuracy", "paired_seeds"), ("tail", TAIL_KEY, "tail_diff_seeds"),
                               ("compute", COMPUTE_KEY, "compute_diff_seeds")):
        base = value_by_seed(runs[ref], key)
        for r in table:
            p = paired_difference(value_by_seed(runs[r["method"]], key), base)
            own = r["method"] == ref or p.n < 2
            r.update({"paired_reference": ref, seeds: 0 if r["method"] == ref else p.n,
                      f"{prefix}_diff_mean": None if r["method"] == ref or p.n == 0 else p.mean,
                      f"{prefix}_diff_ci_low": None if own else p.low,
                      f"{prefix}_diff_ci_high": None if own else p.high})


def _pm(mean: float, std: float | None) -> str:
    """'0.6000 ± 0.1414', '0.6000' (n=1) when there is no spread to show, 'no result' for NaN
    (no run to average)."""
    if not math.isfinite(mean):
        return "no result"
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


# The warnings under comparison.md: a row's column -> the heading of the runs it lists.
WARNINGS = {
    "diverged": "**Warning: runs that diverged** (training loss or a method's state norm grew past its bound, or"
                " the accuracy fell back to chance after clearly exceeding it: `fl_app/common/divergence.py`): their"
                " final accuracy is a blow-up, most often a step size too big for the method, not its level; try a"
                " smaller learning rate (or clipping) before reading the row as a method that does not work:",
    "update_gaps": "**Warning: rounds without any usable client update** (every sampled client failed or was"
                   " rejected; `min-fit-fraction = 0` let the run go on). Untrained runs are left out of the"
                   " accuracies above, and a row with none left shows `no result`:",
    "client_failures": f"**Warning: sampled clients' updates were lost** ({LOST_UPDATES}: a client failing in"
                       " every round points at its data or the model, not at chance; the run's log names the"
                       " error):",
    "data_split": "**Warning: rows split by data** (a mean is never taken over runs on different data, nor over"
                  " runs without a data fingerprint beside runs with one; `runner/results/fingerprint.py`):",
    "missing_metrics": "**Warning: finished runs without their metrics.csv** (removed or moved after the run: the"
                       " accuracies above come from their summary.json; their curves and per-round columns are"
                       " missing):",
}


def write_comparison(table: list[dict], out: Path, setup: str = "") -> None:
    """comparison.csv and comparison.md in ``out``, each written whole or not at all
    (``replacing``: a full disk leaves the previous file, never a 0-byte or half one);
    comparison.md opens with ``setup`` (``setup_title``: the split and the model) when given."""
    out.mkdir(parents=True, exist_ok=True)
    with replacing(out / "comparison.csv", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]) if table else ["method"])
        writer.writeheader()
        writer.writerows(table)
    ref = table[0].get("paired_reference") if table else None
    last = tail_header(table)
    paired = (f" final − {ref}, paired (95% CI) | {last} − {ref}, paired (95% CI) |"
              f" client compute − {ref}, paired (95% CI) |" if ref else "")
    views = client_views(table)
    extra = "".join(f" {CLIENT_HEADERS[v]} |" for v in views) + paired
    lines = [
        "| method | seeds | rounds | final accuracy | best accuracy | seconds/run "
        f"| update diversity (mean) | final min-class accuracy | {target_header(table)} "
        "| MB per client per round (down / up) | client compute s per round |" + extra,
        "|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * (len(views) + 3 * bool(ref)),
    ]
    for r in table:
        lines.append(
            f"| {r['method']}{' (!)' if any(r.get(k) for k in WARNINGS) else ''} | {r['seeds']} |"
            f" {r['rounds']} | "
            f"{_pm(r['final_accuracy_mean'], r['final_accuracy_std'])}{_diverged(r)} | "
            f"{_pm(r['best_accuracy_mean'], r['best_accuracy_std'])} | {r['seconds_mean']:.1f} |"
            + _drift_cells(r) + _cost_cells(r) + "".join(f" {client_cells(r, v)} |" for v in views)
            + (f" {_paired_cell(r, ref)} | {_paired_cell(r, ref, 'tail')} | {_paired_cell(r, ref, 'compute')} |"
               if ref else "")
        )
    lines += ["", COST_NOTE]
    if setup:
        lines = [f"Setup: {setup}", "", *lines]
    if ref:
        lines += ["", f"Paired columns: per seed, the row's final accuracy (then its mean accuracy over the {last}, "
                  f"then its client compute per round) minus {ref}'s on the same seed (same partition and client "
                  "sampling), mean over seeds [95% Student t interval]; an interval that excludes 0 is a resolved "
                  "difference. The last-rounds column is less at the mercy of one round's swing."]
    if any(r["seeds"] == 1 for r in table):
        lines.append("")
        lines.append("Rows with 1 seed show no ± (no spread from n=1).")
    for key, heading in WARNINGS.items():
        flagged: dict[str, list[str]] = {}  # text -> its rows (the rows split from one row share one text)
        for r in table:
            if r.get(key):
                flagged.setdefault(r[key], []).append(r["method"])
        if flagged:
            lines += ["", heading] + [f"- {', '.join(rows)}: {text}" for text, rows in flagged.items()]
    atomic_write_text(out / "comparison.md", "\n".join(lines) + "\n")


def terminal_summary(table: list[dict], out: Path, setup: str = "") -> str:
    """The comparison as the runner prints it: the setup (``setup_title``: the split and the
    model) when given, the columns a reader compares methods by (final and best accuracy, the
    worst class's, and with two or more seeds the paired difference from the reference) and the
    warnings, narrow enough for a terminal; the full table (cost, drift, client columns and their
    notes) is named, in ``out``."""
    ref = table[0].get("paired_reference") if table else None
    lines = [f"setup: {setup}"] if setup else []
    lines += ["| method | seeds | final accuracy | best accuracy | final min-class accuracy |"
              + (f" final − {ref}, paired (95% CI) |" if ref else ""),
              "|---|---|---|---|---|" + ("---|" if ref else "")]
    for r in table:
        mc, sd = r.get("final_min_class_accuracy_mean", math.nan), r.get("final_min_class_accuracy_std", math.nan)
        lines.append(
            f"| {r['method']}{' (!)' if r.get('update_gaps') or r.get('client_failures') or r.get('diverged') else ''}"
            f" | {r['seeds']} | {_pm(r['final_accuracy_mean'], r['final_accuracy_std'])}{_diverged(r)} | "
            f"{_pm(r['best_accuracy_mean'], r['best_accuracy_std'])} | "
            f"{_pm(mc, sd if r.get('seeds', 1) > 1 else None) if math.isfinite(mc) else '-'} |"
            + (f" {_paired_cell(r, ref)} |" if ref else ""))
    for key, heading in WARNINGS.items():
        flagged = [r for r in table if r.get(key)]
        if flagged:
            lines += ["", heading] + [f"- {r['method']}: {r[key]}" for r in flagged]
    return "\n".join(lines + ["", f"all columns (run time, cost, drift, client views) and their notes: "
                                  f"{Path(out) / 'comparison.md'}"])


def _diverged(r: dict) -> str:
    """The row's '(diverged: k/n seeds)' (``diverged_cell``), counted over its finished runs."""
    return diverged_cell(r.get("diverged_runs") or 0, r["seeds"] + (r.get("untrained_runs") or 0))


def tail_header(table: list[dict]) -> str:
    """'last 5 rounds', 'last 3 rounds' (a 3-round comparison), 'last round', or 'last 3-5
    rounds' when the runs evaluated different numbers of rounds: the rounds ``tail_accuracy``
    actually averaged (``tail_rounds``), never more than the runs have."""
    counts = sorted({int(x) for r in table for x in str(r.get("tail_rounds") or "").split("-") if x})
    if not counts:
        return f"last {TAIL_ROUNDS} rounds"
    if len(counts) > 1:
        return f"last {counts[0]}-{counts[-1]} rounds"
    return "last round" if counts[0] == 1 else f"last {counts[0]} rounds"


INITIAL = {"test_accuracy": "initial_accuracy", "test_loss": "initial_loss"}


def initial_row(run_dir: Run) -> list[dict]:
    """Round 0, the initial model's evaluation, as a metrics row (from summary.json; [] for
    runs without it: unfinished, resumed, or made before it was recorded)."""
    summary = as_record(run_dir).summary or {}
    row = {column: summary[key] for column, key in INITIAL.items() if isinstance(summary.get(key), (int, float))}
    return [{"round": 0, **row}] if row else []


def _paired_cell(r: dict, ref: str, prefix: str = "final") -> str:
    if r["method"] == ref:
        return "(reference)"
    nan = [math.nan if r.get(k) is None else r[k] for k in (f"{prefix}_diff_mean", f"{prefix}_diff_ci_low",
                                                             f"{prefix}_diff_ci_high")]
    return fmt_paired(Paired(r.get("paired_seeds" if prefix == "final" else f"{prefix}_diff_seeds", 0), *nan))


def curves(runs: dict[str, list[Run]], column: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per method: rounds and the mean of ``column`` over seeds (methods lacking it skipped)."""
    return {m: (r, mean) for m, (r, mean, _, _, _) in curve_stats(runs, column).items()}


def curve_stats(runs: dict[str, list[Run]], column: str) -> dict[str, tuple]:
    """Per method: (rounds, mean, min, max over seeds, number of seeds with the column)."""
    out = {}
    for method, dirs in read_rows(runs).items():
        per_round: dict[int, list[float]] = defaultdict(list)
        seeds = 0
        for d in dirs:
            rows = [r for r in initial_row(d) + d.metrics if isinstance(r.get(column), (int, float))]
            seeds += bool(rows)
            for row in rows:
                per_round[int(row["round"])].append(float(row[column]))
        if per_round:
            rounds = np.array(sorted(per_round))
            vals = [np.asarray(per_round[r]) for r in rounds]
            out[method] = (rounds, np.array([v.mean() for v in vals]), np.array([v.min() for v in vals]),
                           np.array([v.max() for v in vals]), seeds)
    return out


LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
FLAT_TOLERANCE = 1e-9  # a curve whose whole range is below this (relative to its size) is flat


def setup_title(runs: dict[str, list[Run]]) -> str:
    """The runs' shared setup, one line: the dataset, the clients and their sizes (the smallest
    and largest client of any run, from its client_label_counts.csv), the whole split (its
    partitioner, every key it reads, feature noise; ``fl_app.api.split_words``), the fraction,
    rounds and model (values that differ between runs are joined with '/')."""
    records = [d for dirs in runs.values() for d in as_records(dirs) if d.summary]
    summaries = [d.summary for d in records]
    if not summaries:
        return ""

    def values(get) -> str:
        seen: list[str] = []
        for s in summaries:
            try:
                v = str(get(s))
            except (KeyError, TypeError):
                continue
            if v not in seen:
                seen.append(v)
        return "/".join(seen) if seen else "?"

    def clients(s: dict) -> int:
        return s.get("num_clients") or s["config"]["min-available-clients"]

    sizes = [counts.sum(axis=1) for d in records
             if (counts := getattr(d, "label_counts", None)) is not None and np.size(counts)]
    of = f" of {int(min(z.min() for z in sizes)):,} to {int(max(z.max() for z in sizes)):,} examples" if sizes else ""
    return (f"{values(lambda s: s['config']['dataset'])}, {values(clients)} clients{of}, "
            f"{values(lambda s: split_words(s['config'], clients(s)))}, "
            f"fraction {values(lambda s: s['config']['fraction-fit'])}, "
            f"{values(lambda s: s['config']['num-server-rounds'])} rounds, "
            f"model {values(lambda s: s['config']['model'])}")


def wrapped(text: str, width_inches: float, fontsize: float) -> str:
    """``text`` wrapped at spaces to lines that fit a figure ``width_inches`` wide at
    ``fontsize`` points (a character at most 0.6 of the font size wide, on average), so that a
    long setup line is not cut at the figure's edges."""
    import textwrap

    chars = max(20, int(width_inches * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.fill(line, chars, break_on_hyphens=False) for line in text.splitlines())


def _spread_note(stats: dict[str, tuple]) -> str:
    if any(s[4] > 1 for s in stats.values()):
        return "mean over seeds, band: min-max over seeds (n = seeds per curve)"
    return "one seed per curve: no spread shown"


def _draw(ax, stats: dict[str, tuple], ylabel: str) -> None:
    """Mean over seeds per method, its min-max band over seeds, a distinct style per method
    (so curves that coincide stay visible); a curve flat to float rounding is drawn flat."""
    from matplotlib.ticker import MaxNLocator

    drawn: list[tuple[str, np.ndarray, np.ndarray]] = []
    for i, (method, (rounds, mean, lo, hi, seeds)) in enumerate(stats.items()):
        same = [m for m, r, v in drawn if len(r) == len(rounds) and np.array_equal(r, rounds)
                and np.allclose(v, mean, rtol=0, atol=1e-12, equal_nan=True)]
        drawn.append((method, rounds, mean))
        # earlier curves are drawn wider with bigger markers, so a later equal curve on top
        # leaves them visible; the legend says which curves coincide
        line, = ax.plot(rounds, mean, linestyle=LINESTYLES[i % len(LINESTYLES)],
                        marker=MARKERS[i % len(MARKERS)], markersize=max(7 - 1.5 * i, 3),
                        markerfacecolor="none", linewidth=max(2.8 - 0.6 * i, 1.0),
                        label=f"{method} (n={seeds})" + (f" = {same[0]}" if same else ""), zorder=3 + i * 0.01)
        if seeds > 1:
            ax.fill_between(rounds, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.ticklabel_format(axis="y", useOffset=False)
    everything = np.concatenate([np.concatenate([s[2], s[3]]) for s in stats.values()])
    finite = everything[np.isfinite(everything)]
    if finite.size:
        spread, center = float(finite.max() - finite.min()), float(np.mean(finite))
        if spread <= FLAT_TOLERANCE * max(1.0, abs(center)):
            pad = max(abs(center) * 0.1, 1e-3)
            ax.set_ylim(center - pad, center + pad)
            ax.text(0.02, 0.04, f"constant: all values within {spread:.1e} of each other (float rounding)",
                    transform=ax.transAxes, fontsize=7, color="0.3")
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot(runs: dict[str, list[Run]], column: str, ylabel: str, path: Path, title: str = "") -> bool:
    """Line plot of ``column`` vs round, one line per method (mean over seeds, min-max band);
    False if no run has it."""
    stats = curve_stats(runs, column)
    if not stats:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    _draw(ax, stats, ylabel)
    setup = setup_title(runs)
    ax.set_title(wrapped("\n".join(t for t in (title, setup, _spread_note(stats)) if t), 6.5, 8), fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    return True


def save_figure(fig, path: Path) -> None:
    """Write ``fig`` to ``path`` (its suffix the format) through a temp file and a rename
    (``replacing``: a full disk leaves the old figure or none, never half of one); closed after."""
    import matplotlib.pyplot as plt

    try:
        with replacing(Path(path), "wb") as f:
            fig.savefig(f, dpi=120, format=Path(path).suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)


def plot_curves(runs: dict[str, list[Run]], path: Path) -> bool:
    """Test accuracy and test loss side by side, titled with the setup; False without data."""
    acc, loss = curve_stats(runs, "test_accuracy"), curve_stats(runs, "test_loss")
    if not acc:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.3))
    _draw(left, acc, "test accuracy")
    if loss:
        _draw(right, loss, "test loss")
    else:
        right.set_axis_off()
    fig.suptitle(wrapped(f"{setup_title(runs)}\n{_spread_note(acc)}", 11, 9), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    return True


# ------------------------------------------------------------------ cost
TARGET_KEY = "target-accuracy"  # the run-config key (fl_app/config.py); 0 or absent: no target
BYTES_DOWN, BYTES_UP = "bytes_down_per_client", "bytes_up_per_client"  # fl_app/server/recording.py
FIT_SECONDS = "fit_seconds_mean"  # the clients' own fit time, mean over the round's clients
MB = 1e6
COST_NOTE = ("Cost columns: rounds to target = the first round whose test accuracy is at or above the "
             "run-config `target-accuracy` (mean over the seeds that reached it; `no target` when none was "
             "set, e.g. `--set target-accuracy=0.9`); MB = 10^6 bytes of the arrays each client was sent "
             "(down) and sent back (up) per round, measured from the messages (SCAFFOLD's control variates "
             "included), the same for every seed; client compute = the clients' own fit time per round "
             "(mean over a round's clients, then over rounds, then seeds); n/a: runs made before these were "
             "recorded.")


def rounds_to_target(rows: list[dict], target: float) -> int | None:
    """The first round of a metrics table whose test accuracy is >= ``target`` (rounds without
    a finite accuracy, such as those ``evaluate-every`` skips, cannot count), else None."""
    for row in rows:
        acc = row.get("test_accuracy")
        if isinstance(acc, (int, float)) and math.isfinite(acc) and acc >= target:
            return int(row["round"])
    return None


def mean_column(rows: list[dict], column: str) -> float | None:
    """Mean of ``column`` over a run's rounds (empty and non-finite cells left out); None when
    no round has it (a run made before the column existed)."""
    values = [float(r[column]) for r in rows if isinstance(r.get(column), (int, float)) and math.isfinite(r[column])]
    return float(np.mean(values)) if values else None


def run_target(summary: dict) -> float | None:
    """A run's ``target-accuracy`` as recorded in its config; None when unset (0, or absent)."""
    value = (summary.get("config") or {}).get(TARGET_KEY)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def cost_columns(dirs: list[Run]) -> dict:
    """What one row's runs cost beside their accuracy: ``target_accuracy`` (the runs' own, NaN
    when they differ, None when unset), ``rounds_to_target_mean`` over the ``target_reached_seeds``
    of the ``target_seeds`` runs with a target that reached it; ``mb_down_per_round`` /
    ``mb_up_per_round`` (MB per client per round, ``cost_seeds`` runs have them) and
    ``client_seconds_per_round_mean`` / ``_std`` (mean client fit seconds per round), each a
    per-run mean over rounds, then the mean over runs; NaN where no run has them."""
    targets, reached, down, up, fit = [], [], [], [], []
    for d in as_records(dirs):
        summary = d.summary
        if summary is None:
            continue
        rows = d.metrics
        target = run_target(summary)
        if target is not None:
            targets.append(target)
            first = rounds_to_target(rows, target)
            if first is not None:
                reached.append(first)
        for values, column in ((down, BYTES_DOWN), (up, BYTES_UP), (fit, FIT_SECONDS)):
            value = mean_column(rows, column)
            if value is not None:
                values.append(value)
    fit_ms = mean_std(fit)
    return {
        "target_accuracy": None if not targets else targets[0] if len(set(targets)) == 1 else math.nan,
        "rounds_to_target_mean": float(np.mean(reached)) if reached else None,
        "target_reached_seeds": len(reached), "target_seeds": len(targets),
        "mb_down_per_round": mean_std(down)[0] / MB, "mb_up_per_round": mean_std(up)[0] / MB,
        "cost_seeds": len(down),
        "client_seconds_per_round_mean": fit_ms[0], "client_seconds_per_round_std": fit_ms[1] if len(fit) > 1 else None,
    }


def target_header(table: list[dict]) -> str:
    """'rounds to 90%' when every row with a target has the same one, else 'rounds to target'."""
    targets = {r.get("target_accuracy") for r in table} - {None}
    if len(targets) == 1 and math.isfinite(t := targets.pop()):
        return f"rounds to {100 * t:g}%"
    return "rounds to target"


def _seeds_part(have: int, seeds) -> str:
    return f" ({have}/{seeds} seeds)" if isinstance(seeds, int) and have < seeds else ""


def _cost_cells(r: dict) -> str:
    """comparison.md's cost cells: rounds to target ('3.0', '3.5 (2/3 seeds)', 'not reached',
    'no target'), ``mb_cell`` and ``compute_cell``."""
    if not r.get("target_seeds"):
        rounds = "no target"
    elif not r.get("target_reached_seeds"):
        rounds = "not reached"
    else:
        rounds = f"{r['rounds_to_target_mean']:.1f}" + _seeds_part(r["target_reached_seeds"], r["target_seeds"])
    return f" {rounds} | {mb_cell(r)} | {compute_cell(r)} |"


def mb_cell(r: dict) -> str:
    """'MB down / MB up' per client per round of a ``cost_columns`` row; 'n/a' for runs made
    before the bytes were recorded, with '(k/n seeds)' when only k of its n seeds have them."""
    down, up = r.get("mb_down_per_round", math.nan), r.get("mb_up_per_round", math.nan)
    if not (math.isfinite(down) and math.isfinite(up)):
        return "n/a"
    return f"{down:.3g} / {up:.3g}" + _seeds_part(r.get("cost_seeds", 0), r.get("seeds"))


def compute_cell(r: dict) -> str:
    """Client compute seconds per round of a ``cost_columns`` row: 'mean ± std' over seeds (the
    mean alone for one seed), 'n/a' without the column."""
    fit, std = r.get("client_seconds_per_round_mean", math.nan), r.get("client_seconds_per_round_std")
    if not math.isfinite(fit):
        return "n/a"
    return f"{fit:.3g}" if std is None else f"{fit:.3g} ± {std:.2g}"


# ------------------------------------------------------------------ drift and per-class
DIVERSITY = "update_diversity"
MIN_CLASS = "min_class_accuracy"


def drift_columns(dirs: list[Run]) -> dict[str, float]:
    """A method's drift and forgetting summary over its seeds: ``update_diversity_mean`` (per
    run the mean of update_diversity over its rounds, NaN rounds left out; then the mean over
    seeds) and ``final_min_class_accuracy_mean`` / ``_std`` (the last round's
    min_class_accuracy). NaN where the runs lack the columns (runs made before they existed)."""
    diversity, final_min = [], []
    for d in as_records(dirs):
        rows = d.metrics
        values = [r[DIVERSITY] for r in rows if isinstance(r.get(DIVERSITY), (int, float))]
        values = [v for v in values if math.isfinite(v)]
        if values:
            diversity.append(float(np.mean(values)))
        if rows and isinstance(rows[-1].get(MIN_CLASS), (int, float)):
            final_min.append(float(rows[-1][MIN_CLASS]))
    mc = mean_std(final_min)
    return {"update_diversity_mean": mean_std(diversity)[0],
            "final_min_class_accuracy_mean": mc[0], "final_min_class_accuracy_std": mc[1]}


CLIENT_COLUMNS = ("client_accuracy_mean", "client_accuracy_std", "client_accuracy_worst10")


def client_columns(dirs: list[Run]) -> dict[str, float]:
    """The per-client evaluation (``client-test-fraction``) of a row's last evaluated round:
    ``final_<column>`` for the clients' mean, std and worst-10% accuracy, each the mean over
    seeds; NaN where the runs lack the columns (client evaluation off)."""
    per_seed: dict[str, list[float]] = {c: [] for c in CLIENT_COLUMNS}
    for d in as_records(dirs):
        rows = [r for r in d.metrics if isinstance(r.get(CLIENT_COLUMNS[0]), (int, float))]
        for c in CLIENT_COLUMNS:
            if rows and isinstance(rows[-1].get(c), (int, float)):
                per_seed[c].append(float(rows[-1][c]))
    return {**{f"final_{c}": mean_std(v)[0] for c, v in per_seed.items()},
            seeds_key(CLIENT_COLUMNS): len(per_seed[CLIENT_COLUMNS[0]])}


def seeds_key(columns: tuple[str, ...]) -> str:
    """The row key counting the seeds behind a view's columns (``final_client_mix_seeds``):
    runs made before a view existed leave it out, so it may rest on fewer seeds than the row."""
    return f"final_{columns[0].rsplit('_', 1)[0]}_seeds"


def client_cells(r: dict, columns: tuple[str, ...] = CLIENT_COLUMNS) -> str:
    """'mean / std / worst 10%' of the clients' final accuracies (``columns``: their local test
    splits, or ``MIX_COLUMNS``: their label mixes), '-' where the row has none, and
    '(k/n seeds)' when only k of the row's n seeds have them (the rest ran before the view
    existed), so a mean over fewer seeds never passes for the row's."""
    values = [r.get(f"final_{c}", math.nan) for c in columns]
    if not all(isinstance(v, float) and math.isfinite(v) for v in values):
        return "-"
    have, seeds = r.get(seeds_key(columns)), r.get("seeds")
    part = f" ({have}/{seeds} seeds)" if isinstance(have, int) and isinstance(seeds, int) and have < seeds else ""
    return " / ".join(f"{v:.4f}" for v in values) + part


CLIENT_HEADERS = {CLIENT_COLUMNS: "client accuracy, local test splits (final): mean / std / worst 10%",
                  MIX_COLUMNS: "client accuracy, label mixes (final): mean / std / worst 10%"}


def client_views(rows) -> list[tuple[str, ...]]:
    """The clients' spread columns some row has (local test splits, label mixes), in that order."""
    return [cols for cols in CLIENT_HEADERS if any(client_cells(r, cols) != "-" for r in rows)]


def band_curves(runs: dict[str, list[Run]], column: str) -> dict[str, tuple[np.ndarray, ...]]:
    """Per method: rounds, and the mean, min and max of ``column`` over seeds at each round
    (non-finite values left out; methods without the column skipped)."""
    out = {}
    for method, dirs in read_rows(runs).items():
        per_round: dict[int, list[float]] = defaultdict(list)
        for d in dirs:
            for row in d.metrics:
                value = row.get(column)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    per_round[int(row["round"])].append(float(value))
        if per_round:
            rounds = np.array(sorted(per_round))
            vals = [np.asarray(per_round[r]) for r in rounds]
            out[method] = (rounds, np.array([v.mean() for v in vals]),
                           np.array([v.min() for v in vals]), np.array([v.max() for v in vals]))
    return out


def plot_drift(runs: dict[str, list[Run]], path: Path, title: str = "") -> bool:
    """drift.png: update diversity vs round, one line per method (mean over seeds) with a
    band from the lowest to the highest seed; log y (diversity is >= 1 and spans decades when
    clients pull apart). False, and no file, when no run has the column."""
    data = band_curves(runs, DIVERSITY)
    if not data:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(6.5, 4))
    seeds = max(len(d) for d in runs.values())
    drawn: list[tuple[str, np.ndarray, np.ndarray]] = []
    for i, (method, (rounds, mean, low, high)) in enumerate(data.items()):
        # a colour of its own per method (tab20 beyond 10 methods), line style and marker as in
        # the accuracy plot, and "= <method>" for a curve equal to an earlier one
        same = [m for m, r, v in drawn if np.array_equal(r, rounds) and np.allclose(v, mean, rtol=0, atol=1e-12)]
        drawn.append((method, rounds, mean))
        (line,) = ax.plot(rounds, mean, color=plt.cm.tab20(i % 20) if len(data) > 10 else None,
                          linestyle=LINESTYLES[i % len(LINESTYLES)], marker=MARKERS[i % len(MARKERS)],
                          markersize=3, label=method + (f" = {same[0]}" if same else ""))
        if seeds > 1:
            ax.fill_between(rounds, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlim(left=0)  # round 0 (the initial model) as in accuracy.png; no update yet, so no value
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    low_all = min(float(d[2].min()) for d in data.values())
    high_all = max(float(d[3].max()) for d in data.values())
    ax.yaxis.set_minor_formatter(plain if high_all < 10 * low_all else NullFormatter())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("update diversity  Σ p‖Δ‖² / ‖Σ pΔ‖²  (log)")
    ax.set_title(drift_title(runs, title), fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    return True


def drift_title(runs: dict[str, list[Run]], title: str = "") -> str:
    """drift.png's title: what is drawn, the runs' shared setup (as accuracy.png's title) and
    how seeds are summarised."""
    seeds = max(len(d) for d in runs.values())
    band = f"; band: min-max over {seeds} seeds" if seeds > 1 else ""
    lines = (f"{title or 'Client update diversity'} (1 = clients agree)", setup_title(runs),
             f"line: mean over seeds{band}")
    return wrapped("\n".join(t for t in lines if t), 6.5, 8)  # drift.png: 6.5 inches wide, its title at 8 points


def _drift_cells(r: dict) -> str:
    """comparison.md cells for drift_columns ("-" where the runs lack them)."""
    div = r.get("update_diversity_mean", math.nan)
    mc, sd = r.get("final_min_class_accuracy_mean", math.nan), r.get("final_min_class_accuracy_std", math.nan)
    div_cell = f"{div:.2f}" if math.isfinite(div) else "-"
    mc_cell = _pm(mc, sd if r.get("seeds", 1) > 1 else None) if math.isfinite(mc) else "-"
    return f" {div_cell} | {mc_cell} |"
