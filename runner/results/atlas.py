"""The results atlas (docs/atlas.md and docs/results/atlas.png): every method's rank, accuracy and
claim verdicts across the experiment files, grouped by kind of skew and model.

scripts/make_results.py builds one ``AtlasFile`` per experiment file from the very rows and claim
tests its docs/results.md sections show (``method_row``, ``claim_tests``: nothing is recomputed
here but the rank, an ordering of the means the section prints) and calls ``write_atlas``; this
module only arranges them: the table, the heat map and the per-method lines.

What a cell counts:

- accuracy: the mean over seeds of the file's metric (the paper's: final accuracy, or best for
  the files whose paper reports the best), as the section's results table prints it;
- rank: 1 + the number of the file's rows (one per listed method or variant; a grid's listed
  name by its chosen point, the section's "highest best accuracy" rule) with a higher mean;
- marks: the file's claims that the section counts (a decided or undecided verdict between two
  rows tuned by one known protocol) with this method on one side, read from its side: ▲ the
  claim puts it above the other row and holds, or puts it below and is refuted (a win); ▼ the
  reverse (a loss); ○ undecided (a tie). Claims "not counted" and claims without runs are left out.

What a column says of its setting: its budget as a fraction of its paper's (``AtlasFile.budget``,
scripts/make_results.py's ``budget_fraction``: rounds x fraction-fit x local epochs, the passes
over the training split, summed over the grid, over the same of the paper's own setting in
experiments/paper/) and its seeds. Marks of a column below ``SMALL_BUDGET`` (or without a paper
setting) are marked so in the cell, the per-method lines and the picture: they order rows after a
short run, not at the training the paper's numbers were reached with. Rows identical by design
(``runner.results.design``) are one row, 'a = b'; the kinds of skew are summed up above the
table (``skew_summary``): which method led where a verdict was decided, where nothing resolved.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from runner.results.stats import HOLDS, UNDECIDED

WIN, TIE, LOSS = "▲", "○", "▼"
NOT_RUN = "not run yet"
REFERENCE = "fedavg"  # the heat map's zero: each file's FedAvg row
# Below a tenth of its paper's training a column's verdicts are marked "small budget": they order
# rows after an order of magnitude less training than the paper's numbers came from, while the rows
# are still climbing (in the kept runs 489 of 536 have their best round in the last fifth of their
# rounds) and far below those numbers (CIFAR-10 0.13-0.57 against the papers' 0.6-0.85), so a longer
# run can reorder them: fedgam-fmnist-participation's 40-round probe at C = 1.0 takes SCAFFOLD from
# 0.300 (FedAvg 0.585) at round 20, where the file's verdict is decided, to 0.648 (FedAvg 0.663).
# The tenth is a convention, one order of magnitude, not a measured edge: no kept file was run at
# two budgets that would show where verdicts stop changing.
SMALL_BUDGET = 0.1
SMALL, UNKNOWN_BUDGET = "small budget", "budget unknown"

# kind of skew: (key, heading, the picture's short label), in the atlas's order
GROUPS = (("dirichlet", "Dirichlet label skew", "Dirichlet"), ("classes", "#C = k label skew (pathological)", "#C=k"),
          ("shards", "Shards", "shards"), ("quantity", "Quantity skew", "quantity"),
          ("noise", "Feature noise", "noise"), ("natural", "Natural (per-writer) split", "natural"),
          ("iid", "IID", "IID"))


@dataclass(frozen=True)
class Entry:
    """One listed name's cell in one file: the row shown (a grid's chosen point) and its mean
    and std over seeds of the file's metric."""

    name: str
    method: str
    row: str
    mean: float
    std: float
    seeds: int
    diverged: int = 0
    point: str = ""  # the grid point shown ('local-epochs=4'), "" for a row without a grid


@dataclass(frozen=True)
class Verdict:
    """A counted claim between two listed names: ``better > worse`` with its verdict."""

    better: str
    worse: str
    verdict: str
    text: str


