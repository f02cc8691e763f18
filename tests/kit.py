"""The test kit for building a client, running its rounds and comparing two paths of them:

- building: ``fake_context``, ``make_client`` (the one way a test builds a client),
  ``initial_weights``;
- the one closeness check every comparison below is built on: ``assert_arrays_close`` (lists or
  dicts of arrays or tensors), with ``assert_metrics_close`` for the scalar fit metrics beside
  them;
- the cohort path against the per-client path: ``assert_round_close`` (one round's results),
  ``assert_cohort_client_equals`` (a client of a ``cohort_round``), ``assert_cohort_matches``
  (a cohort of small mlp clients built here), ``assert_cohort_equals_per_client`` (clients
  through ``train_cohort``), ``assert_same_reply`` (a client's reply as a node sends it), and
  ``in_float64`` for methods compared in float64;
- a run crashed and resumed in process against the uninterrupted run: ``crash_and_resume``,
  ``assert_same_rounds``.

The cohort's tolerance: 1e-5 relative in float32 (vmap's batched kernels sum the same products
in another order, ``tasks/functional/rounds.py``), and a cohort of one exactly; each test passes
its own ``rel``.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict
from flwr.common import FitRes, parameters_to_ndarrays

from fl_app.node.cohort_client import train_cohort
from fl_app.node.drift_client import DriftClient
from fl_app.registry import get_method, validate_config
from runner.results.report import read_metrics
from tasks.catalogue import InputShape
from tasks.datasets import input_shape
from tasks.functional import (
    CohortResult,
    Hyper,
    LocalUpdate,
    Round,
    RoundResult,
    cohort_round,
    local_round,
    module_state,
)
from tasks.functional.rounds import stack_trees, unstack_tree
from tasks.models import build_model, get_weights
from tests.conftest import serve_in_process


# ------------------------------------------------------------------------------- building
def fake_context(run_config: dict | None = None) -> Context:
    """A node's Context with run id and node id 0, no node config, an empty ``state`` and the
    run config ``run_config`` (empty when not given); a test sets ``node_config`` itself."""
    return Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config or {})


def make_client(update: LocalUpdate | str, overrides: dict, x: torch.Tensor, y: torch.Tensor,
                context: Context | None = None, client_cls: type[DriftClient] = DriftClient, partition: int = 0,
                num_partitions: int = 1) -> DriftClient:
    """The one way a test builds a client: the one generic client running ``update`` (a
    ``LocalUpdate``, or a method's name: its registered update, and ``strategy`` set to it) on
    in-memory data (no dataset is loaded; ``DriftClient.use_data``), partition ``partition`` of
    ``num_partitions``, its run config ``overrides`` on synthetic/logreg (validated, so a
    misspelt key fails). ``context``: a ``fake_context()`` when not given. ``client_cls``: a
    test's recording subclass of ``DriftClient``."""
    if isinstance(update, str):
        overrides = {"strategy": update, **overrides}
        update = get_method(update).update
    cfg = validate_config({"dataset": "synthetic", "model": "logreg", **overrides})
    client = client_cls(update, cfg, context or fake_context(), partition_id=partition, num_partitions=num_partitions)
    client.use_data((x, y))
    return client


def initial_weights(client: DriftClient, seed: int = 0) -> list[np.ndarray]:
    """A seeded initial model of the client's architecture (its run config's model on its
    dataset's input shape), as the arrays the server would send: the same arrays for the same
    seed."""
    return get_weights(build_model(client.cfg["model"], input_shape(client.cfg["dataset"]), seed=seed))


# ------------------------------------------------------------------------------ closeness
def assert_arrays_close(got, want, rel: float, what: str) -> None:
    """``got`` equals ``want`` array by array: two lists of the same length, or two dicts with
    the same keys, of numpy arrays or torch tensors. Each array of ``got`` has the shape and dtype
    of its counterpart in ``want``, only finite entries, and

    - when ``rel`` is 0, or the arrays hold integers or booleans: exactly its counterpart's values;
    - else: no entry further from its counterpart than ``rel`` times the largest magnitude in the
      wanted array (taken as 1e-12 when smaller): one tolerance per array, as a summation
      order's rounding is relative to the array's scale, not to each entry's.

    A failure names ``what``, the first array that differs (its index or key) and, for values,
    the relative difference found."""
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{what}: got a {type(got).__name__}, want a dict"
        assert set(got) == set(want), (f"{what}: keys differ: only got {sorted(set(got) - set(want))}, "
                                       f"only wanted {sorted(set(want) - set(got))}")
        pairs = [(f"{what}: {name}", got[name], want[name]) for name in want]
    else:
        assert len(got) == len(want), f"{what}: {len(got)} arrays, want {len(want)}"
        pairs = [(f"{what}[{i}]", u, v) for i, (u, v) in enumerate(zip(got, want))]
    for name, u, v in pairs:
        _assert_array_close(_as_tensor(u), _as_tensor(v), rel, name)


def _as_tensor(array) -> torch.Tensor:
    """A torch tensor of ``array``'s values and dtype (a numpy array is copied: it may be
    read-only, as the arrays decoded from Flower's bytes are)."""
    if isinstance(array, torch.Tensor):
        return array.detach()
    return torch.from_numpy(np.array(array))


def _assert_array_close(u: torch.Tensor, v: torch.Tensor, rel: float, name: str) -> None:
    """One array of ``assert_arrays_close``."""
    assert u.shape == v.shape, f"{name}: shape {tuple(u.shape)}, want {tuple(v.shape)}"
    assert u.dtype == v.dtype, f"{name}: dtype {u.dtype}, want {v.dtype}"
    assert torch.isfinite(u).all(), f"{name}: not finite ({int((~torch.isfinite(u)).sum())} entries)"
    if u.numel() == 0:
        return
    if rel == 0 or not u.is_floating_point():
        assert torch.equal(u, v), f"{name}: not equal (relative difference {_relative_difference(u, v):.3g})"
        return
    allowed = rel * v.abs().max().clamp_min(1e-12)
    assert (u - v).abs().max() <= allowed, f"{name}: relative difference {_relative_difference(u, v):.3g} > {rel:g}"


def _relative_difference(u: torch.Tensor, v: torch.Tensor) -> float:
    """The largest |u - v| over the largest |v| (1e-12 at least), in float64: for messages."""
    u, v = u.double(), v.double()
    return float((u - v).abs().max() / v.abs().max().clamp_min(1e-12))


def assert_metrics_close(got: dict, want: dict, rel: float, what: str) -> None:
    """Every metric of ``want`` (scalars; ``got`` may have more) is in ``got`` with the same
    value: exactly when ``rel`` is 0 or the wanted value is an int (step and example counts),
    else within ``rel`` of it relative (``pytest.approx``, with its 1e-12 absolute floor). A
    failure names ``what`` and the metric."""
    for key, value in want.items():
        assert key in got, f"{what}: no {key!r}"
        expected = value if rel == 0 or isinstance(value, int) else pytest.approx(value, rel=rel)
        assert got[key] == expected, f"{what}: {key}: {got[key]!r}, want {value!r} (rel {rel:g})"


# ------------------------------------------------------- the cohort against the per-client path
def round_arrays(result: RoundResult, skip_buffers: tuple[str, ...] = ()) -> dict:
    """Every array of a round's result under one name: its weights and buffers (but
    ``skip_buffers``) by their names, its new state and reply entries as ``state <entry>.<name>``
    and ``reply <entry>.<name>``."""
    arrays = {**result.params, **{n: b for n, b in result.buffers.items() if n not in skip_buffers}}
    arrays.update({f"state {s}.{n}": t for s, tree in result.state.items() for n, t in tree.items()})
    arrays.update({f"reply {r}.{n}": t for r, tree in result.reply.items() for n, t in tree.items()})
    return arrays


def assert_round_close(got: RoundResult, want: RoundResult, rel: float, metrics_rel: float, what: str,
                       skip_buffers: tuple[str, ...] = ()) -> None:
    """``got``'s round against ``want``'s: the same number of steps; the same weights, buffers
    (but ``skip_buffers``), new state and reply entries, each within ``rel`` as
    ``assert_arrays_close`` holds them (exactly when ``rel`` is 0); every fit metric of ``want``
    within ``metrics_rel`` as ``assert_metrics_close`` holds them."""
    steps, want_steps = got.metrics["num_steps"], want.metrics["num_steps"]
    assert steps == want_steps, f"{what}: {steps} steps, want {want_steps}"
    assert_arrays_close(round_arrays(got, skip_buffers), round_arrays(want, skip_buffers), rel, what)
    assert_metrics_close(got.metrics, want.metrics, metrics_rel, f"{what}'s metrics")


def assert_cohort_client_equals(together: CohortResult, k: int, alone: RoundResult, rel: float,
                                skip_buffers: tuple[str, ...] = ()) -> None:
    """Client ``k`` of ``together`` (a ``cohort_round``'s result) against ``alone`` (its own
    ``local_round``): ``assert_round_close`` with ``rel`` for the arrays (exactly when ``rel`` is
    0) and the fit metrics within ``rel`` (1e-12 at least)."""
    assert_round_close(together.client(k), alone, rel, max(rel, 1e-12), f"cohort client {k}", skip_buffers)


FLAT = InputShape(0, 12, 5)  # 12 features, 5 classes: an mlp cohort runs in about a second


def assert_cohort_matches(update: LocalUpdate, keys: dict, states=None, server=None,
                          sizes=(14, 6, 12), model_name: str = "mlp", clip_norm: float = 0.0) -> None:
    """A cohort of len(sizes) clients of different sizes (one vmap per step, batch 4, 2 epochs,
    SGD with momentum 0.9 and weight decay 5e-4) against each client's own ``local_round``:
    within 1e-5 relative (float32), and a cohort of one exactly (``assert_cohort_client_equals``),
    with the fit metrics in the same order. ``states(shapes, k)`` / ``server(shapes)`` build
    client k's state and the server's message from the parameter shapes ({name: shape})."""
    gen = torch.Generator().manual_seed(5)
    models = [build_model(model_name, FLAT, seed=k) for k in range(len(sizes))]
    params, buffers = (stack_trees(t) for t in zip(*(module_state(m) for m in models)))
    params = {n: p.contiguous() for n, p in params.items()}
    shapes = {n: p.shape[1:] for n, p in params.items()}
    data = [(torch.randn(n, 12, generator=gen), torch.randint(0, FLAT.classes, (n,), generator=gen)) for n in sizes]
    client_states = [states(shapes, k) if states else {} for k in range(len(sizes))]
    sent = {"buffers": {}, **(server(shapes) if server else {})}
    skeleton = build_model(model_name, FLAT).to("meta")
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=keys, clip_norm=clip_norm)
    for members, rel in ((list(range(len(sizes))), 1e-5), ([0], 0)):
        sub = {n: p[members] for n, p in params.items()}
        subb = {n: b[members] for n, b in buffers.items()}
        together = cohort_round(update, skeleton, sub, subb, [client_states[k] for k in members], sent, hp,
                                [data[k] for k in members], 4, 2,
                                [torch.Generator().manual_seed(10 + k) for k in members])
        for j, k in enumerate(members):
            alone = local_round(Round(update, skeleton, unstack_tree(sub, j), unstack_tree(subb, j), client_states[k],
                                sent, hp, *data[k], 4, 2, torch.Generator().manual_seed(10 + k)))
            assert_cohort_client_equals(together, j, alone, rel)
            assert list(together.metrics[j]) == list(alone.metrics)


