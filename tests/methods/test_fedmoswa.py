"""FedMoSWA (Liu et al., ICML 2025): the client's corrected steps at the decaying rate and its
c_i⁺ and reply against hand computations (float64, the one-weight model), the correction added
after the clip, ρ = 1 as SCAFFOLD's step bit for bit with another reply, each term active, the
server's lookahead step and momentum m by hand (both starts, checkpointed), the cohort against the
per-client path, the bad keys refused, and a crashed run resumed as the uninterrupted one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from clients import fedavg, fedmoswa, scaffold
from fl_app.registry import check_method, validate_config
from protocol.keys import ConfigError
from strategies.fedmoswa import FedMoSWAStrategy
from tests.kit import FakeManager, assert_cohort_matches, assert_same_rounds, crash_and_resume, fit_res
from tests.kit_training import linear_round, values, weight

W_T, M, CI, LR, STEPS, RHO = (0.2, -0.1), (0.3, -0.4), (0.1, 0.2), 0.5, 3, 0.1


def softmax_grad(w):
    """The hand model's cross-entropy gradient softmax(w) - e_0 (x = 1, label 0)."""
    e = np.exp(np.asarray(w) - max(w))
    return e / e.sum() - np.array([1.0, 0.0])


def hand_round(rho=RHO, clip=0.0):
    """(w_K, c_i+, the reply c_i+ - m): K steps w -= eta_k (clip(g) + m - c_i),
    eta_k = lr (1 - (1 - rho) k / K), then c_i+ = c_i - m + (w_t - w_K) / sum_k eta_k."""
    w, m, ci = np.array(W_T), np.array(M), np.array(CI)
    etas = [LR * (1 - (1 - rho) * k / STEPS) for k in range(STEPS)]
    for eta in etas:
        g = softmax_grad(w)
        if clip:
            g = g * min(1.0, clip / (np.linalg.norm(g) + 1e-6))
        w = w - eta * (g + m - ci)
    ci_new = ci - m + (np.array(W_T) - w) / sum(etas)
    return w, ci_new, ci_new - m


def run(keys, **options):
    return linear_round(fedmoswa.UPDATE, keys, W_T, epochs=STEPS, state={"ci": weight(CI)},
                        server={"c": weight(M)}, **options)


def test_client_round_matches_hand_computation():
    w, ci_new, sent = hand_round()
    result = run({"fedmoswa-rho": RHO})
    assert values(result.params) == pytest.approx(w.tolist(), abs=1e-12)
    assert values(result.state["ci"]) == pytest.approx(ci_new.tolist(), abs=1e-10)
    assert values(result.reply["delta_c"]) == pytest.approx(sent.tolist(), abs=1e-10)
    assert result.metrics["ci_norm"] == pytest.approx(float(np.linalg.norm(ci_new)), rel=1e-10)


def test_the_correction_is_added_after_the_clip():
    w, ci_new, _ = hand_round(clip=0.05)
    result = run({"fedmoswa-rho": RHO}, clip_norm=0.05)
    assert values(result.params) == pytest.approx(w.tolist(), abs=1e-12)
    assert values(result.state["ci"]) == pytest.approx(ci_new.tolist(), abs=1e-10)


def test_rho_one_is_scaffolds_step_with_the_reply_ci_plus_minus_m():
    ours = run({"fedmoswa-rho": 1.0})
    theirs = linear_round(scaffold.UPDATE, {"scaffold-correction": "direction"}, W_T, epochs=STEPS,
                          state={"ci": weight(CI)}, server={"c": weight(M)})
    assert torch.equal(ours.params["weight"], theirs.params["weight"])
    assert torch.equal(ours.state["ci"]["weight"], theirs.state["ci"]["weight"])
    _, ci_new, sent = hand_round(rho=1.0)
    assert values(ours.reply["delta_c"]) == pytest.approx(sent.tolist(), abs=1e-10)  # c_i+ - m
    assert values(theirs.reply["delta_c"]) == pytest.approx((ci_new - np.array(CI)).tolist(), abs=1e-10)


def test_each_term_acts():
    plain = linear_round(fedavg.UPDATE, {}, W_T, epochs=STEPS)
    first = linear_round(fedmoswa.UPDATE, {"fedmoswa-rho": 1.0}, W_T, epochs=STEPS)  # m = c_i = 0: FedAvg's step
    assert torch.equal(first.params["weight"], plain.params["weight"])
    corrected, decayed = run({"fedmoswa-rho": 1.0}), run({"fedmoswa-rho": RHO})
    for a, b in ((plain, corrected), (corrected, decayed)):
        assert np.abs(np.subtract(values(a.params), values(b.params))).max() > 1e-2