@dataclass(frozen=True)
class AtlasFile:
    """One experiment file as the atlas shows it."""

    name: str
    config: dict  # the file's [run-config] over the keys' defaults
    metric: str  # "final" or "best": the paper's metric, the one its claims use
    status: str  # "complete", "partial", "earlier setting" or NOT_RUN
    entries: dict[str, Entry] = field(default_factory=dict)  # listed name -> its cell (rows with runs)
    verdicts: list[Verdict] = field(default_factory=list)  # the counted claims
    not_counted: list[Verdict] = field(default_factory=list)  # claims the section shows as "not counted"
    methods: tuple[str, ...] = ()  # every listed name of the file, run or not
    variants: dict[str, str] = field(default_factory=dict)  # listed name -> its method, for variants
    budget: float | None = None  # its budget over its paper's (None: no paper setting to compare with)
    folded: dict[str, tuple[str, ...]] = field(default_factory=dict)  # 'a = b' -> (a, b): identical by design

    @property
    def run(self) -> bool:
        return bool(self.entries)


def budget_mark(f: AtlasFile) -> str:
    """SMALL for a column below SMALL_BUDGET, UNKNOWN_BUDGET without a paper setting, else ""."""
    if f.budget is None:
        return UNKNOWN_BUDGET
    return SMALL if f.budget < SMALL_BUDGET else ""


def budget_text(f: AtlasFile) -> str:
    """'0.008×' (3 significant digits, as the sections' budget line), 'no paper setting'."""
    return "no paper setting" if f.budget is None else f"{f.budget:.3g}×"


def seeds_text(f: AtlasFile) -> str:
    """'3 seeds', '1-3 seeds' when the rows kept different numbers of seeds."""
    counts = sorted({e.seeds for e in f.entries.values()})
    if not counts:
        return "no seeds"
    span = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"{span} seed{'s' if counts[-1] != 1 else ''}"


def skew(config: dict) -> tuple[str, str, tuple]:
    """(group key, short label, sort key within the group) of a file's split, from its run-config:
    the partitioner with alpha / classes-per-client / shards-per-client; feature noise
    (noise-sigma > 0) is its own group, whatever cuts the labels."""
    part = config.get("partitioner", "?")
    noise = float(config.get("noise-sigma", 0) or 0)
    if noise > 0:
        return "noise", f"noise σ={noise:g}" + ("" if part == "iid" else f" + {part}"), (noise,)
    if part in ("dirichlet", "inner-dirichlet"):
        alpha = float(config.get("alpha", 0))
        inner = " sizes fixed" if part == "inner-dirichlet" else ""
        return "dirichlet", f"Dir({alpha:g}){inner}", (alpha, part)
    if part == "pathological":
        k = config.get("classes-per-client")
        return "classes", f"#C={k}", (k,)
    if part == "shard":
        s = config.get("shards-per-client")
        return "shards", f"{s} shards", (s,)
    if part == "quantity":
        alpha = float(config.get("alpha", 0))
        return "quantity", f"sizes ~ Dir({alpha:g})", (alpha,)
    if part in ("natural", "iid"):
        return part, part, ()
    return "iid", part, ()


def group_heading(key: str, short: bool = False) -> str:
    return next(g[2 if short else 1] for g in GROUPS if g[0] == key)


def ordered(files: list[AtlasFile]) -> list[AtlasFile]:
    """Files by kind of skew (GROUPS), then model, dataset, the split's parameter (most skewed
    first) and name."""
    keys = [g[0] for g in GROUPS]

    def order(f: AtlasFile) -> tuple:
        group, _, within = skew(f.config)
        return (keys.index(group), str(f.config.get("model", "")), str(f.config.get("dataset", "")), within, f.name)

    return sorted(files, key=order)


def ranks(f: AtlasFile) -> dict[str, int]:
    """Listed name -> 1 + the number of the file's entries with a higher mean (ties share a rank)."""
    means = {n: e.mean for n, e in f.entries.items() if math.isfinite(e.mean)}
    return {n: 1 + sum(other > m for other in means.values()) for n, m in means.items()}


def side(v: Verdict, name: str) -> str | None:
    """WIN, TIE or LOSS of claim ``v`` for ``name`` (None when it is not a side)."""
    if name not in (v.better, v.worse):
        return None
    if v.verdict == UNDECIDED:
        return TIE
    above = (v.verdict == HOLDS) == (name == v.better)  # holds for it as better, refuted for it as worse
    return WIN if above else LOSS


def marks(f: AtlasFile, name: str) -> Counter:
    return Counter(m for m in (side(v, name) for v in f.verdicts) if m)


