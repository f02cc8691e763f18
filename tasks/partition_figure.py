"""A picture of a split, the figure non-IID papers print: ``partitions.png``, one stacked bar
per client, its height the client's size and its segments the client's examples of each label;
and ``client_label_counts.csv``, the same counts as a table.

``client_label_counts.csv`` has a header ``client,class_0,...,class_<C-1>`` and one row per
client (partition id, then its training examples of each class: the whole partition, before a
local test split is held out). Files written before the header existed (counts only, no header,
no client column) are read too (``read_label_counts``).

Both are written by the server once per run, after it has checked the partitioning
(``write_split_files``), and by ``run_simulation.py --check`` without training.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from tasks.partition_spec import PartitionSpec

LABEL_COUNTS_FILE = "client_label_counts.csv"
FIGURE_FILE = "partitions.png"
MAX_LABELLED_BARS = 40  # clients whose sizes are printed above their bars


def label_counts(spec: PartitionSpec) -> np.ndarray:
    """Every client's training labels counted per class (clients x classes): an image dataset's
    from its label column (``partition_label_counts``), the synthetic dataset's from its
    generated partitions."""
    from tasks.partitioning import load_partition, partition_label_counts

    if spec.dataset != "synthetic":
        return partition_label_counts(spec)
    from tasks.datasets import input_shape

    classes = input_shape(spec.dataset).classes
    return np.stack([np.bincount(load_partition(spec, i)[1].numpy(), minlength=classes)
                     for i in range(spec.num_partitions)])


def unheld_labels(spec: PartitionSpec, counts: np.ndarray) -> str | None:
    """One line when some classes are held by no client of the split (``pathological`` with
    k = 1 and 4 clients leaves labels 4-9 to nobody): the model never trains on them, and its
    test accuracy on them measures nothing it learnt. None when every class is held."""
    from tasks.partitioning import cut

    missing = [c for c in range(counts.shape[1]) if counts[:, c].sum() == 0]
    if not missing:
        return None
    return (f"{len(missing)} of {counts.shape[1]} labels are held by no client ({spec.dataset}, {spec.num_partitions}"
            f" clients, {cut(spec)}, seed {spec.seed}): {', '.join(map(str, missing))}; no client trains on them")


def write_label_counts(path: Path, counts: np.ndarray) -> None:
    """``client_label_counts.csv`` (header and one row per client), written whole or not at all."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["client", *(f"class_{c}" for c in range(counts.shape[1]))])
    for client, row in enumerate(counts):
        writer.writerow([client, *(int(v) for v in row)])
    tmp = Path(path).with_name(f".{Path(path).name}.tmp")
    tmp.write_text(out.getvalue())
    tmp.replace(path)  # atomic: the old file or the new one


def read_label_counts(path: Path) -> np.ndarray:
    """The clients x classes counts of a ``client_label_counts.csv``, with or without its header."""
    rows = [r for r in csv.reader(Path(path).read_text().splitlines()) if r]
    if rows and rows[0][0] == "client":
        return np.array([[int(v) for v in r[1:]] for r in rows[1:]], dtype=np.int64).reshape(len(rows) - 1, -1)
    return np.array([[int(v) for v in r] for r in rows], dtype=np.int64).reshape(len(rows), -1)


def draw_split(path: Path, counts: np.ndarray, title: str) -> None:
    """``partitions.png``: the picture of ``split_figure``."""
    fig = split_figure(counts, title)
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)  # atomic: never half a picture