def _strategy(alpha=1.5, gamma=0.5, start="zero"):
    spec = FedMoSWAStrategy.SERVER.parts
    parts = {"lookahead": spec["lookahead"].part([True], alpha),
             "cv": spec["cv"].part([(2, 1)], "participants", gamma, start == "first-mean")}
    return FedMoSWAStrategy(parts=parts, num_state=1, fraction_fit=1.0, min_fit_clients=2, min_available_clients=2,
                            accept_failures=True)


def _column(pair):
    return np.array(pair, dtype=np.float64).reshape(2, 1)


def _round(strategy, t, w_t, sent):
    instructions = strategy.configure_fit(t, ndarrays_to_parameters([_column(w_t)]), FakeManager(2))
    weights = [(0.1, 0.1), (0.5, -0.6)]  # mean (0.3, -0.25)
    results = [(instructions[k][0], fit_res([_column(weights[k]), _column(sent[k])], n))
               for k, n in enumerate((6, 10))]
    params, metrics = strategy.aggregate_fit(t, results, [])
    return instructions, parameters_to_ndarrays(params)[0], metrics


SENT = [(0.2, -0.2), (0.6, 0.4)]  # mean (0.4, 0.1)


def test_server_step_and_momentum_by_hand():
    strategy = _strategy(alpha=1.5, gamma=0.5, start="zero")
    instructions, new, metrics = _round(strategy, 1, W_T, SENT)
    assert not parameters_to_ndarrays(instructions[0][1].parameters)[1].any()  # m = 0 in round 1
    np.testing.assert_allclose(new, _column((0.35, -0.325)), atol=1e-12)  # w_t + 1.5 (mean - w_t), unweighted
    np.testing.assert_allclose(strategy.cv.c[0], _column((0.2, 0.05)), rtol=1e-6)  # 0 + 0.5 (0.4, 0.1)
    assert metrics["cv_norm"] == pytest.approx(np.hypot(0.2, 0.05), rel=1e-6)
    instructions, _, _ = _round(strategy, 2, W_T, SENT)
    np.testing.assert_allclose(parameters_to_ndarrays(instructions[0][1].parameters)[1], _column((0.2, 0.05)),
                               rtol=1e-6)  # m sent after the weights
    np.testing.assert_allclose(strategy.cv.c[0], _column((0.4, 0.1)), rtol=1e-6)  # + 0.5 (0.4, 0.1)


def test_first_mean_start_takes_the_first_mean_and_resumes_started():
    strategy = _strategy(alpha=1.0, gamma=0.5, start="first-mean")
    _, new, _ = _round(strategy, 1, W_T, SENT)
    np.testing.assert_allclose(new, _column((0.3, -0.25)), atol=1e-12)  # alpha = 1: the plain mean
    np.testing.assert_allclose(strategy.cv.c[0], _column((0.4, 0.1)), rtol=1e-6)  # gamma = 1 the first time
    fresh = _strategy(alpha=1.0, gamma=0.5, start="first-mean")
    fresh.set_state(strategy.get_state())
    assert set(strategy.get_state()) == {"cv-c", "cv-started"} and fresh.cv.started
    for s in (strategy, fresh):
        _round(s, 2, W_T, SENT)
        np.testing.assert_allclose(s.cv.c[0], _column((0.6, 0.15)), rtol=1e-6)  # then + 0.5 (0.4, 0.1)


def test_cohort_equals_per_client():
    def states(shapes, k):
        gen = torch.Generator().manual_seed(20 + k)
        return {"ci": {n: 0.1 * torch.randn(s, generator=gen) for n, s in shapes.items()}}

    def server(shapes):
        gen = torch.Generator().manual_seed(1)
        return {"c": {n: 0.1 * torch.randn(s, generator=gen) for n, s in shapes.items()}}
    assert_cohort_matches(fedmoswa.UPDATE, {"fedmoswa-rho": RHO}, states=states, server=server)


def test_bad_values_are_refused_in_one_line():
    base = {"strategy": "fedmoswa", "dataset": "synthetic", "model": "logreg"}
    for key, value, allowed in (("fedmoswa-rho", -0.1, r"\[0, 1\]"), ("fedmoswa-gamma", 0.0, r"\(0, 1\]"),
                                ("fedmoswa-alpha", 0.0, "> 0"), ("fedmoswa-m-init", "mean", "first-mean")):
        with pytest.raises(ConfigError, match=f"{key}.*{allowed}") as info:
            validate_config({**base, key: value})
        assert "\n" not in str(info.value)


def test_adam_is_refused_before_training():
    with pytest.raises(ConfigError, match="optimizer.*adam.*fedmoswa.*valid choices: sgd"):
        check_method({"strategy": "fedmoswa", "dataset": "synthetic", "model": "logreg", "optimizer": "adam"})


def test_resume_sends_the_same_momentum(tmp_path):
    full, resumed = crash_and_resume({"strategy": "fedmoswa", "fedmoswa-rho": 0.1}, tmp_path)
    assert_same_rounds(full, resumed, ("cv_norm",), start=2)
