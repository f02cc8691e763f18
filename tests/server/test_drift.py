"""Drift diagnostics (fl_app/server/drift.py) against hand computations, and their columns in metrics.csv."""

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

import fl_app.server.drift as drift
from fl_app.registry import get_method, method_names, validate_config
from fl_app.server.drift import (
    aggregation_weights,
    diversity,
    drift_metrics,
    gram,
    layout,
    round_drift,
)
from strategies.base import DriftFedAvg, fedavg_kwargs
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import Proxy
from tests.kit_server import RoundByRound

# Three made-up client updates in 2 coordinates (first: a head entry, second: a body entry)
# with n = 20, 10, 10, so p = (1/2, 1/4, 1/4).
DELTAS = [(1.0, 0.0), (0.0, 2.0), (-1.0, 1.0)]
N = [20, 10, 10]
# By hand: step = (1/2)(1,0) + (1/4)(0,2) + (1/4)(-1,1) = (1/4, 3/4), ||step||^2 = 5/8;
# sum p ||D||^2 = 1/2 + 1 + 1/2 = 2, diversity 2 / (5/8) = 16/5;
# cosines: (1/4)/sqrt(5/8) = 1/sqrt(10), (3/2)/(2 sqrt(5/8)) = 3/sqrt(10), (1/2)/(sqrt2 sqrt(5/8)) = 1/sqrt(5);
# head only: deltas (1, 0, -1), step 1/4, sum p d^2 = 3/4 -> 12;
# body only: deltas (0, 2, 1), step 3/4, sum p d^2 = 5/4 -> (5/4)/(9/16) = 20/9.
EXPECTED = {
    "drift_norm_mean": (1 + 2 + math.sqrt(2)) / 3,
    "drift_norm_max": 2.0,
    "step_norm": math.sqrt(5 / 8),
    "update_diversity": 16 / 5,
    "update_cosine_mean": (1 / math.sqrt(10) + 3 / math.sqrt(10) + 1 / math.sqrt(5)) / 3,
    "head_diversity": 12.0,
    "body_diversity": 20 / 9,
}


def _gram(deltas):
    d = np.asarray(deltas, dtype=np.float64)
    return d @ d.T


def test_hand_computation_three_clients_unequal_weights():
    p = aggregation_weights(get_method("fedavg").strategy, N)
    np.testing.assert_allclose(p, [0.5, 0.25, 0.25])
    got = drift_metrics(_gram(DELTAS), p)
    for name in ("drift_norm_mean", "drift_norm_max", "step_norm", "update_diversity", "update_cosine_mean"):
        assert got[name] == pytest.approx(EXPECTED[name], rel=1e-12), name
    assert diversity(_gram([[d[0]] for d in DELTAS]), p) == pytest.approx(12.0, rel=1e-12)
    assert diversity(_gram([[d[1]] for d in DELTAS]), p) == pytest.approx(20 / 9, rel=1e-12)


def test_uniform_weights_for_plain_mean_methods():
    for method in ("feddyn", "dp-fedavg", "fedsmoo"):
        np.testing.assert_allclose(aggregation_weights(get_method(method).strategy, N), [1 / 3] * 3)
    # p = 1/3: step = (0, 1), ||step||^2 = 1, sum p ||D||^2 = 7/3
    feddyn = get_method("feddyn").strategy
    assert drift_metrics(_gram(DELTAS), aggregation_weights(feddyn, N))["update_diversity"] == pytest.approx(7 / 3)


