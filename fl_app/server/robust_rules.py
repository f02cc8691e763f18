"""The robust rules screening has that Flower has not, on a round's updates as rows of a matrix.

``X`` is n x d (float64): row k is client k's update Delta_k = w_k - w_t flattened over the
screened arrays (``fl_app.server.screening``). Pre-aggregation maps X to other rows (``arc``,
``nnm``: n rows; ``bucketing``: ceil(n / s) rows) that a rule then aggregates; a rule maps rows
to one update v (d,). Every row weighs the same (a Byzantine client could claim any number of
examples), as in Flower's median and trimmed mean.

Written here, in numpy, not taken from ByzFL (0.0.11): importing ``byzfl`` imports its
benchmark and models, hence torchvision, matplotlib, seaborn and scipy, and the torchvision
wheel the package index resolves for this project's CPU torch does not load ("operator
torchvision::nms does not exist"); each rule is a few lines. tests/server/test_screening_rules.py
checks them against hand computations, and against ByzFL where it imports (skipped, saying so,
where it does not).
"""

from __future__ import annotations

import numpy as np

GM_ITERATIONS = 100
"""Most smoothed-Weiszfeld iterations of ``geometric_median``."""
GM_TOLERANCE = 1e-7
"""``geometric_median`` stops once an iteration moves z by at most this x (1 + ||z||)."""
GM_SMOOTHING = 1e-8
"""nu of the smoothed Weiszfeld step: a distance below nu counts as nu (no division by 0)."""


def geometric_median(rows: np.ndarray) -> np.ndarray:
    """argmin_z sum_k ||z - x_k|| by the smoothed Weiszfeld iteration (RFA, Pillutla et al.,
    IEEE TSP 2022): z <- sum_k b_k x_k / sum_k b_k with b_k = 1 / max(nu, ||z - x_k||), from the
    mean, until a step moves z by <= GM_TOLERANCE x (1 + ||z||) or GM_ITERATIONS steps."""
    z = rows.mean(axis=0)
    for _ in range(GM_ITERATIONS):
        b = 1.0 / np.maximum(GM_SMOOTHING, np.linalg.norm(rows - z, axis=1))
        new = (b[:, None] * rows).sum(axis=0) / b.sum()
        moved = float(np.linalg.norm(new - z))
        z = new
        if moved <= GM_TOLERANCE * (1.0 + float(np.linalg.norm(z))):
            break
    return z


def clip_rows(rows: np.ndarray, radius: float) -> np.ndarray:
    """Each row scaled by min(1, radius / ||row||) (a zero row, or one within the radius, unchanged)."""
    norms = np.linalg.norm(rows, axis=1)
    scale = np.where(norms > radius, radius / np.where(norms > 0, norms, 1.0), 1.0)
    return rows * scale[:, None]


def centered_clip(rows: np.ndarray, tau: float, iterations: int, center: np.ndarray | None = None) -> np.ndarray:
    """Centered clipping (Karimireddy, He and Jaggi, ICML 2021): from v_0 = ``center`` (the zero
    update, i.e. w_t, by default), L = ``iterations`` times
    v <- v + (1/n) sum_k clip_tau(x_k - v), clip_tau(u) = u min(1, tau / ||u||)."""
    v = np.zeros(rows.shape[1]) if center is None else center.astype(np.float64)
    for _ in range(iterations):
        v = v + clip_rows(rows - v, tau).mean(axis=0)
    return v


def nnm(rows: np.ndarray, attackers: int) -> np.ndarray:
    """Nearest neighbour mixing (Allouah et al., AISTATS 2023): row k replaced by the mean of its
    n - f nearest rows in L2, itself included (ties by the lower index). The means are one
    product M X with M the n x n mixing matrix (1 / (n - f) at each row's nearest), so memory
    stays O(n^2 + n d); indexing ``rows[nearest]`` first would hold n (n - f) d floats (7.9 GB
    for 10 replies of an 11M-weight ResNet-18 at f = 1)."""
    n = len(rows)
    sq = (rows * rows).sum(axis=1)
    dist = np.maximum(sq[:, None] + sq[None, :] - 2.0 * rows @ rows.T, 0.0)
    np.fill_diagonal(dist, -1.0)  # itself first, whatever the rounding
    k = max(1, n - attackers)
    nearest = np.argsort(dist, axis=1, kind="stable")[:, :k]
    mixing = np.zeros((n, n))
    np.put_along_axis(mixing, nearest, 1.0 / k, axis=1)
    return mixing @ rows


def bucketing(rows: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Bucketing (Karimireddy, He and Jaggi, ICLR 2022): the rows in a random order
    (``rng.permutation``), cut into consecutive buckets of ``size`` (the last one holds what is
    left), each bucket replaced by its mean: ceil(n / s) rows."""
    shuffled = rows[rng.permutation(len(rows))]
    return np.stack([shuffled[i:i + size].mean(axis=0) for i in range(0, len(rows), size)])


def arc_count(n: int, attackers: int) -> int:
    """How many rows ARC clips: k = floor(2 (f / n) (n - f))."""
    return int(2 * attackers * (n - attackers) / n) if n else 0


def arc(rows: np.ndarray, attackers: int) -> np.ndarray:
    """Adaptive robust clipping (Allouah et al., ICLR 2025): the k = floor(2 (f / n)(n - f)) rows
    of largest norm are clipped to the (k + 1)-th largest norm; the others are unchanged."""
    k = arc_count(len(rows), attackers)
    if k <= 0:
        return rows.copy()
    norms = np.linalg.norm(rows, axis=1)
    radius = float(np.sort(norms)[len(rows) - k - 1])
    return clip_rows(rows, radius)
