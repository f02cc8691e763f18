"""Update screening (fl_app/server/screening.py) against hand computations, through DriftServer's steps,
and its per-method capability."""

import logging
import math

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from fl_app.common.screening_modes import allowed_modes
from fl_app.config import ConfigError
from fl_app.registry import METHODS, resolve, validate_config
from fl_app.server.screening import (
    clip_factor,
    decide,
    robust_weights,
    scale_update,
    update_norm,
)
from runner.results.report import read_metrics
from strategies.base import DriftFedAvg, fedavg_kwargs
from tests.kit import FakeManager, fit_res
from tests.kit_server import W_T, RoundByRound, client, depends_only_on_the_mean, probe_config

# norms: ||(3, 4)|| = 5 with matrix update 0; client B: matrix update 1 everywhere (norm 2), vector 0;
# client C: matrix 0, vector (0, 30) -> 30
A = client(0.0, [3.0, 4.0])
B = client(1.0, [0.0, 0.0], count=100)
C = client(0.0, [0.0, 30.0])


def test_update_norm_counts_float_arrays_only():
    assert update_norm(A[:3], W_T) == pytest.approx(5.0)
    assert update_norm(B[:3], W_T) == pytest.approx(2.0)  # the integer buffer's +95 does not count
    assert update_norm(B[:3], W_T, skip=frozenset({0})) == 0.0
    assert update_norm(C[:3], W_T) == pytest.approx(30.0)


def test_clip_factor():
    assert clip_factor(2.0, 5.0) == 1.0
    assert clip_factor(0.0, 0.0) == 1.0
    assert clip_factor(10.0, 4.0) == pytest.approx(0.4)


def test_clip_relative_to_the_median():
    d = decide([A, B, C], W_T, "clip", clip_norm=0.0, multiple=2.0, trim=0.2)
    assert d.norms == pytest.approx([5.0, 2.0, 30.0])
    assert d.median == pytest.approx(5.0) and d.bound == pytest.approx(10.0)
    assert d.factors == pytest.approx([1.0, 1.0, 10.0 / 30.0])
    assert d.keep == [True, True, True]


def test_clip_fixed_bound():
    d = decide([A, B, C], W_T, "clip", clip_norm=4.0, multiple=2.0, trim=0.2)
    assert d.bound == 4.0
    assert d.factors == pytest.approx([0.8, 1.0, 4.0 / 30.0])


def test_reject_above_multiple_of_median():
    d = decide([A, B, C], W_T, "reject", clip_norm=4.0, multiple=2.0, trim=0.2)  # clip_norm unused
    assert d.bound == pytest.approx(10.0) and d.keep == [True, True, False] and d.factors == [1.0] * 3


def test_scale_update_keeps_integers_and_scales_extras():
    reply = client(1.0, [2.0, -2.0], count=9, extra=[4.0, -8.0])
    out = scale_update(reply, W_T, 0.25)
    np.testing.assert_allclose(out[0], [[1.25, 1.25], [1.25, 1.25]])
    np.testing.assert_allclose(out[1], [0.5, -0.5])
    assert out[2] == 9 and out[2].dtype == np.int64
    np.testing.assert_allclose(out[3], [1.0, -2.0])  # extras times the same factor
    assert out[0].dtype == np.float32
    skipped = scale_update(reply, W_T, 0.25, skip=frozenset({0}))
    np.testing.assert_array_equal(skipped[0], reply[0])


def test_median_and_trimmed_mean_by_hand():
    vectors = [[1.0, -5.0], [2.0, 0.0], [100.0, 1.0], [3.0, 2.0], [-50.0, 3.0]]
    clients = [client(float(k), v) for k, v in enumerate(vectors)]
    med = robust_weights(clients, W_T, "median", 0.2)
    assert sorted(med) == [0, 1]  # the integer buffer is not aggregated
    np.testing.assert_allclose(med[1], [2.0, 1.0])
    np.testing.assert_allclose(med[0], np.full((2, 2), 1.0 + 2.0))
    trimmed = robust_weights(clients, W_T, "trimmed-mean", 0.2)  # cut 1 of 5 at each end
    np.testing.assert_allclose(trimmed[1], [(1.0 + 2.0 + 3.0) / 3, (0.0 + 1.0 + 2.0) / 3])
    np.testing.assert_allclose(trimmed[0], np.full((2, 2), 1.0 + (1 + 2 + 3) / 3))


