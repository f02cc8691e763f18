"""FedDC (Gao et al., CVPR 2022): the client step with the drift penalty and the control-variate
correction, h_i, c_i and delta c_i, and the server's H, model and c against the research
note's hand computation (float64); the reductions to FedDyn (c = c_i = 0) and SCAFFOLD
(alpha = 0, h = 0); the clip; state across rounds, the cohort path and a resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from clients import feddc, feddyn, scaffold
from strategies.feddc import FedDCStrategy
from tests.kit import FakeManager, assert_cohort_matches, assert_same_rounds, crash_and_resume, fit_res, make_client
from tests.kit_training import linear_round, values, weight

THETA, H, C, CI = (0.2, -0.1), (0.04, -0.02), (0.03, -0.01), (-0.02, 0.04)
KEYS = {"feddc-alpha": 0.1, "feddc-clip-norm": 0.0}
W_K = (0.5184520117, -0.4204020117)


def _round(keys=KEYS, h=H, ci=CI, c=C, epochs=2):
    return linear_round(feddc.UPDATE, keys, THETA, state={"h": weight(h), "ci": weight(ci)},
                        server={"c": weight(c)}, epochs=epochs)


def test_client_round_matches_hand_computation():
    result = _round()
    assert values(result.params) == pytest.approx(W_K, abs=1e-9)
    assert values(result.state["h"]) == pytest.approx((0.3584520117, -0.3404020117), abs=1e-9)
    assert values(result.state["ci"]) == pytest.approx((-0.3684520117, 0.3704020117), abs=1e-9)
    assert values(result.reply["delta_c"]) == pytest.approx((-0.3484520117, 0.3304020117), abs=1e-9)
    assert result.metrics["feddc_h_norm"] == pytest.approx(np.hypot(0.3584520117, 0.3404020117), rel=1e-9)


def test_without_control_variates_it_is_the_feddyn_client():
    zero = (0.0, 0.0)
    first = _round(h=zero, ci=zero, c=zero)  # round 1: bit for bit
    dyn = linear_round(feddyn.UPDATE, {"feddyn-alpha": 0.1}, THETA)
    assert torch.equal(first.params["weight"], dyn.params["weight"])
    later = _round(ci=zero, c=zero)  # with h: FedDyn keeps g_k = -alpha h, equal to rounding
    dyn = linear_round(feddyn.UPDATE, {"feddyn-alpha": 0.1}, THETA, state={"grad": weight((-0.004, 0.002))})
    assert values(later.params) == pytest.approx(values(dyn.params), abs=1e-15)
    assert values(later.state["h"]) == pytest.approx([-g / 0.1 for g in values(dyn.state["grad"])], abs=1e-12)


def test_without_the_drift_penalty_it_is_the_scaffold_client():
    mine = _round(keys={**KEYS, "feddc-alpha": 0.0}, h=(0.0, 0.0))
    theirs = linear_round(scaffold.UPDATE, {}, THETA, state={"ci": weight(CI)}, server={"c": weight(C)})
    assert torch.equal(mine.params["weight"], theirs.params["weight"])
    assert torch.equal(mine.state["ci"]["weight"], theirs.state["ci"]["weight"])
    assert torch.equal(mine.reply["delta_c"]["weight"], theirs.reply["delta_c"]["weight"])


def test_clip_scales_the_whole_step_down():
    d = np.array([-0.3715574832, 0.3735574832])  # step 1's d (note): norm 0.5269
    clip = 0.3
    result = _round(keys={**KEYS, "feddc-clip-norm": clip}, epochs=1)
    want = np.array(THETA) - 0.5 * d * clip / (np.linalg.norm(d) + 1e-6)
    assert values(result.params) == pytest.approx(want, abs=1e-9)
    loose = _round(keys={**KEYS, "feddc-clip-norm": 10.0}, epochs=1)  # above the norm: never scaled up
    assert values(loose.params) == pytest.approx(np.array(THETA) - 0.5 * d, abs=1e-9)


def _column(pair):
    return np.array(pair, dtype=np.float64).reshape(2, 1)


def feddc_server(**kwargs) -> FedDCStrategy:
    """FedDC's server, alpha 0.1, for the one-entry (2, 1) model of these tests."""
    parts = FedDCStrategy.SERVER.parts
    return FedDCStrategy(parts={"cv": parts["cv"].part([(2, 1)]), "memory": parts["memory"].part([True], 0.1)},
                         num_state=1, **kwargs)


def test_server_h_model_and_c_by_hand():
    strategy = feddc_server(fraction_fit=0.25, min_fit_clients=1, min_available_clients=1, accept_failures=True)
    strategy.memory.H = [_column(H) / 4]  # the one client with history is the one that replies
    strategy.cv.c = [_column(C).astype(np.float32)]
    instructions = strategy.configure_fit(2, ndarrays_to_parameters([_column(THETA)]), FakeManager(4))
    assert len(instructions) == 1
    sent = parameters_to_ndarrays(instructions[0][1].parameters)
    np.testing.assert_array_equal(sent[1], strategy.cv.c[0])  # c after the weights
    delta_c = _column((-0.3484520117, 0.3304020117))
    params, metrics = strategy.aggregate_fit(2, [(instructions[0][0], fit_res([_column(W_K), delta_c], 7))], [])
    new = parameters_to_ndarrays(params)
    assert len(new) == 1  # the model never carries c
    np.testing.assert_allclose(strategy.memory.H[0], _column((0.0896130029, -0.0851005029)), atol=1e-10)
    np.testing.assert_allclose(new[0], _column((0.6080650146, -0.5055025146)), atol=1e-10)
    np.testing.assert_allclose(strategy.cv.c[0], _column((-0.0571130029, 0.0726005029)), atol=1e-7)
    assert metrics["feddc_H_norm"] == pytest.approx(np.hypot(0.0896130029, 0.0851005029), rel=1e-9)
    assert metrics["cv_norm"] == pytest.approx(np.hypot(0.0571130029, 0.0726005029), rel=1e-6)
    restored = feddc_server()
    restored.set_state(strategy.get_state())
    np.testing.assert_array_equal(restored.memory.H[0], strategy.memory.H[0])
    np.testing.assert_array_equal(restored.cv.c[0], strategy.cv.c[0])