def assert_cohort_equals_per_client(clients: list[DriftClient], weights: list, rel: float = 1e-5,
                                    float64: bool = False) -> None:
    """Every client's round of ``weights`` (server round 3) through the cohort path (all in one
    ``train_cohort``) against its own ``local_round``: ``assert_round_close`` with ``rel`` for
    weights, buffers, the client's new state and its reply beyond the weights, and the fit
    metrics within ``rel`` (1e-6 at least: both drivers sum the steps' losses in float32); both
    paths in float64 when ``float64`` (``in_float64``). Each path prepares its own rounds (a
    round's batch-order generator is consumed by training)."""
    config = {"server-round": 3}
    convert = in_float64 if float64 else list
    together = train_cohort(convert([c.prepare_round(weights, config) for c in clients]))
    for k, (client, cohort) in enumerate(zip(clients, together)):
        alone = local_round(convert([client.prepare_round(weights, config)])[0])
        assert_round_close(cohort, alone, rel, max(rel, 1e-6), f"client {k} (partition {client.partition_id})")


def in_float64(jobs: list[Round]) -> list[Round]:
    """The prepared rounds ``jobs`` with their model (one float64 copy, shared: a cohort's clients
    run one skeleton), weights, floating buffers, data and received buffers in float64, for a
    method whose float32 rounding differences between the paths grow too fast to compare. The
    rounds handed in are left as they are."""
    model = copy.deepcopy(jobs[0].model).double()

    def wide(tree):
        return {n: t.double() if t.is_floating_point() else t.clone() for n, t in tree.items()}

    out = []
    for job in jobs:
        buffers = wide(job.buffers)
        out.append(replace(job, model=model, params=wide(job.params), buffers=buffers, x=job.x.double(),
                           server={**job.server, "buffers": buffers}))
    return out


