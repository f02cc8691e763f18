"""Client-drift diagnostics, computed on the server each round from the accepted replies.

With w_t the weights sent, w_k client k's reply, Delta_k = w_k - w_t (trainable float
parameters only: BN running statistics and other buffers are excluded) and p_k the weights
the method aggregates with:

- ``drift_norm_mean``, ``drift_norm_max``: mean (over clients, unweighted) and max of ||Delta_k||;
- ``step_norm``: ||sum_k p_k Delta_k||, the step the clients' mean asks for (before any
  server learning rate, correction or clipping of the method);
- ``update_diversity``: sum_k p_k ||Delta_k||^2 / ||sum_k p_k Delta_k||^2 (the gradient
  diversity of Yin et al., AISTATS 2018, on local updates as Haddadpour & Mahdavi, 2019):
  1 when all clients send the same update, large when they pull apart. Since the p_k sum
  to 1 it is always >= 1 (Jensen). An all-zero step makes it NaN.
- ``update_cosine_mean``: mean over clients of cos(Delta_k, sum_j p_j Delta_j); clients
  with Delta_k = 0 are left out; NaN when the step or every Delta_k is zero;
- ``head_diversity``, ``body_diversity``: the diversity restricted to the classifier head
  (``model.head``) and to the rest of the trainable parameters (absent for a part without
  any, such as the body of ``logreg``).

Every quantity follows from the clients' Gram matrix G_jk = <Delta_j, Delta_k> (float64),
which is accumulated chunk by chunk from read-only views of the replies: each reply is
converted to float64 once, a chunk at a time, and never copied whole.

p_k and the entries that count are the method's own facts, declared on its strategy class
(strategies/base.py ``FromConfig``) and read from the strategy the server runs, handed in:
p_k = 1/K when the class's ``UNIFORM_MEAN`` is set (its server takes the plain mean), else
n_k / sum n (the n_k-weighted mean); entries its ``local_entries`` names (BatchNorm layers
kept local, say) stay on the clients and are left out. A plain Flower strategy, which
declares neither, is taken as the n_k-weighted mean with nothing local. No method is
named or looked up here.

From summed replies (a cohort node's sums, ``protocol.cohort.sum_replies``) the same
columns follow without any client's arrays (``drift_from_sums``): each client's ||Delta_k||^2
over the head and the body, sum_k n_k Delta_k (so the step sum_k p_k Delta_k with p_k = n_k / sum n)
and sum_k Delta_k / ||Delta_k|| (so the mean cosine, <sum_k Delta_k/||Delta_k||, step> over the
moving clients' count and ||step||). Summed replies exist only for a server that weighs by n_k.
"""

from __future__ import annotations

import functools
import math

import numpy as np

CHUNK = 1 << 16  # elements per client per chunk: K x 512 KiB of float64, cache-sized


def gram(sent: list[np.ndarray], replies: list[list[np.ndarray]], indices: list[int]) -> np.ndarray:
    """G_jk = <Delta_j, Delta_k> in float64 over the arrays ``indices`` (K x K)."""
    k = len(replies)
    g = np.zeros((k, k))
    buf = np.empty((k, min(CHUNK, max((sent[i].size for i in indices), default=0))))
    for i in indices:
        ref = sent[i].reshape(-1)
        flats = [r[i].reshape(-1) for r in replies]
        for start in range(0, ref.size, CHUNK):
            stop = min(start + CHUNK, ref.size)
            d = buf[:, : stop - start]
            for j, flat in enumerate(flats):
                np.subtract(flat[start:stop], ref[start:stop], out=d[j], dtype=np.float64)
            g += d @ d.T
    return g


def diversity(g: np.ndarray, p: np.ndarray) -> float:
    """sum_k p_k ||Delta_k||^2 / ||sum_k p_k Delta_k||^2; NaN when the step is zero."""
    step_sq = float(p @ g @ p)
    return float(p @ np.diag(g)) / step_sq if step_sq > 0 else math.nan


