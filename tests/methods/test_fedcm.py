"""FedCM (Xu et al., arXiv 2021): the client's mixed step and the server's mean-update step and
global direction against hand computations (float64, the one-weight model), α = 1 as FedAvg
bit for bit, the direction active (a different round from FedAvg's on the same batch), the
cohort against the per-client path, the config refusals, and a resume that sends the same Δ."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from clients import fedavg, fedcm
from fl_app.registry import validate_config
from protocol.keys import ConfigError
from strategies.fedcm import FedCMStrategy
from tests.kit import FakeManager, assert_cohort_matches, assert_same_rounds, crash_and_resume, fit_res
from tests.kit_training import linear_round, values, weight

W_T, DELTA, ALPHA, LR = (0.2, -0.1), (0.3, -0.4), 0.25, 0.5


def softmax_grad(w):
    """The hand model's cross-entropy gradient softmax(w) - e_0."""
    e = np.exp(np.asarray(w) - max(w))
    return e / e.sum() - np.array([1.0, 0.0])


def test_client_steps_match_hand_computation():
    w0, delta = np.array(W_T), np.array(DELTA)
    w1 = w0 - LR * (ALPHA * softmax_grad(w0) + (1 - ALPHA) * delta)
    w2 = w1 - LR * (ALPHA * softmax_grad(w1) + (1 - ALPHA) * delta)
    result = linear_round(fedcm.UPDATE, {"fedcm-alpha": ALPHA}, W_T, server={"delta": weight(DELTA)})
    assert values(result.params) == pytest.approx(w2.tolist(), abs=1e-12)
    assert result.metrics["num_steps"] == 2 and result.state == {} and result.reply == {}


def test_each_term_acts_and_alpha_one_is_fedavg_bit_for_bit():
    plain = linear_round(fedavg.UPDATE, {}, W_T)
    one = linear_round(fedcm.UPDATE, {"fedcm-alpha": 1.0}, W_T, server={"delta": weight(DELTA)})
    assert torch.equal(one.params["weight"], plain.params["weight"])
    no_delta = linear_round(fedcm.UPDATE, {"fedcm-alpha": ALPHA}, W_T)  # round 1: Δ absent, the step is α g
    with_delta = linear_round(fedcm.UPDATE, {"fedcm-alpha": ALPHA}, W_T, server={"delta": weight(DELTA)})
    w0 = np.array(W_T)
    w1 = w0 - LR * ALPHA * softmax_grad(w0)
    assert values(no_delta.params) == pytest.approx((w1 - LR * ALPHA * softmax_grad(w1)).tolist(), abs=1e-12)
    for a, b in ((plain, no_delta), (no_delta, with_delta)):
        assert np.abs(np.subtract(values(a.params), values(b.params))).max() > 1e-2


def _strategy(server_lr=0.8, lr=0.5, lr_decay=0.9, epochs=2, batch_size=4):
    spec = FedCMStrategy.SERVER.parts["momentum"]
    part = spec.part([(2, 1)], [True], server_lr, lr, lr_decay, epochs, batch_size)
    return FedCMStrategy(parts={"momentum": part}, num_state=1, fraction_fit=1.0, min_fit_clients=2,
                         min_available_clients=2, accept_failures=True)


def _column(pair):
    return np.array(pair, dtype=np.float64).reshape(2, 1)


def test_server_step_and_direction_by_hand():
    strategy = _strategy()
    instructions = strategy.configure_fit(2, ndarrays_to_parameters([_column(W_T)]), FakeManager(2))
    for _, ins in instructions:  # round 1's direction: zeros, after the weights
        sent = parameters_to_ndarrays(ins.parameters)
        assert len(sent) == 2 and not sent[1].any()
    w_a, w_b = (0.1, 0.1), (0.5, -0.6)  # updates (-0.1, 0.2) and (0.3, -0.5): mean (0.1, -0.15)
    results = [(instructions[0][0], fit_res([_column(w_a)], 6)), (instructions[1][0], fit_res([_column(w_b)], 10))]
    params, metrics = strategy.aggregate_fit(2, results, [])
    # unweighted (6 and 10 examples must not weight it): w_t + 0.8 * (0.1, -0.15)
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0], _column((0.28, -0.22)), atol=1e-12)
    # Δ = -(0.1, -0.15) / (eta_2 K), eta_2 = 0.5 * 0.9, K = 2 * mean(6, 10) / 4 = 4
    want = _column((-0.1 / 1.8, 0.15 / 1.8))
    np.testing.assert_allclose(strategy.momentum.delta[0], want, rtol=1e-6)
    assert metrics["fedcm_delta_norm"] == pytest.approx(np.hypot(0.1, 0.15) / 1.8, rel=1e-6)
    instructions = strategy.configure_fit(3, params, FakeManager(2))
    np.testing.assert_allclose(parameters_to_ndarrays(instructions[0][1].parameters)[1], want, rtol=1e-6)
    assert list(strategy.get_state()) == ["fedcm-delta"]
    fresh = _strategy()
    fresh.set_state(strategy.get_state())
    np.testing.assert_array_equal(fresh.momentum.delta[0], strategy.momentum.delta[0])


def test_cohort_equals_per_client():
    def server(shapes):
        gen = torch.Generator().manual_seed(1)
        return {"delta": {n: 0.1 * torch.randn(s, generator=gen) for n, s in shapes.items()}}
    assert_cohort_matches(fedcm.UPDATE, {"fedcm-alpha": 0.3}, server=server)


def test_bad_values_are_refused_in_one_line():
    base = {"strategy": "fedcm", "dataset": "synthetic", "model": "logreg"}
    with pytest.raises(ConfigError, match=r"fedcm-alpha.*\(0, 1\]"):
        validate_config({**base, "fedcm-alpha": 0.0})
    with pytest.raises(ConfigError, match="fedcm-server-lr"):
        validate_config({**base, "fedcm-server-lr": -1.0})


def test_resume_sends_the_same_direction(tmp_path):
    full, resumed = crash_and_resume({"strategy": "fedcm", "fedcm-alpha": 0.5}, tmp_path)
    assert_same_rounds(full, resumed, ("fedcm_delta_norm",), start=2)
