"""The clients' spread on their own label mixes: each client's accuracy of the global model
computed from the run's per-class test accuracy, weighted by that client's training labels.

For client k with n_kc training examples of class c and the global model's accuracy a_c on the
test split's class c:

    acc_k = sum_c n_kc a_c / sum_c n_kc

the accuracy the global model would have on a test set drawn with client k's label mix. Under
label skew (Dirichlet, shards), where each class's images are alike across clients, this has
the expectation of client k's score on a local test split cut from its partition
(``client-test-fraction``), with far less noise (each class scored on the whole test split,
about 1,000 images, instead of a handful per client) and without holding any training data
back, so a paper's setting stays as published. It sees no feature skew: for that, evaluate on
local splits (``client-test-fraction`` > 0). It costs the run nothing: it reads
per_class_accuracy.csv, which every run writes.

Mean, std and worst 10% are ``tasks.train.accuracy_spread`` over the clients, at the run's
last evaluated round; a row's columns are means over its seeds.
"""

from __future__ import annotations

import math

import numpy as np

from fl_app.api import LABEL_COUNTS_FILE as LABEL_COUNTS_FILE  # the run folder's files this view reads
from fl_app.api import PER_CLASS_FILE as PER_CLASS_FILE
from fl_app.api import accuracy_spread
from runner.results.records import Run, as_record, as_records

MIX_COLUMNS = ("client_mix_mean", "client_mix_std", "client_mix_worst10")


def label_mix_accuracies(per_class: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """acc_k = sum_c n_kc a_c / sum_c n_kc for every client k (rows of ``counts``). A class the
    test split lacks (a_c NaN) is left out of both sums; a client with no example of any
    scored class gets NaN."""
    per_class = np.asarray(per_class, dtype=float)
    counts = np.asarray(counts, dtype=float)
    scored = np.isfinite(per_class)
    weights = counts[:, scored]
    totals = weights.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, weights @ per_class[scored] / totals, math.nan)


def run_label_counts(run_dir: Run, compute: bool = False) -> np.ndarray | None:
    """The run's clients' training label counts (clients x classes): read from the run's
    client_label_counts.csv, else, with ``compute``, cut again from the data (the run's
    summary.json config and client count; same partitioner and seed as the run) and written
    there, so later readers need no data (``runner.results.records.as_record``). None when
    neither is possible."""
    return as_record(run_dir, label_counts=compute).label_counts


def client_mix_columns(dirs: list[Run], compute: bool = False) -> dict[str, float]:
    """``final_client_mix_mean/_std/_worst10``: the spread over clients at each run's last
    evaluated round, mean over the runs (seeds) that have both inputs; NaN when none has;
    ``final_client_mix_seeds``: how many runs that is."""
    per_seed: dict[str, list[float]] = {c: [] for c in MIX_COLUMNS}
    for d in as_records(dirs):
        per_class, counts = d.per_class, run_label_counts(d, compute)
        if per_class is None or counts is None or counts.shape[1] != per_class.size:
            continue
        mean, std, worst, n = accuracy_spread(label_mix_accuracies(per_class, counts))
        if n:
            for c, v in zip(MIX_COLUMNS, (mean, std, worst)):
                per_seed[c].append(v)
    return {**{f"final_{c}": float(np.mean(v)) if v else math.nan for c, v in per_seed.items()},
            "final_client_mix_seeds": len(per_seed[MIX_COLUMNS[0]])}