def drift_metrics(g: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """Norms, diversity and mean cosine from the Gram matrix ``g`` and weights ``p``."""
    sq = np.clip(np.diag(g), 0.0, None)
    norms = np.sqrt(sq)
    step_sq = max(float(p @ g @ p), 0.0)
    step = math.sqrt(step_sq)
    moving = norms > 0
    if step > 0 and moving.any():
        cosines = (g @ p)[moving] / (norms[moving] * step)
        cosine = float(np.mean(cosines))
    else:
        cosine = math.nan
    return {
        "drift_norm_mean": float(norms.mean()),
        "drift_norm_max": float(norms.max()),
        "step_norm": step,
        "update_diversity": diversity(g, p),
        "update_cosine_mean": cosine,
    }


def aggregation_weights(strategy: type, num_examples: list[int]) -> np.ndarray:
    """p_k as the strategy class ``strategy`` aggregates: 1/K when it declares
    ``UNIFORM_MEAN``, else n_k / sum n (also 1/K when no client reports any example)."""
    n = np.asarray(num_examples, dtype=np.float64)
    if getattr(strategy, "UNIFORM_MEAN", False) or n.sum() <= 0:
        return np.full(len(n), 1.0 / len(n))
    return n / n.sum()


@functools.lru_cache(maxsize=8)
def layout(model_name: str, dataset: str, strategy: type) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(number of state arrays N, head indices, body indices) in state_dict order.

    Head and body hold the trainable floating-point parameters of ``model.head`` and of the
    rest of the model; buffers (BN running statistics, counters) are in neither. Entries the
    strategy class declares client-local (``local_entries``: BatchNorm layers kept local, say), which never
    leave the clients, are left out too.
    """
    from tasks.datasets import input_shape
    from tasks.models import build_model

    model = build_model(model_name, input_shape(dataset))
    params = {name for name, t in model.named_parameters() if t.requires_grad and t.is_floating_point()}
    local = set(strategy.local_entries(model)) if hasattr(strategy, "local_entries") else set()
    head, body = [], []
    for i, name in enumerate(model.state_dict()):
        if name in params and i not in local:
            (head if name.startswith("head.") else body).append(i)
    return len(model.state_dict()), tuple(head), tuple(body)


def round_drift(
    cfg: dict, strategy: type, sent: list[np.ndarray] | None, replies: list[tuple[int, list[np.ndarray]]]
) -> dict[str, float]:
    """The round's drift columns from what was sent and the accepted (n_k, arrays) replies, for
    a run of the strategy class ``strategy`` (its declared facts, see the module docstring).

    Only the first N arrays (the model state) count; methods append extra arrays (control
    variates, ...) after them. Empty when nothing was sent or no reply is usable.
    """
    n_state, head, body = layout(cfg["model"], cfg["dataset"], strategy)
    if sent is None or not replies or len(sent) < n_state:
        return {}
    arrays = [a for _, a in replies]
    p = aggregation_weights(strategy, [n for n, _ in replies])
    g_head = gram(sent, arrays, list(head))
    g_body = gram(sent, arrays, list(body))
    out = drift_metrics(g_head + g_body, p)
    if head:  # a part without trainable parameters (logreg's body) has no column
        out["head_diversity"] = diversity(g_head, p)
    if body:
        out["body_diversity"] = diversity(g_body, p)
    return out


def drift_from_sums(cfg: dict, strategy: type, nodes: list) -> dict[str, float]:
    """The round's drift columns from summed replies (``nodes``: ``protocol.cohort.NodeSum``, whose
    sums run over ``layout``'s head then body entries): the same quantities as ``round_drift``
    on the clients' own replies, within float64 rounding. Empty without a client. A strategy
    that declares ``UNIFORM_MEAN`` never gets summed replies (its p_k = 1/K): refused."""
    if getattr(strategy, "UNIFORM_MEAN", False):
        raise ValueError(f"{strategy.__name__} takes a plain mean over clients: its drift columns need every reply")
    _, head, body = layout(cfg["model"], cfg["dataset"], strategy)
    clients = [c for node in nodes for c in node.clients]
    if not clients:
        return {}
    n = np.array([c.num_examples for c in clients], dtype=np.float64)
    p = n / n.sum() if n.sum() > 0 else np.full(len(n), 1.0 / len(n))
    total = n.sum() if n.sum() > 0 else 1.0
    entries = range(len(head) + len(body))
    step = [sum(node.weighted_step[j].astype(np.float64) for node in nodes if node.clients) / total for j in entries]
    directions = [sum(node.directions[j].astype(np.float64) for node in nodes if node.clients) for j in entries]
    step_head = sum(float(np.vdot(s, s)) for s in step[:len(head)])
    step_body = sum(float(np.vdot(s, s)) for s in step[len(head):])
    head_sq = np.array([c.head_sq for c in clients])
    body_sq = np.array([c.body_sq for c in clients])
    norms = np.sqrt(np.clip(head_sq + body_sq, 0.0, None))
    step_sq = step_head + step_body
    step_norm = math.sqrt(step_sq)
    moving = int((norms > 0).sum())
    if step_norm > 0 and moving:
        cosine = sum(float(np.vdot(u, s)) for u, s in zip(directions, step)) / (moving * step_norm)
    else:
        cosine = math.nan
    out = {
        "drift_norm_mean": float(norms.mean()),
        "drift_norm_max": float(norms.max()),
        "step_norm": step_norm,
        "update_diversity": float(p @ (head_sq + body_sq)) / step_sq if step_sq > 0 else math.nan,
        "update_cosine_mean": cosine,
    }
    if head:
        out["head_diversity"] = float(p @ head_sq) / step_head if step_head > 0 else math.nan
    if body:
        out["body_diversity"] = float(p @ body_sq) / step_body if step_body > 0 else math.nan
    return out