# ------------------------------------------------------------------ through DriftServer's steps


def recorder(tmp_path, strategy_cls=DriftFedAvg, **overrides):
    cfg = validate_config({"fraction-fit": 1.0, "min-available-clients": 2, **overrides})
    inner = strategy_cls.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(W_T), None))
    return RoundByRound(inner, cfg, tmp_path / "run", num_rounds=1), inner


def one_round(strategy, replies, sizes):
    manager = FakeManager(len(replies))
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(W_T), manager)
    results = [(proxy, fit_res(r, n)) for (proxy, _), r, n in zip(instructions, replies, sizes)]
    params, _ = strategy.aggregate_fit(1, results, [])
    return parameters_to_ndarrays(params)


def test_recording_clips_before_fedavg(tmp_path):
    strategy, _ = recorder(tmp_path, screening="clip", **{"screen-clip-multiple": 2.0})
    agg = one_round(strategy, [A, B, C], [1, 1, 2])
    c_clipped = client(0.0, [0.0, 10.0])  # C scaled by 10/30
    want_vector = (A[1] + B[1] + 2 * c_clipped[1]) / 4
    np.testing.assert_allclose(agg[1], want_vector, rtol=1e-6)
    np.testing.assert_allclose(agg[0], (A[0] + B[0] + 2 * C[0]) / 4, rtol=1e-6)
    plain, _ = recorder(tmp_path / "plain")
    assert agg[2] == one_round(plain, [A, B, C], [1, 1, 2])[2]  # integer buffer aggregated as sent
    row = strategy.row
    assert row["num_clipped"] == 1 and row["num_rejected"] == 0 and row["num_clients"] == 3
    assert row["screen_bound"] == pytest.approx(10.0) and row["screen_median_norm"] == pytest.approx(5.0)