def untimed(metrics: dict) -> dict:
    """``metrics`` less its timings (``*_seconds``), which no two runs share."""
    return {k: v for k, v in metrics.items() if not k.endswith("_seconds")}


def assert_same_reply(got, want: tuple, rel: float, what: str = "reply") -> None:
    """A client's reply against the per-client one, ``want`` = (arrays, num_examples, metrics) as
    a NumPyClient's ``fit`` returns them. ``got``: the same triple, or a ``FitRes`` (a cohort
    node's reply split from its bundle; an error string in its place fails, showing it). The
    same number of examples; the arrays as ``assert_arrays_close`` holds them (same count,
    shapes and dtypes; within ``rel``, exactly when 0); the same metric names but timings, each
    as ``assert_metrics_close`` holds them (ints exactly, floats within ``rel``)."""
    assert not isinstance(got, str), f"{what}: {got}"
    if isinstance(got, FitRes):
        got = (parameters_to_ndarrays(got.parameters), got.num_examples, got.metrics)
    arrays, num_examples, metrics = got
    want_arrays, want_examples, want_metrics = want
    assert num_examples == want_examples, f"{what}: {num_examples} examples, want {want_examples}"
    assert_arrays_close(arrays, want_arrays, rel, f"{what}'s arrays")
    metrics, want_metrics = untimed(metrics), untimed(want_metrics)
    assert set(metrics) == set(want_metrics), f"{what}: metrics {sorted(metrics)}, want {sorted(want_metrics)}"
    assert_metrics_close(metrics, want_metrics, rel, f"{what}'s metrics")