def method_order(files: list[AtlasFile]) -> list[str]:
    """FedAvg first, then methods by the number of files that ran them (most first) and name;
    a variant right after its method."""
    count = Counter(n for f in files for n in f.entries)
    variants = {n: m for f in files for n, m in f.variants.items()}
    bases = sorted({variants.get(n, n) for n in count}, key=lambda n: (n != REFERENCE, -count.get(n, 0), n))
    out = []
    for base in bases:
        if base in count:
            out.append(base)
        out += sorted((n for n in count if variants.get(n) == base), key=lambda n: (-count[n], n))
    return out


def cell(f: AtlasFile, name: str, link: str) -> str:
    """'[rank/n · 0.1234](link) ▲2 ○1', '–' when the file has no such row."""
    e = f.entries.get(name)
    if e is None:
        return "–"
    r = ranks(f)
    point = f" at {e.point}" if e.point else ""
    dagger = " †" if e.diverged else ""
    text = f"[{r.get(name, '?')}/{len(r)} · {e.mean:.4f}]({link}){point}{dagger}"
    m = marks(f, name)
    shown = "".join(f" {k}{m[k]}" for k in (WIN, TIE, LOSS) if m[k])
    return text + shown + (f" ({budget_mark(f)})" if shown and budget_mark(f) else "")


def anchor(name: str) -> str:
    """The MkDocs anchor of a results.md section (its heading is the file's name): Python-Markdown's
    toc slug, lower case with punctuation but hyphens dropped and spaces to hyphens."""
    text = re.sub(r"[^\w\s-]", "", name).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def header(f: AtlasFile, results: str) -> str:
    _, label, _ = skew(f.config)
    star = " (best)" if f.metric == "best" else ""
    state = "" if f.status == "complete" else f" ({f.status})"
    mark = budget_mark(f)
    budget = (f"budget {budget_text(f)}" if not mark else f"**budget {budget_text(f)} (small)**" if mark == SMALL
              else f"**{UNKNOWN_BUDGET} ({budget_text(f)})**")
    return (f"[{f.name}]({results}#{anchor(f.name)}){star}{state}<br>{label}<br>"
            f"{f.config.get('dataset', '?')} · {f.config.get('model', '?')}<br>{budget} · {seeds_text(f)}")


def tally(files: list[AtlasFile], name: str) -> dict:
    """A method's wins, ties and losses over the files (counted claims, read from its side), the
    opponents per file, how often it ranks first, and how many of its marks are of a column
    marked for its budget (``budget_mark``)."""
    out = {WIN: defaultdict(list), TIE: defaultdict(list), LOSS: defaultdict(list)}
    marked = Counter()
    for f in files:
        for v in f.verdicts:
            m = side(v, name)
            if m:
                out[m][f.name].append(v.worse if name == v.better else v.better)
                marked[m] += bool(budget_mark(f))
    ran = [f for f in files if name in f.entries]
    first = [f.name for f in ran if ranks(f).get(name) == 1]
    apart = sum(name in (v.better, v.worse) for f in files for v in f.not_counted)
    return {"marks": out, "files": len(ran), "first": first, "not_counted": apart, "marked": marked}


def _at(f: AtlasFile) -> str:
    """A file's name with its budget: 'fedspeed-cifar10-dir03 [0.008×]'."""
    return f"{f.name} [{budget_text(f)}]"


def _opponents(per_file: dict[str, list[str]], by_name: dict[str, AtlasFile]) -> str:
    parts = []
    for file, names in per_file.items():
        c = Counter(names)
        parts.append(f"{_at(by_name[file])} ({', '.join(n if c[n] == 1 else f'{n} ×{c[n]}' for n in c)})")
    return "; ".join(parts)