@pytest.mark.parametrize("method", ["fedsmoo", "feddyn"])
def test_plain_mean_methods_drift_columns_are_unweighted(method):
    """FedSMOO's server is FedDyn's plain mean (strategies/fedsmoo.py), so its step is
    mean_k Delta_k whatever the n_k: with the hand example's p = 1/3, step = (0, 1) and
    diversity 7/3 (an n_k-weighted drift would give sqrt(5/8) and 16/5)."""
    sent = _mlp_arrays() + [np.zeros(10, np.float32)]
    got = round_drift({"model": "mlp", "dataset": "synthetic"}, get_method(method).strategy, sent,
                      list(zip(N, _replies(sent))))
    assert got["step_norm"] == pytest.approx(1.0, rel=1e-6)
    assert got["update_diversity"] == pytest.approx(7 / 3, rel=1e-6)


def test_drift_weights_follow_each_strategy_class_declaration():
    """The weighting is read from the registered strategy class, for every method: none is
    named in fl_app/server/drift.py."""
    for name in method_names():
        uniform = get_method(name).strategy.UNIFORM_MEAN
        want = [1 / 3] * 3 if uniform else [0.5, 0.25, 0.25]
        np.testing.assert_allclose(aggregation_weights(get_method(name).strategy, N), want, err_msg=name)


def test_one_client():
    got = drift_metrics(_gram([(3.0, 4.0)]), np.array([1.0]))
    assert got["drift_norm_mean"] == got["drift_norm_max"] == got["step_norm"] == pytest.approx(5.0)
    assert got["update_diversity"] == pytest.approx(1.0)
    assert got["update_cosine_mean"] == pytest.approx(1.0)


def test_identical_updates_give_diversity_one_and_cosine_one():
    got = drift_metrics(_gram([(1.0, -2.0)] * 3), aggregation_weights(get_method("fedavg").strategy, N))
    assert got["update_diversity"] == pytest.approx(1.0)
    assert got["update_cosine_mean"] == pytest.approx(1.0)
    assert got["step_norm"] == pytest.approx(math.sqrt(5))


def test_zero_step_gives_nan_diversity_and_cosine():
    # opposite updates with equal weights cancel: the clients moved, the step is zero
    got = drift_metrics(_gram([(1.0, 0.0), (-1.0, 0.0)]), np.array([0.5, 0.5]))
    assert got["step_norm"] == 0.0 and got["drift_norm_mean"] == 1.0
    assert math.isnan(got["update_diversity"]) and math.isnan(got["update_cosine_mean"])
    # nobody moved (e.g. a zero learning rate)
    got = drift_metrics(np.zeros((3, 3)), aggregation_weights(get_method("fedavg").strategy, N))
    assert got["step_norm"] == got["drift_norm_max"] == 0.0
    assert math.isnan(got["update_diversity"]) and math.isnan(got["update_cosine_mean"])