def split_figure(counts: np.ndarray, title: str):
    """The split's figure: client k's bar stacks its examples of each class (one colour per
    class), so its height is the client's size, printed above it when there are few bars (turned
    upright above 20, with room left above the tallest). The clients' axis has integer ticks
    (every client up to 20), and the title is wrapped to the figure's width (``fit_title``)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    clients, classes = counts.shape
    colours = colormaps["tab10" if classes <= 10 else "tab20" if classes <= 20 else "turbo"]
    fig = Figure(figsize=(min(16, 5 + 0.35 * clients), 4.5), layout="constrained")
    ax = fig.subplots()
    bottom = np.zeros(clients)
    for c in range(classes):
        colour = colours(c) if classes <= 20 else colours(c / max(1, classes - 1))
        ax.bar(np.arange(clients), counts[:, c], bottom=bottom, color=colour, width=0.85,
               label=f"class {c}" if classes <= 20 else None)
        bottom += counts[:, c]
    upright = clients > 20
    if clients <= MAX_LABELLED_BARS:
        for k, size in enumerate(bottom):
            ax.text(k, size, f" {int(size)}" if upright else f"{int(size)}", ha="center", va="bottom", fontsize=7,
                    rotation=90 if upright else 0)
    # room above the tallest bar for its label (an upright one is taller), a little without labels
    headroom = 1.03 if clients > MAX_LABELLED_BARS else 1.16 if upright else 1.08
    ax.set_ylim(0, max(1.0, float(bottom.max(initial=0)) * headroom))
    ax.set_xlim(-0.6, clients - 0.4)
    if clients <= 20:
        ax.set_xticks(range(clients))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.set_xlabel("client (partition id)")
    ax.set_ylabel("training examples")
    if classes <= 20:
        ax.legend(fontsize=7, ncols=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fit_title(fig, title, fontsize=9)
    return fig


def fit_title(fig, title: str, fontsize: float = 9) -> None:
    """``title`` as ``fig``'s title, whole: wrapped at spaces into as few lines as fit the
    figure's width (measured with the figure's renderer), since a line wider than the figure
    is cut at both ends."""
    import textwrap

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    text = fig.suptitle(title, fontsize=fontsize)
    renderer = FigureCanvasAgg(fig).get_renderer()
    room = 0.96 * fig.get_figwidth() * fig.dpi
    for width in range(len(title), 19, -2):
        text.set_text(textwrap.fill(title, width, break_on_hyphens=False))
        if text.get_window_extent(renderer).width <= room:
            return


def write_split_files(folder: Path, spec: PartitionSpec, suffix: str = "", picture: bool = True) -> np.ndarray:
    """``client_label_counts<suffix>.csv`` and (``picture``) ``partitions<suffix>.png`` of
    ``spec``'s split in ``folder``; the counts."""
    from tasks.partitioning import cut

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    counts = label_counts(spec)
    write_label_counts(folder / with_suffix(LABEL_COUNTS_FILE, suffix), counts)
    if not picture:
        return counts
    what = "generated per device" if spec.dataset == "synthetic" else cut(spec)
    sizes = counts.sum(axis=1)
    title = (f"{spec.dataset}, {spec.num_partitions} clients of {int(sizes.min()):,} to {int(sizes.max()):,} examples,"
             f" {what}, seed {spec.seed}")
    draw_split(folder / with_suffix(FIGURE_FILE, suffix), counts, title)
    return counts


def with_suffix(name: str, suffix: str) -> str:
    """'partitions.png' -> 'partitions-2.png' for suffix '-2'."""
    stem, dot, ext = name.rpartition(".")
    return f"{stem}{suffix}{dot}{ext}"


def write_check_splits(cfgs: list[dict], folder: Path, num_partitions: int) -> list[str]:
    """``run_simulation.py --check``'s pictures, without training: one per distinct partitioning
    of the validated run configs ``cfgs`` (seeds and split keys differ; methods do not), in
    ``folder``: ``partitions.png`` and ``client_label_counts.csv`` when there is one, else
    ``partitions-<k>.png`` and ``client_label_counts-<k>.csv``, k = 1, 2, ... in the order of
    the configs; one line per picture saying what it shows."""
    from tasks.partitioning import cut

    specs = list(dict.fromkeys(PartitionSpec.from_config(cfg, num_partitions) for cfg in cfgs))
    lines = []
    for k, spec in enumerate(specs, start=1):
        suffix = "" if len(specs) == 1 else f"-{k}"
        counts = write_split_files(folder, spec, suffix)
        what = "generated per device" if spec.dataset == "synthetic" else cut(spec)
        lines.append(f"split: {Path(folder) / with_suffix(FIGURE_FILE, suffix)} ({spec.dataset}, seed {spec.seed},"
                     f" {what}; client sizes {int(counts.sum(axis=1).min())} to {int(counts.sum(axis=1).max())})")
        if unheld := unheld_labels(spec, counts):
            lines.append(f"warning: {unheld}")
    return lines


def write_run_split(run_dir: Path, cfg: dict, num_partitions: int | None) -> None:
    """The server's ``write_split_files`` for its run, once: skipped when the run folder has its
    picture already (a resumed run keeps the one it started with) or when the nodes bring their
    own data (``num_partitions`` None: there is no split of the server's to draw). With
    ``split-picture`` false only the label counts are written (and kept on resume). Best effort:
    a picture that cannot be made is a warning, never a failed run. Classes that no client holds
    are said in one warning line (``unheld_labels``), which the runner shows."""
    import logging

    from tasks.datasets import DataUnavailableError, PartitionError

    picture = cfg["split-picture"]
    if not num_partitions or (Path(run_dir) / (FIGURE_FILE if picture else LABEL_COUNTS_FILE)).exists():
        return
    log = logging.getLogger("flwr.fl_drift")
    try:
        spec = PartitionSpec.from_config(cfg, num_partitions)
        counts = write_split_files(Path(run_dir), spec, picture=picture)
    except (OSError, ValueError, RuntimeError, DataUnavailableError, PartitionError) as exc:
        log.warning("the split's picture (%s) was not written: %s", FIGURE_FILE, exc)
        return
    if unheld := unheld_labels(spec, counts):
        log.warning("fl-drift: %s", unheld)