def test_recording_rejects_and_names_the_node(tmp_path, caplog):
    strategy, _ = recorder(tmp_path, screening="reject", **{"screen-reject-multiple": 2.0})
    with caplog.at_level(logging.WARNING, logger="flwr.fl_drift"):
        agg = one_round(strategy, [A, B, C], [1, 1, 2])
    np.testing.assert_allclose(agg[1], (A[1] + B[1]) / 2, rtol=1e-6)
    assert strategy.row["num_rejected"] == 1 and strategy.row["num_clients"] == 2
    assert strategy.row["num_clipped"] == 0
    assert any("node 2" in r.getMessage() and "screening = reject" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", ["median", "trimmed-mean"])
def test_recording_robust_aggregate_replaces_the_mean(tmp_path, mode):
    vectors = [[1.0, -5.0], [2.0, 0.0], [100.0, 1.0], [3.0, 2.0], [-50.0, 3.0]]
    replies = [client(float(k), v) for k, v in enumerate(vectors)]
    strategy, _ = recorder(tmp_path, screening=mode)
    agg = one_round(strategy, replies, [10, 1, 1, 1, 1])  # n_k no longer matters
    want = [2.0, 1.0]  # median of both columns; trimmed mean of the middle three (1,2,3), (0,1,2)
    np.testing.assert_allclose(agg[1], want, rtol=1e-6)
    np.testing.assert_allclose(agg[0], np.full((2, 2), 3.0), rtol=1e-6)
    assert strategy.row["num_clipped"] == 0 and strategy.row["screen_bound"] == ""


def test_no_screening_leaves_fedavg_and_the_columns(tmp_path):
    strategy, _ = recorder(tmp_path)
    agg = one_round(strategy, [A, B, C], [1, 1, 2])
    np.testing.assert_allclose(agg[1], (A[1] + B[1] + 2 * C[1]) / 4, rtol=1e-6)
    assert "num_clipped" not in strategy.row


def test_metrics_csv_has_the_screening_columns(tmp_path):
    strategy, _ = recorder(tmp_path, screening="clip", **{"screen-clip-norm": 4.0})
    strategy.inner.evaluate_fn = lambda rnd, arrays, config: (0.5, {"accuracy": 0.25})
    one_round(strategy, [A, B, C], [1, 1, 1])
    strategy.evaluate(1, ndarrays_to_parameters(W_T))
    row = read_metrics(tmp_path / "run")[0]
    assert row["num_clipped"] == 2 and row["screen_bound"] == 4.0 and row["num_rejected"] == 0


# ------------------------------------------------------------------------ per-method capability
# No list of method names: each registered strategy class declares its decision (SCREENING),
# and the maths is checked against the declaration.
STRATEGIES = sorted({m.strategy for m in METHODS.values()}, key=lambda cls: cls.__name__)
MEAN_MODES = {"median", "trimmed-mean"}  # replace a mean of the client weights


@pytest.mark.parametrize("cls", STRATEGIES, ids=lambda cls: cls.__name__)
def test_every_registered_strategy_decides_its_screening(cls):
    """SCREENING in the class's own body, so that support for median is a decision, not a
    default inherited from the class it extends; a refusal says why."""
    assert "SCREENING" in vars(cls), (
        f"{cls.__name__} inherits SCREENING: declare REPLIES_ONLY or MEAN_OF_WEIGHTS (strategies/base.py) in its body")
    modes = set(cls.SCREENING)
    assert modes <= {"clip", "reject"} | MEAN_MODES
    assert not modes & MEAN_MODES or modes >= MEAN_MODES, "median and trimmed-mean come together"
    if modes != {"clip", "reject"} | MEAN_MODES:
        assert cls.SCREENING_WHY, f"{cls.__name__} refuses some screening without saying why"


class FirstReply(DriftFedAvg):
    """Not a mean: the new model is the first reply."""

    def aggregate_fit(self, server_round, results, failures):
        return results[0][1].parameters, {}


def test_the_probe_tells_a_mean_from_another_server():
    cfg = validate_config({"dataset": "synthetic", "model": "logreg", "fraction-fit": 1.0, "min-fit-clients": 3,
                           "min-available-clients": 3})
    assert depends_only_on_the_mean(DriftFedAvg, cfg)
    assert not depends_only_on_the_mean(FirstReply, cfg)


@pytest.mark.parametrize("cls", [c for c in STRATEGIES if MEAN_MODES <= set(c.SCREENING)], ids=lambda c: c.__name__)
def test_a_server_that_allows_median_is_a_mean_of_the_weights(cls):
    """median / trimmed-mean replace every reply's weights by one robust value, which is right
    only where the server's new model depends on the replies through their mean alone (the mean
    itself, or a step from w_t towards it); a server that is not such a mean must refuse them."""
    assert depends_only_on_the_mean(cls, probe_config(cls)), (
        f"{cls.__name__} declares median but its aggregation is not a mean of the client weights")


@pytest.mark.parametrize("name", list(METHODS))
def test_every_unsupported_mode_is_refused_at_validation(name):
    """Each method refuses, naming itself and its choices, every mode its strategy does not allow."""
    allowed = set(allowed_modes(METHODS[name].strategy))
    for mode in sorted(({"clip", "reject"} | MEAN_MODES) - allowed):
        with pytest.raises(ConfigError) as err:
            resolve({"strategy": name, "screening": mode})
        msg = str(err.value)
        assert f"'screening' = {mode!r}" in msg and name in msg and "valid choices for it: none" in msg


def test_screening_keys_validated():
    with pytest.raises(ConfigError, match="valid choices: none, clip, reject, median, trimmed-mean, krum, "
                                          "multi-krum, bulyan"):
        validate_config({"screening": "geomed"})
    with pytest.raises(ConfigError, match="screen-reject-multiple"):
        validate_config({"screen-reject-multiple": 0.5})
    with pytest.raises(ConfigError, match="screen-clip-multiple"):
        validate_config({"screen-clip-multiple": 0.0})
    with pytest.raises(ConfigError, match="screen-trim"):
        validate_config({"screen-trim": 0.5})
    assert math.isclose(validate_config({"screening": "clip", "screen-clip-norm": 2})["screen-clip-norm"], 2.0)


def test_fedbn_local_bn_entries_are_not_screened(tmp_path):
    from protocol.layout import bn_indices
    from strategies.fedbn import FedBNStrategy
    from tasks.datasets import input_shape
    from tasks.models import build_model

    cfg = validate_config({"strategy": "fedbn", "model": "cnn-bn", "screening": "clip"})
    inner = FedBNStrategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(W_T), None))
    strategy = RoundByRound(inner, cfg, tmp_path / "run", num_rounds=1)
    bn = bn_indices(build_model("cnn-bn", input_shape("mnist")))
    assert bn and strategy.screening.skip == frozenset(bn)
