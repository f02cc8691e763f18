"""FedACG (Kim, Kim, Han, CVPR 2024): the client step at the look-ahead point and the server's
momentum against the research note's hand computation (float64), the reductions to FedProx,
buffers never extrapolated, the look-ahead as w_t of the drift columns and screening, the
cohort against the per-client path, and a resume that sends the same look-ahead."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from clients import fedacg, fedprox
from fl_app.server.server import DriftServer
from strategies.fedacg import FedACGStrategy
from tests.kit import FakeManager, assert_cohort_matches, assert_same_rounds, crash_and_resume, fit_res
from tests.kit_training import linear_round, values

THETA, M, LAM = (0.2, -0.1), (0.1, -0.05), 0.85
LOOKAHEAD = (0.285, -0.1425)  # theta + lambda m
W_A = (0.6152715016, -0.4727715016)  # the client's reply from the look-ahead (beta 0.2, lr 0.5, K = 2)


def test_client_step_matches_hand_computation():
    result = linear_round(fedacg.UPDATE, {"fedacg-beta": 0.2}, LOOKAHEAD)
    assert values(result.params) == pytest.approx(W_A, abs=1e-9)
    assert result.metrics["num_steps"] == 2 and result.state == {} and result.reply == {}
    # the beta term acted at step 2 (at step 1 w = the look-ahead, the term is 0): plain SGD differs
    plain = linear_round(fedacg.UPDATE, {"fedacg-beta": 0.0}, LOOKAHEAD)
    assert abs(values(plain.params)[0] - W_A[0]) > 1e-3


def test_client_is_fedprox_anchored_at_the_received_point_bit_for_bit():
    a = linear_round(fedacg.UPDATE, {"fedacg-beta": 0.2}, LOOKAHEAD)
    b = linear_round(fedprox.UPDATE, {"proximal-mu": 0.2}, LOOKAHEAD)
    assert torch.equal(a.params["weight"], b.params["weight"])


def _strategy(lam=LAM, trainable=(True,)):
    return FedACGStrategy(lam=lam, trainable=list(trainable), fraction_fit=1.0, min_fit_clients=2,
                          min_available_clients=2, accept_failures=True)


def _column(pair):
    return np.array(pair, dtype=np.float64).reshape(2, 1)


def _sent(strategy, server_round, theta):
    instructions = strategy.configure_fit(server_round, ndarrays_to_parameters(theta), FakeManager(2))
    return instructions, [parameters_to_ndarrays(ins.parameters) for _, ins in instructions]


def test_server_sends_the_look_ahead_and_updates_the_momentum_by_hand():
    strategy = _strategy()
    strategy.m = [_column(M)]
    instructions, sent = _sent(strategy, 2, [_column(THETA)])
    for arrays in sent:
        np.testing.assert_allclose(arrays[0], _column(LOOKAHEAD), atol=1e-15)
    w_b = (0.185, -0.0425)  # the look-ahead + (-0.1, 0.1)
    results = [(instructions[0][0], fit_res([_column(W_A)], 10)), (instructions[1][0], fit_res([_column(w_b)], 30))]
    params, metrics = strategy.aggregate_fit(2, results, [])
    new = parameters_to_ndarrays(params)[0]
    # the unweighted mean (10 and 30 examples must not matter), not the look-ahead
    np.testing.assert_allclose(new, _column((0.4001357508, -0.2576357508)), atol=1e-10)
    np.testing.assert_allclose(strategy.m[0], _column((0.2001357508, -0.1576357508)), atol=1e-10)
    np.testing.assert_allclose(new, _column(THETA) + strategy.m[0], atol=1e-12)  # theta^t = theta^{t-1} + m^t
    assert metrics["fedacg_m_norm"] == pytest.approx(np.hypot(0.2001357508, 0.1576357508), rel=1e-9)
    _, sent = _sent(strategy, 3, [new])
    np.testing.assert_allclose(sent[0][0], _column((0.5702511390, -0.3916261390)), atol=1e-10)


def test_lambda_zero_is_the_plain_mean_and_sends_the_model():
    strategy = _strategy(lam=0.0)
    theta = [_column(THETA)]
    for server_round in (1, 2):
        instructions, sent = _sent(strategy, server_round, theta)
        np.testing.assert_array_equal(sent[0][0], theta[0])
        replies = [_column((0.5, -0.5)), _column((0.1, 0.3))]
        params, _ = strategy.aggregate_fit(server_round, [(p, fit_res([r], n)) for (p, _), r, n
                                                          in zip(instructions, replies, (1, 9))], [])
        theta = parameters_to_ndarrays(params)
        np.testing.assert_allclose(theta[0], _column((0.3, -0.1)), atol=1e-15)


def test_buffers_take_the_plain_mean_and_are_never_extrapolated():
    strategy = _strategy(trainable=(True, False, False))
    theta = [_column(THETA), np.array([1.0, 2.0]), np.array(7, dtype=np.int64)]
    strategy.m = [_column(M), np.zeros(2), np.zeros(())]
    instructions, sent = _sent(strategy, 2, theta)
    np.testing.assert_array_equal(sent[0][1], theta[1])
    assert sent[0][2] == 7 and sent[0][2].dtype == np.int64
    replies = [[_column(W_A), np.array([3.0, 0.0]), np.array(9)], [_column(W_A), np.array([5.0, 4.0]), np.array(10)]]
    params, _ = strategy.aggregate_fit(2, [(p, fit_res(r, 1)) for (p, _), r in zip(instructions, replies)], [])
    new = parameters_to_ndarrays(params)
    np.testing.assert_array_equal(new[1], [4.0, 2.0])
    assert new[2] == 10 and new[2].dtype == np.int64  # 9.5 rounded to even, an integer as sent
    assert not np.any(strategy.m[1]) and not np.any(strategy.m[2])


def test_a_non_finite_round_leaves_the_momentum_unchanged():
    strategy = _strategy()
    strategy.m = [_column(M)]
    instructions, _ = _sent(strategy, 2, [_column(THETA)])
    bad = [(p, fit_res([_column((np.nan, 0.0))], 1)) for p, _ in instructions]
    strategy.aggregate_fit(2, bad, [])
    np.testing.assert_array_equal(strategy.m[0], _column(M))


def test_checkpoint_state_round_trips_and_refuses_another_model():
    strategy = _strategy()
    strategy.m = [_column(M)]
    restored = _strategy()
    restored.set_state(strategy.get_state())
    _, a = _sent(strategy, 2, [_column(THETA)])
    _, b = _sent(restored, 2, [_column(THETA)])
    np.testing.assert_array_equal(a[0][0], b[0][0])
    assert _strategy().get_state() == {}  # nothing before the first aggregation
    with pytest.raises(ValueError, match="does not match this model"):
        _sent(restored, 3, [np.zeros((3, 1))])


def test_drift_columns_and_screening_measure_from_the_look_ahead():
    """The server's w_t is the model its instructions carry (the look-ahead), without the arrays a
    method appends after the model."""
    strategy = _strategy()
    strategy.m = [_column(M)]
    theta = ndarrays_to_parameters([_column(THETA)])
    instructions = strategy.configure_fit(2, theta, FakeManager(2))
    with_extra = [(p, types.SimpleNamespace(parameters=ndarrays_to_parameters(
        parameters_to_ndarrays(ins.parameters) + [np.ones(3)]))) for p, ins in instructions]
    server = types.SimpleNamespace(parameters=theta)
    sent = parameters_to_ndarrays(DriftServer.model_sent(server, with_extra))
    assert len(sent) == 1
    np.testing.assert_allclose(sent[0], _column(LOOKAHEAD), atol=1e-15)
    assert DriftServer.model_sent(server, []) is theta


def test_cohort_equals_the_per_client_rounds():
    assert_cohort_matches(fedacg.UPDATE, {"fedacg-beta": 0.3})


def test_resume_sends_the_same_look_ahead(tmp_path):
    """m is checkpointed: rounds 3-4 of a run crashed after round 2 and resumed by a new server
    equal those of an uninterrupted run (without m the resumed server would send theta itself)."""
    full, resumed = crash_and_resume({"strategy": "fedacg", "fedacg-beta": 0.01}, tmp_path)
    assert float(full[1]["fedacg_m_norm"]) > 0
    assert_same_rounds(full, resumed, ("fedacg_m_norm",), start=2)