def test_server_built_as_the_app_builds_it_divides_c_by_all_clients():
    """The strategy as the ServerApp builds it (``fl_app.registry.resolve``, then
    ``strategies.base.build_strategy``: the registered class's ``from_config``), not through
    its constructor's defaults: one round with 1 of 4 clients replying moves c by delta c_i / 4
    (SCAFFOLD's 1/N, the authors' code), H by (w_i - w_t) / 4 and the model to w_i + H. A class
    divisor of the round's participants would move c by delta c_i itself, 4x too far."""
    from fl_app.registry import resolve
    from strategies.base import build_strategy

    cfg, method = resolve({"strategy": "feddc", "dataset": "synthetic", "model": "logreg", "fraction-fit": 0.25,
                           "min-available-clients": 4})
    gen = np.random.default_rng(0)
    w_t = [a.astype(np.float32) for a in make_client(feddc.UPDATE, {}, torch.zeros(1, 60),
                                                      torch.zeros(1, dtype=torch.long)).get_parameters({})]
    w_t = [(a + gen.normal(0, 0.1, a.shape)).astype(np.float32) for a in w_t]
    strategy = build_strategy(method.strategy, cfg, ndarrays_to_parameters(w_t))
    assert type(strategy) is FedDCStrategy
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(w_t), FakeManager(4))
    assert len(instructions) == 1
    sent = parameters_to_ndarrays(instructions[0][1].parameters)
    assert len(sent) == 2 * len(w_t) and all(not c.any() for c in sent[len(w_t):])  # c starts at zero
    w_i = [(a + gen.normal(0, 0.1, a.shape)).astype(np.float32) for a in w_t]
    delta_c = [gen.normal(0, 0.1, a.shape).astype(np.float32) for a in w_t]
    params, _ = strategy.aggregate_fit(1, [(instructions[0][0], fit_res(w_i + delta_c, 7))], [])
    for c, d in zip(strategy.cv.c, delta_c):
        np.testing.assert_allclose(c, d.astype(np.float64) / 4, rtol=1e-6, atol=1e-9)
    for new, h, wi, wt in zip(parameters_to_ndarrays(params), strategy.memory.H, w_i, w_t):
        drift = (wi.astype(np.float64) - wt) / 4
        np.testing.assert_allclose(h, drift, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(new, wi + drift, rtol=1e-6, atol=1e-7)


def test_h_and_ci_carried_across_rounds_through_context_state():
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(9, 60, generator=gen), torch.randint(0, 10, (9,), generator=gen)
    overrides = {"strategy": "feddc", "feddc-alpha": 0.2, "learning-rate": 0.3, "batch-size": 4}
    client = make_client(feddc.UPDATE, overrides, x, y)
    w0 = client.get_parameters({})
    c = [np.full(a.shape, 0.01, np.float32) for a in w0]
    client.fit([a.copy() for a in w0] + c, {"server-round": 1})
    assert {"feddc-h", "cv-ci"} <= set(client.context.state)
    again = make_client(feddc.UPDATE, overrides, x, y, context=client.context)  # a new object, the node's state
    second, _, _ = again.fit([a.copy() for a in w0] + c, {"server-round": 2})
    fresh, _, _ = make_client(feddc.UPDATE, overrides, x, y).fit([a.copy() for a in w0] + c, {"server-round": 2})
    assert not np.allclose(second[0], fresh[0], atol=1e-6)  # round 2 used h_i and c_i


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_cohort_equals_the_per_client_rounds(clip):
    def states(shapes, k):
        gen = torch.Generator().manual_seed(20 + k)
        return {key: {n: 0.05 * torch.randn(s, generator=gen) for n, s in shapes.items()} for key in ("h", "ci")}

    def server(shapes):
        gen = torch.Generator().manual_seed(30)
        return {"c": {n: 0.05 * torch.randn(s, generator=gen) for n, s in shapes.items()}}

    assert_cohort_matches(feddc.UPDATE, {"feddc-alpha": 0.1, "feddc-clip-norm": clip}, states, server)


def test_resume_restores_client_and_server_state(tmp_path):
    """Rounds 3-4 of a run crashed after round 2 and resumed by a new server and new nodes equal
    an uninterrupted run's: H and c from the checkpoint, h_i and c_i from the clients' mirrors."""
    full, resumed = crash_and_resume({"strategy": "feddc", "feddc-alpha": 0.1}, tmp_path)
    assert float(full[1]["feddc_H_norm"]) > 0 and float(full[1]["cv_norm"]) > 0
    assert_same_rounds(full, resumed, ("feddc_H_norm", "cv_norm"), start=2)


def test_a_non_linear_optimiser_is_refused_in_one_line():
    from fl_app.registry import check_method
    from protocol.keys import ConfigError

    with pytest.raises(ConfigError, match="'optimizer' = 'adam' is invalid for strategy 'feddc'"):
        check_method({"strategy": "feddc", "dataset": "synthetic", "model": "logreg", "optimizer": "adam"})