def method_lines(files: list[AtlasFile], names: list[str]) -> list[str]:
    lines = []
    by_name = {f.name: f for f in files}
    for name in names:
        t = tally(files, name)
        n = {k: sum(len(v) for v in t["marks"][k].values()) for k in (WIN, TIE, LOSS)}
        marked = t["marked"]
        at_small = (f" ({marked[WIN]} / {marked[TIE]} / {marked[LOSS]} of them at a {SMALL} or {UNKNOWN_BUDGET})"
                    if sum(marked.values()) else "")
        line = (f"- **{name}** ({t['files']} file{'s' if t['files'] != 1 else ''}; first in {len(t['first'])}): "
                f"wins {n[WIN]} / ties {n[TIE]} / loses {n[LOSS]}{at_small}")
        details = [f"wins on {_opponents(t['marks'][WIN], by_name)}" if n[WIN] else "",
                   f"loses on {_opponents(t['marks'][LOSS], by_name)}" if n[LOSS] else "",
                   f"ties on {', '.join(_at(by_name[x]) for x in t['marks'][TIE])}" if n[TIE] else ""]
        details = [d for d in details if d]
        apart = (f" ({t['not_counted']} more claim{'s' if t['not_counted'] != 1 else ''} not counted: rows tuned "
                 "differently or chosen on the test split)") if t["not_counted"] else ""
        none = "" if apart else " (no counted claim names it)"
        lines.append(line + apart + (": " + "; ".join(details) if details else none))
    return lines


def leaders(f: AtlasFile) -> tuple[list[str], int]:
    """The names ahead in ``f``'s decided verdicts (holds or refuted; undecided ones left out):
    those with the most wins net of losses, and that net; ([], 0) when no verdict was decided."""
    net: Counter = Counter()
    for v in f.verdicts:
        if v.verdict != UNDECIDED:
            for name in (v.better, v.worse):
                net[name] += 1 if side(v, name) == WIN else -1
    top = max(net.values(), default=0)
    return (sorted(n for n in net if net[n] == top), top) if top > 0 else ([], 0)