# ----------------------------------------------------- a crashed and resumed run, in process
def crash_and_resume(cfg: dict, tmp_path, rounds: int = 4, crash_after: int = 2) -> tuple[list, list]:
    """The metric rows of an uninterrupted in-process run of ``cfg`` (synthetic data, logreg, 4
    nodes, half sampled per round; ``serve_in_process``) and of the same run crashed after round
    ``crash_after`` (checked: it raised and recorded that many rounds) and resumed by a new
    server and new nodes (nothing kept in memory), each ``rounds`` rounds."""
    base = {"dataset": "synthetic", "model": "logreg", "num-server-rounds": rounds, "fraction-fit": 0.5,
            "learning-rate": 0.05, "tracking": "none", "results-dir": str(tmp_path), **cfg}
    serve_in_process({**base, "run-name": "full"}, 4)
    with pytest.raises(RuntimeError, match=f"injected crash after round {crash_after}"):
        serve_in_process({**base, "run-name": "cut", "inject-faults": f"crash-after:{crash_after}"}, 4)
    assert len(read_metrics(tmp_path / "cut")) == crash_after
    serve_in_process({**base, "run-name": "cut", "resume": True}, 4)
    return read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")


def assert_same_rounds(full: list[dict], resumed: list[dict], columns: tuple[str, ...], start: int) -> None:
    """The two runs have the same rounds, and from row ``start`` on each round agrees on the
    test and training losses and on ``columns`` (the method's own server metrics), each within
    1e-6 relative of the resumed run's value (``assert_metrics_close``)."""
    assert [r["round"] for r in full] == [r["round"] for r in resumed]
    names = ("test_loss", "train_loss", *columns)
    for a, b in zip(full[start:], resumed[start:]):
        assert_metrics_close({n: float(a[n]) for n in names}, {n: float(b[n]) for n in names}, 1e-6,
                             f"round {a['round']}")
