"""FedSWA (Liu et al., ICML 2025): the in-round linear rate decay against hand computations
(float64, the one-weight model: plain SGD with weight decay, heavy-ball momentum, and Adam against
torch.optim stepped at each rate), a flat schedule as FedAvg bit for bit, each term active, the
server's lookahead step by hand (unweighted, buffers the plain mean), the cohort against the
per-client path, the bad keys refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from clients import fedavg, fedswa
from clients.swa import linear_decay
from fl_app.registry import validate_config
from protocol.keys import ConfigError
from strategies.fedswa import FedSWAStrategy
from tasks.functional.core import Hyper
from tests.kit import FakeManager, assert_cohort_matches, fit_res
from tests.kit_training import linear_round, values

W_T, LR, STEPS = (0.2, -0.1), 0.5, 3
KEYS = {"fedswa-rho": 0.1, "fedswa-lr-multiplier": 2.0}


def softmax_grad(w):
    """The hand model's cross-entropy gradient softmax(w) - e_0 (x = 1, label 0)."""
    e = np.exp(np.asarray(w) - max(w))
    return e / e.sum() - np.array([1.0, 0.0])


def rates(lr=LR, rho=0.1, peak=2.0, steps=STEPS):
    """eta_k = peak * lr * (1 - (1 - rho) k / K), k = 0..K-1, written out."""
    return [peak * lr * (1 - (1 - rho) * k / steps) for k in range(steps)]


def test_schedule_by_hand():
    assert linear_decay(4, 0.2, 2.0) == pytest.approx([2.0, 1.6, 1.2, 0.8])
    assert linear_decay(2, 0.0) == pytest.approx([1.0, 0.5])
    assert linear_decay(5, 1.0) is None and linear_decay(1, 0.3) is None and linear_decay(0, 0.1) is None
    assert fedswa.fedswa_schedule(4, Hyper(lr=1.0, keys=KEYS)) == pytest.approx([2.0, 1.55, 1.1, 0.65])


def test_client_steps_match_hand_computation_with_weight_decay():
    wd, w = 0.1, np.array(W_T)
    for eta in rates():
        w = w - eta * (softmax_grad(w) + wd * w)  # the rate scales the whole step, weight decay too
    result = linear_round(fedswa.UPDATE, KEYS, W_T, epochs=STEPS, weight_decay=wd)
    assert values(result.params) == pytest.approx(w.tolist(), abs=1e-12)
    assert result.metrics["num_steps"] == STEPS and result.state == {} and result.reply == {}


def test_momentum_steps_at_each_rate_as_torch_sgd():
    """Heavy ball at a changing rate: b = beta b + g, w -= eta_k b (torch.optim.SGD's, whose
    buffer does not depend on the rate)."""
    beta, w, b = 0.5, np.array(W_T), np.zeros(2)
    for k, eta in enumerate(rates()):
        b = softmax_grad(w) if k == 0 else beta * b + softmax_grad(w)
        w = w - eta * b
    result = linear_round(fedswa.UPDATE, KEYS, W_T, epochs=STEPS, momentum=beta)
    assert values(result.params) == pytest.approx(w.tolist(), abs=1e-12)


def test_adam_steps_at_each_rate_as_torch_adam():
    weight = torch.nn.Parameter(torch.tensor([[W_T[0]], [W_T[1]]], dtype=torch.float64))
    opt = torch.optim.Adam([weight], lr=1.0)
    for eta in rates():
        opt.param_groups[0]["lr"] = eta
        opt.zero_grad()
        torch.nn.functional.cross_entropy(weight.T, torch.tensor([0])).backward()
        opt.step()
    result = linear_round(fedswa.UPDATE, KEYS, W_T, epochs=STEPS, optimizer="adam")
    assert values(result.params) == pytest.approx(weight.detach().flatten().tolist(), abs=1e-12)


def test_a_flat_schedule_is_fedavg_bit_for_bit_and_each_term_acts():
    plain = linear_round(fedavg.UPDATE, {}, W_T, epochs=STEPS)
    flat = linear_round(fedswa.UPDATE, {"fedswa-rho": 1.0, "fedswa-lr-multiplier": 1.0}, W_T, epochs=STEPS)
    assert torch.equal(flat.params["weight"], plain.params["weight"])
    code = linear_round(fedswa.UPDATE, {"fedswa-rho": 0.0, "fedswa-lr-multiplier": 2.0}, W_T, epochs=STEPS)
    decay_only = linear_round(fedswa.UPDATE, {"fedswa-rho": 0.0, "fedswa-lr-multiplier": 1.0}, W_T, epochs=STEPS)
    doubled_only = linear_round(fedswa.UPDATE, {"fedswa-rho": 1.0, "fedswa-lr-multiplier": 2.0}, W_T, epochs=STEPS)
    for a, b in ((plain, decay_only), (plain, doubled_only), (decay_only, code), (doubled_only, code)):
        assert np.abs(np.subtract(values(a.params), values(b.params))).max() > 1e-2


def _strategy(alpha):
    part = FedSWAStrategy.SERVER.parts["lookahead"].part([True, False], alpha)
    return FedSWAStrategy(parts={"lookahead": part}, num_state=2, fraction_fit=1.0, min_fit_clients=2,
                          min_available_clients=2, accept_failures=True)


def test_server_lookahead_step_by_hand():
    w_t = [np.array([[0.2], [-0.1]]), np.array([1.0, 2.0])]  # a weight and a float buffer
    replies = [[np.array([[0.1], [0.1]]), np.array([3.0, 2.0])], [np.array([[0.5], [-0.6]]), np.array([5.0, 0.0])]]
    for alpha, want in ((1.5, [[0.35], [-0.325]]), (1.0, [[0.3], [-0.25]])):
        strategy = _strategy(alpha)
        instructions = strategy.configure_fit(1, ndarrays_to_parameters(w_t), FakeManager(2))
        assert len(parameters_to_ndarrays(instructions[0][1].parameters)) == 2  # the weights alone
        results = [(instructions[k][0], fit_res(r, n)) for k, (r, n) in enumerate(zip(replies, (6, 10)))]
        params, _ = strategy.aggregate_fit(1, results, [])
        new = parameters_to_ndarrays(params)
        # unweighted mean (0.3, -0.25) (6 and 10 examples do not weight it); w_t + alpha (mean - w_t)
        np.testing.assert_allclose(new[0], np.array(want), atol=1e-12)
        np.testing.assert_allclose(new[1], [4.0, 1.0], atol=1e-12)  # the buffer: the plain mean, whatever alpha
        assert strategy.get_state() == {}


def test_cohort_equals_per_client():
    assert_cohort_matches(fedswa.UPDATE, KEYS)


def test_bad_values_are_refused_in_one_line():
    base = {"strategy": "fedswa", "dataset": "synthetic", "model": "logreg"}
    for key, value, allowed in (("fedswa-rho", 1.5, r"\[0, 1\]"), ("fedswa-lr-multiplier", 0.0, "> 0"),
                                ("fedswa-alpha", -1.0, "> 0")):
        with pytest.raises(ConfigError, match=f"{key}.*{allowed}") as info:
            validate_config({**base, key: value})
        assert "\n" not in str(info.value)