def test_gram_in_float64_chunked_equals_direct(monkeypatch):
    rng = np.random.default_rng(0)
    sent = [rng.standard_normal((7, 5)).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
    replies = [[(a + rng.standard_normal(a.shape)).astype(np.float32) for a in sent] for _ in range(3)]
    flat = np.stack([np.concatenate([(r[i].astype(np.float64) - sent[i]).ravel() for i in (0, 1)]) for r in replies])
    monkeypatch.setattr(drift, "CHUNK", 4)  # several chunks per array
    np.testing.assert_allclose(gram(sent, replies, [0, 1]), flat @ flat.T, rtol=1e-13)


def _mlp_arrays():
    """The synthetic-data mlp's state: body.1.weight, body.1.bias, head.weight, head.bias."""
    return get_weights(build_model("mlp", input_shape("synthetic"), seed=0))


def test_layout_head_body_and_buffers():
    n, head, body = layout("mlp", "synthetic", get_method("fedavg").strategy)
    assert (n, head, body) == (4, (2, 3), (0, 1))
    # cnn-bn: BN weight/bias are trainable (body); running stats and counters are excluded
    model = build_model("cnn-bn", input_shape("mnist"))
    names = list(model.state_dict())
    n, head, body = layout("cnn-bn", "mnist", get_method("fedavg").strategy)
    assert n == len(names)
    assert [names[i] for i in head] == ["head.weight", "head.bias"]
    assert not any("running" in names[i] or "num_batches" in names[i] for i in body)
    assert any(names[i].endswith("1.weight") for i in body)  # the first BN's weight
    # FedBN keeps BN on the clients: not part of its drift
    _, _, fedbn_body = layout("cnn-bn", "mnist", get_method("fedbn").strategy)
    assert len(fedbn_body) == len(body) - 4


def _replies(sent, extra_delta=1000.0):
    """The hand example placed in head.bias[0] and body.1.bias[0]; a control-variate-like extra
    array with a large change that must not count."""
    out = []
    for head_d, body_d in DELTAS:
        arrays = [a.copy() for a in sent]
        arrays[3][0] += np.float32(head_d)
        arrays[1][0] += np.float32(body_d)
        arrays[4] = arrays[4] + np.float32(extra_delta)
        out.append(arrays)
    return out


def test_round_drift_uses_the_weights_only():
    sent = _mlp_arrays() + [np.zeros(10, np.float32)]  # + an extra array after the weights
    cfg, scaffold = {"model": "mlp", "dataset": "synthetic"}, get_method("scaffold").strategy
    got = round_drift(cfg, scaffold, sent, list(zip(N, _replies(sent))))
    for name, want in EXPECTED.items():
        assert got[name] == pytest.approx(want, rel=1e-6), name
    assert round_drift(cfg, scaffold, None, []) == {}


def test_recording_strategy_writes_drift_columns(tmp_path):
    cfg = validate_config({"fraction-fit": 1.0, "num-server-rounds": 1, "model": "mlp", "dataset": "synthetic"})
    w0 = _mlp_arrays()
    inner = DriftFedAvg.from_config(
        cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), lambda r, a, c: (0.0, {"accuracy": 0.5})))
    strategy = RoundByRound(inner, cfg, tmp_path / "run", 1)

    class Manager:
        proxies = (Proxy("0"), Proxy("1"), Proxy("2"))

        def num_available(self):
            return 3

        def sample(self, num_clients, min_num_clients=None, criterion=None):
            return list(self.proxies[:num_clients])

    params = strategy.initialize_parameters(Manager())
    strategy.configure_fit(1, params, Manager())
    replies = [r[:4] for r in _replies(w0 + [np.zeros(1, np.float32)])]
    results = [(Proxy(str(k)), FitRes(Status(Code.OK, ""), ndarrays_to_parameters(r), n, {}))
               for k, (n, r) in enumerate(zip(N, replies))]
    params, _ = strategy.aggregate_fit(1, results, [])
    strategy.evaluate(1, params)
    with (tmp_path / "run" / "metrics.csv").open() as f:
        row = next(csv.DictReader(f))
    for name, want in EXPECTED.items():
        assert float(row[name]) == pytest.approx(want, rel=1e-6), name


def test_docs_name_every_column_written():
    readme = (Path(__file__).resolve().parents[2] / "docs" / "running.md").read_text()  # "What a run writes"
    sent = _mlp_arrays()
    columns = round_drift({"model": "mlp", "dataset": "synthetic"}, get_method("fedavg").strategy, sent,
                          list(zip(N, _replies(sent + [np.zeros(1, np.float32)]))))
    for name in [*columns, "min_class_accuracy", "per_class_accuracy.csv", "update_diversity_mean",
                 "final_min_class_accuracy_mean"]:
        assert f"`{name}" in readme, name


def test_no_column_for_a_part_without_parameters():
    sent = get_weights(build_model("logreg", input_shape("synthetic"), seed=0))  # head only
    replies = [[a + np.float32(k) for a in sent] for k in (1, 2)]
    got = round_drift({"model": "logreg", "dataset": "synthetic"}, get_method("fedavg").strategy, sent,
                      list(zip([1, 3], replies)))
    assert "body_diversity" not in got and got["head_diversity"] == pytest.approx(got["update_diversity"])
