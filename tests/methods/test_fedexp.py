"""FedExP (Jhunjhunwala, Wang, Joshi, ICLR 2023): the server's step size eta_g and new model
against the research note's hand computations (float64), its M * eps_t reading, buffers
averaged without extrapolation, the average of the last two models evaluated, and a resumed
run that evaluates the same averages."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from fl_app.registry import validate_config
from strategies.base import DriftFedAvg
from strategies.fedexp import FedExPStrategy
from tests.kit import FakeManager, assert_same_rounds, crash_and_resume, fit_res

E = np.eye(3)


def _strategy(epsilon=0.0, lr_decay=1.0, trainable=(True,), average_eval=True, evaluate_fn=None):
    return FedExPStrategy(epsilon=epsilon, average_eval=average_eval, lr_decay=lr_decay, trainable=list(trainable),
                          fraction_fit=1.0, min_fit_clients=3, min_available_clients=3, accept_failures=True,
                          evaluate_fn=evaluate_fn)


def _round(strategy, server_round, w_t, replies, sizes=(1, 1, 1)):
    """Round ``server_round`` from w_t (a list of arrays): the new model and eta_g."""
    instructions = strategy.configure_fit(server_round, ndarrays_to_parameters(w_t), FakeManager(len(replies)))
    results = [(p, fit_res(r, n)) for (p, _), r, n in zip(instructions, replies, sizes)]
    params, metrics = strategy.aggregate_fit(server_round, results, [])
    return parameters_to_ndarrays(params), metrics["fedexp_eta_g"]


def test_orthogonal_updates_extrapolate_by_hand():
    new, eta = _round(_strategy(), 2, [np.zeros(3)], [[E[k]] for k in range(3)])
    assert eta == pytest.approx(1.5, rel=1e-12)  # 0.5 * 1 / (1/3)
    np.testing.assert_allclose(new[0], [0.5, 0.5, 0.5], rtol=1e-12)


def test_epsilon_enters_as_m_times_epsilon():
    """The code's M * eps (0.5 / (1/3 + 3e-3)), not the paper's eps (0.5 / (1/3 + 1e-3) = 1.4955135)."""
    new, eta = _round(_strategy(epsilon=1e-3), 2, [np.zeros(3)], [[E[k]] for k in range(3)])
    assert eta == pytest.approx(1.4866204, abs=1e-7)
    np.testing.assert_allclose(new[0], np.full(3, 0.4955401), atol=1e-7)


def test_epsilon_decays_with_the_squared_lr_decay():
    _, eta = _round(_strategy(epsilon=1e-3, lr_decay=0.5), 3, [np.zeros(3)], [[E[k]] for k in range(3)])
    assert eta == pytest.approx(0.5 / (1 / 3 + 3 * 1e-3 * 0.5**4), rel=1e-12)


def test_example_weights_by_hand():
    new, eta = _round(_strategy(), 2, [np.zeros(3)], [[E[k]] for k in range(3)], sizes=(1, 1, 2))
    assert eta == pytest.approx(4 / 3, rel=1e-12)  # A = 1, ||(0.25, 0.25, 0.5)||^2 = 0.375
    np.testing.assert_allclose(new[0], [1 / 3, 1 / 3, 2 / 3], rtol=1e-12)


def test_identical_updates_are_fedavg():
    new, eta = _round(_strategy(), 2, [np.zeros(3)], [[E[0]]] * 3)
    assert eta == 1.0  # 0.5 clamped to 1
    np.testing.assert_array_equal(new[0], E[0])


def test_buffers_take_the_plain_mean_and_stay_out_of_the_norms():
    w_t = [np.zeros(3), np.array([0.0]), np.array(4, dtype=np.int64)]
    replies = [[E[k], np.array([k + 1.0]), np.array(4 + k)] for k in range(3)]
    new, eta = _round(_strategy(trainable=(True, False, False)), 2, w_t, replies)
    assert eta == pytest.approx(1.5, rel=1e-12)  # as without the buffer
    np.testing.assert_allclose(new[1], [2.0], rtol=1e-12)
    assert new[2] == 5 and new[2].dtype == np.int64


def test_the_average_of_the_last_two_models_is_evaluated():
    scored = []

    def evaluate_fn(server_round, arrays, config):
        scored.append((server_round, [a.copy() for a in arrays]))
        return 0.0, {}

    strategy = _strategy(evaluate_fn=evaluate_fn)
    w1, _ = _round(strategy, 1, [np.zeros(3)], [[E[k]] for k in range(3)])
    strategy.evaluate(1, ndarrays_to_parameters(w1))  # round 1: w_1 itself (w_0 never averaged in)
    w2, _ = _round(strategy, 2, w1, [[w1[0] + E[k]] for k in range(3)])
    strategy.evaluate(2, ndarrays_to_parameters(w2))
    np.testing.assert_allclose(w2[0], [1.0, 1.0, 1.0])
    np.testing.assert_allclose(scored[0][1][0], [0.5, 0.5, 0.5])
    np.testing.assert_allclose(scored[1][1][0], [0.75, 0.75, 0.75])  # (w_2 + w_1) / 2
    # the clients with a local test split score the same average
    instructions = strategy.configure_evaluate(2, ndarrays_to_parameters(w2), FakeManager(3))
    np.testing.assert_allclose(parameters_to_ndarrays(instructions[0][1].parameters)[0], [0.75, 0.75, 0.75])
    off = _strategy(average_eval=False, evaluate_fn=evaluate_fn)
    _round(off, 2, w1, [[w1[0] + E[k]] for k in range(3)])
    off.evaluate(2, ndarrays_to_parameters(w2))
    np.testing.assert_allclose(scored[-1][1][0], w2[0])


def test_keys_validated():
    cfg = validate_config({"strategy": "fedexp"})
    assert cfg["fedexp-epsilon"] == 1e-3 and cfg["fedexp-average-eval"] is True
    with pytest.raises(ValueError, match="fedexp-epsilon"):
        validate_config({"strategy": "fedexp", "fedexp-epsilon": 0.0})


def test_its_client_is_fedavgs():
    from clients import fedavg
    from fl_app.registry import get_method

    method = get_method("fedexp")
    assert method.update is fedavg.UPDATE and issubclass(method.strategy, DriftFedAvg)


def test_resume_evaluates_the_same_averages(tmp_path):
    """Rounds 3-4 of a run crashed after round 2 and resumed by a new server equal an
    uninterrupted run's: eta_g, and the test loss of the averaged model (round 3 averages w_3
    with the checkpointed w_2)."""
    # all 4 clients a round: with 2, logreg's two updates on synthetic data never disagree enough to extrapolate
    cfg = {"strategy": "fedexp", "fedexp-epsilon": 1e-4, "lr-decay": 0.9, "fraction-fit": 1.0}
    full, resumed = crash_and_resume(cfg, tmp_path)
    assert_same_rounds(full, resumed, ("fedexp_eta_g",), start=2)
    assert any(float(r["fedexp_eta_g"]) > 1 for r in full)  # it extrapolated