def _joined(names: list[str] | tuple[str, ...]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def skew_summary(files: list[AtlasFile]) -> list[str]:
    """One line per kind of skew with kept runs: its budgets, which method led each file where a
    verdict was decided (``leaders``), and the files where nothing resolved (every counted claim
    undecided) or nothing was claimed."""
    lines = []
    for key, heading, _ in GROUPS:
        group = [f for f in ordered(files) if skew(f.config)[0] == key]
        if not group:
            continue
        known = [f.budget for f in group if f.budget is not None]
        small = sum(budget_mark(f) == SMALL for f in group)
        unknown = sum(f.budget is None for f in group)
        span = (f"budget {min(known):.3g}×" + (f" to {max(known):.3g}×" if max(known) != min(known) else "")
                if known else "no paper setting")
        led: dict[tuple[str, ...], list[str]] = {}
        unresolved, unclaimed = [], []
        for f in group:
            names, net = leaders(f)
            budget = f"{budget_text(f)}{', ' + budget_mark(f) if budget_mark(f) else ''}"
            if names:
                each = " each" if len(names) > 1 else ""
                led.setdefault(tuple(names), []).append(f"{f.name} ({budget}; +{net}{each})")
            elif f.verdicts:
                unresolved.append(f"{f.name} ({budget})")
            else:
                unclaimed.append(f"{f.name} ({budget})")
        parts = [f"{_joined(names)} {'led' if len(names) == 1 else 'tied in the lead'} in {', '.join(where)}"
                 for names, where in led.items()]
        if unresolved:
            parts.append(f"nothing resolved (every counted claim undecided) in {', '.join(unresolved)}")
        if unclaimed:
            parts.append(f"no counted claim in {', '.join(unclaimed)}")
        files_text = f"{len(group)} file{'s' if len(group) != 1 else ''}"
        without = f"; {unknown} without a paper setting" if unknown else ""
        lines.append(f"- **{heading}** ({files_text}, {span}; {small} at a {SMALL}, below {SMALL_BUDGET:g}×{without}): "
                     + "; ".join(parts) + ".")
    return lines


def relative(f: AtlasFile, name: str) -> float:
    """Percentage points of ``name``'s mean above the file's FedAvg row (NaN without either)."""
    e, ref = f.entries.get(name), f.entries.get(REFERENCE)
    if e is None or ref is None or not (math.isfinite(e.mean) and math.isfinite(ref.mean)):
        return math.nan
    return 100 * (e.mean - ref.mean)


def label_columns(ax, run: list[AtlasFile]) -> None:
    """The heat map's column labels (file, skew, model, budget; grey below ``SMALL_BUDGET``) and
    its skew groups, each headed and set off by a line."""
    labels = [f"{f.name}{' *' if f.metric == 'best' else ''} · {skew(f.config)[1]} · {f.config.get('model', '?')}"
              f" · {budget_text(f)}{' !' if budget_mark(f) else ''}" for f in run]
    ax.set_xticks(range(len(run)), labels, rotation=60, ha="right", rotation_mode="anchor", fontsize=7)
    for tick, f in zip(ax.get_xticklabels(), run):
        if budget_mark(f):
            tick.set_color("#8a8a8a")
    groups = [skew(f.config)[0] for f in run]
    starts = [j for j in range(len(run)) if j == 0 or groups[j] != groups[j - 1]]
    for k, j in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(run)
        if j:
            ax.axvline(j - 0.5, color="black", linewidth=1.2)
        ax.text((j + end - 1) / 2, -0.8, group_heading(groups[j], short=True), ha="center", va="bottom",
                fontsize=8, fontweight="bold")


def heatmap(files: list[AtlasFile], path: Path) -> bool:
    """Methods (rows) x run files (columns, grouped by skew): accuracy minus the file's FedAvg in
    percentage points, blue above and red below, each cell's number its rank in the file; False
    when no file has runs."""
    run = ordered([f for f in files if f.run])
    if not run:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from runner.results.report import save_figure

    names = method_order(run)
    values = np.array([[relative(f, n) for f in run] for n in names], dtype=float)
    finite = np.abs(values[np.isfinite(values)])
    span = float(min(max(finite.max(initial=1.0), 1.0), 20.0))
    fig, ax = plt.subplots(figsize=(2.0 + 0.55 * len(run), 2.6 + 0.3 * len(names)))
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#c8c8c8")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=-span, vmax=span, aspect="auto")
    for i, n in enumerate(names):
        for j, f in enumerate(run):
            rank = ranks(f).get(n)
            if rank is None:
                continue
            dark = math.isfinite(values[i, j]) and abs(values[i, j]) > 0.6 * span
            ax.text(j, i, str(rank), ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    label_columns(ax, run)
    bar = fig.colorbar(image, ax=ax, shrink=0.5, pad=0.02)
    bar.set_label("accuracy − the file's FedAvg (percentage points)", fontsize=8)
    ax.set_title("Each method against FedAvg in each experiment file (number: rank in the file; dark grey: not "
                 "in the file;\n* = best accuracy, the paper's metric there, else final accuracy; × = budget as a "
                 f"fraction of the paper's,\n! and grey label: below {SMALL_BUDGET:g}×, a short run's ordering, not a "
                 "verdict on the paper)", fontsize=9, pad=22)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    return True


def atlas_intro(results: str) -> list[str]:
    """The atlas page's head: what it is and how to read a cell."""
    return ["# Results atlas", "",
             f"Generated by `scripts/make_results.py` with [the results]({results}), from the same kept runs and "
             "the same per-file rows and claim verdicts; do not edit by hand. One column per experiment file, "
             "grouped by kind of skew (Dirichlet, #C = k, shards, quantity, noise; read from each file's "
             "[run-config]) and then model and dataset; one row per method or variant. A file is a different "
             "setting (data, model, rounds, clients, tuning), so compare methods down a column, never across.", "",
             "How to read a cell, `rank/n · accuracy ▲w ○t ▼l` (rank and accuracy link to the file's section):", "",
             "- **accuracy**: mean over seeds of the file's metric, the one its paper reports (final accuracy; "
             "best accuracy in the columns marked (best)), as the file's section prints it; the cell links to "
             "that section. A grid's method shows its chosen point (highest best accuracy, the section's rule) "
             "after the link ('at local-epochs=4').",
             "- **rank/n**: 1 + the number of the file's n rows with a higher mean (rows with kept runs; ties "
             "share a rank). A rank is an ordering of means, not a decided difference: the marks say what the "
             "paired tests decided.",
             f"- **marks**: the file's claimed orderings that its section counts, with this method on one side, "
             f"read from its side: {WIN} a win (the claim puts it above the other row and **holds**, or below "
             f"and is **refuted**: the paired 95% interval over seeds excludes 0 in its favour), {LOSS} a loss "
             f"(the reverse), {TIE} a tie (**undecided**: the interval contains 0). Claims marked \"not counted\" "
             "in the section (rows tuned differently, or chosen on the test split) and claims without runs are "
             "left out. Only claimed orderings are tested: two baselines no claim compares get no mark.",
             "- **†**: some seeds of the row diverged (see the section); **–**: the file has no such row.",
             f"- **budget** (each column's header, with its seeds: the kept runs per row): the file's training "
             "over its paper's, both as rounds × fraction-fit × local epochs summed over the file's grid points, "
             "the passes over the training split its clients make (a round's fraction-fit × N clients each "
             "train local-epochs passes over their 1/N of it, whatever N is; every file trains on the whole "
             "split), against the paper's own setting in `experiments/paper/<file>` (the model's size is not "
             "in it: most files also train a smaller model than their paper). The sections print the same "
             f"number. Below {SMALL_BUDGET:g}× a column is marked **{SMALL}**, in its header, after its marks and "
             "in the per-method lines: its verdicts order the rows after a tenth or less of the training the "
             "paper's numbers came from, while they are still climbing (489 of the 536 kept runs have their "
             "best round in the last fifth of their rounds), so they are a short run's ordering, not a verdict "
             "on the paper; the tenth is a convention (an order of magnitude), not a measured edge. A file "
             f"without a paper setting is marked **{UNKNOWN_BUDGET}** the same way.",
             "- **a = b**: two rows of one file whose settings make them train the same model step for step "
             "(`runner/results/design.py`: read from the settings, not the numbers) are one row with both "
             "names; the file's section shows both.", ""]


def atlas_lines(files: list[AtlasFile], results: str, picture: str | None) -> list[str]:
    """The atlas page: what it counts, the picture, the table, the per-method lines and the files
    without kept runs."""
    run = ordered([f for f in files if f.run])
    idle = ordered([f for f in files if not f.run])
    lines = atlas_intro(results)
    if picture:
        lines += [f"![results atlas heat map]({picture})", "",
                  "The picture: accuracy minus the same file's FedAvg row in percentage points (blue above FedAvg, "
                  "red below, colour clipped at ±20), the number in each cell its rank in the file.", ""]
    if run:
        names = method_order(run)
        lines += ["## By kind of skew", "",
                  "Which method led where a verdict was decided (the most decided wins net of decided losses "
                  "among the file's counted claims, +n), and where nothing resolved; each file with its budget:",
                  "", *skew_summary(run), ""]
        lines += ["## The table", "",
                  "| method | " + " | ".join(header(f, results) for f in run) + " |",
                  "|---|" + "---|" * len(run)]
        for n in names:
            lines.append(f"| **{n}** | " + " | ".join(cell(f, n, f"{results}#{anchor(f.name)}") for f in run) + " |")
        lines += ["", "## Wins, ties and losses per method", "",
                  f"Summed over the files' counted claims ({WIN} / {TIE} / {LOSS} above; the other row in "
                  "brackets, ×k for k claims, e.g. one per grid point); \"first in\": the files where its mean "
                  "ranks first.", ""]
        lines += method_lines(run, names) + [""]
        lines += ["## Files by kind of skew", "", "| kind of skew | files with kept runs | not run yet |",
                  "|---|---|---|"]
        for key, heading, _ in GROUPS:
            have = [f for f in run if skew(f.config)[0] == key]
            missing = [f for f in idle if skew(f.config)[0] == key]
            if have or missing:
                linked = ", ".join(f"[{f.name}]({results}#{anchor(f.name)})" for f in have)
                lines.append(f"| {heading} | {linked or '–'} | {len(missing) or '–'} |")
        lines.append("")
    if idle:
        lines += [f"## Files {NOT_RUN}", "",
                  "No kept runs (some are sized for a GPU); no number is shown for them.", "",
                  "| file | kind of skew | split | dataset | model | methods |", "|---|---|---|---|---|---|"]
        for f in idle:
            group, label, _ = skew(f.config)
            lines.append(f"| [{f.name}]({results}#{anchor(f.name)}) | {group_heading(group)} | {label} "
                         f"| {f.config.get('dataset', '?')} | {f.config.get('model', '?')} | {', '.join(f.methods)} |")
        lines.append("")
    if not files:
        lines += ["No experiment files.", ""]
    return lines


def write_atlas(files: list[AtlasFile], out: Path, results: Path, picture: Path) -> str:
    """Write the atlas page ``out`` (links to ``results``, the picture at ``picture``); returns its text."""
    import os

    def rel(p: Path) -> str:
        return Path(os.path.relpath(Path(p).resolve(), Path(out).parent.resolve())).as_posix()

    drawn = heatmap(files, picture)
    text = "\n".join(atlas_lines(files, rel(results), rel(picture) if drawn else None)).rstrip() + "\n"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    return text
