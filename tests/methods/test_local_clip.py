"""The run-wide clip of each local step (run-config ``local-clip-norm``,
``tasks.functional.rounds.make_step``): the authors' codes of FedDyn, FedDC, FedSMOO and FedACG
call ``clip_grad_norm_(max_norm=10)`` between ``backward`` and ``optimizer.step`` for every
method they run. Checked by hand on the one-weight-matrix model (float64), on a method's whole
direction (FedDC's, penalty and correction included), before weight decay, on the cohort path,
and from the run config to the client's ``Hyper``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients import fedavg, feddc, feddyn
from fl_app.config import ConfigError
from fl_app.registry import validate_config
from tasks.functional import Hyper
from tests.kit import assert_cohort_matches
from tests.kit_training import linear_round, values, weight

THETA = (0.2, -0.1)
LR = 0.5


def _grad(w) -> np.ndarray:
    """The cross-entropy gradient of the hand model at w (x = [1], y = 0): softmax(w) - e_0."""
    p = np.exp(np.array(w)) / np.exp(np.array(w)).sum()
    return p - np.array([1.0, 0.0])


def _fedavg(clip: float, epochs: int = 1, weight_decay: float = 0.0):
    return linear_round(fedavg.UPDATE, {}, THETA, lr=LR, epochs=epochs, weight_decay=weight_decay, clip_norm=clip)


def test_two_clipped_steps_by_hand():
    g1 = _grad(THETA)  # (-0.5744425168, 0.5744425168): norm 0.8124
    w1 = np.array(THETA) - LR * g1 * 0.3 / (np.linalg.norm(g1) + 1e-6)
    g2 = _grad(w1)
    w2 = w1 - LR * g2 * min(1.0, 0.3 / (np.linalg.norm(g2) + 1e-6))
    assert values(_fedavg(0.3, epochs=2).params) == pytest.approx(w2, abs=1e-12)
    assert np.linalg.norm(w1 - np.array(THETA)) == pytest.approx(LR * 0.3, rel=1e-5)


def test_a_clip_above_the_norm_and_zero_change_nothing():
    plain = linear_round(fedavg.UPDATE, {}, THETA)
    assert torch.equal(_fedavg(0.0, epochs=2).params["weight"], plain.params["weight"])
    assert torch.equal(_fedavg(10.0, epochs=2).params["weight"], plain.params["weight"])


def test_weight_decay_is_added_after_the_clip():
    g = _grad(THETA)
    want = np.array(THETA) - LR * (g * 0.3 / (np.linalg.norm(g) + 1e-6) + 0.1 * np.array(THETA))
    assert values(_fedavg(0.3, weight_decay=0.1).params) == pytest.approx(want, abs=1e-12)


def test_it_clips_the_methods_whole_direction():
    """FedDC's own clip (feddc-clip-norm) acts on its whole direction g + alpha (w - theta + h_i)
    + c - c_i: the run-wide clip at the same norm gives the same round, bit for bit."""
    keys = {"feddc-alpha": 0.1, "feddc-clip-norm": 0.0}
    state, server = {"h": weight((0.04, -0.02)), "ci": weight((-0.02, 0.04))}, {"c": weight((0.03, -0.01))}
    own = linear_round(feddc.UPDATE, {**keys, "feddc-clip-norm": 0.3}, THETA, state=state, server=server)
    run_wide = linear_round(feddc.UPDATE, keys, THETA, state=state, server=server, clip_norm=0.3)
    unclipped = linear_round(feddc.UPDATE, keys, THETA, state=state, server=server)
    assert torch.equal(run_wide.params["weight"], own.params["weight"])
    assert not torch.equal(run_wide.params["weight"], unclipped.params["weight"])


def test_cohort_matches_per_client_with_the_clip():
    assert_cohort_matches(fedavg.UPDATE, {}, sizes=(6, 4), clip_norm=0.05)


def test_the_run_config_reaches_the_clients_hyper_and_bad_values_are_refused():
    cfg = validate_config({"dataset": "synthetic", "model": "logreg", "local-clip-norm": 10})
    assert Hyper.from_config(cfg, 0.1).clip_norm == 10.0
    assert Hyper.from_config(validate_config({"dataset": "synthetic", "model": "logreg"}), 0.1).clip_norm == 0.0
    with pytest.raises(ConfigError, match="local-clip-norm"):
        validate_config({"local-clip-norm": -1.0})


# ---- a term's place in the step: FedDyn's alpha w after the clip, as the authors' weight_decay --------

def _authors_dynamic_step(alpha: float, g_k, clip: float, weight_decay: float = 0.0) -> np.ndarray:
    """One step of alpemreacar/FedDyn's (and FL-Simulator's FedDyn/FedSMOO/FedSpeed's) client by
    hand: the loss f(w) + <w, -(g_k + alpha w_t)> back-propagated, clip_grad_norm_ at ``clip``
    (coefficient clip / (norm + 1e-6), never above 1), then SGD with weight_decay = alpha + wd."""
    w = np.array(THETA)
    d = _grad(THETA) - (np.array(g_k) + alpha * w)
    d = d * min(1.0, clip / (np.linalg.norm(d) + 1e-6))
    return w - LR * (d + (alpha + weight_decay) * w)


@pytest.mark.parametrize("method", ["feddyn", "fedsmoo", "fedspeed"])
def test_a_binding_clip_leaves_fedDyn_alpha_w_out_as_the_authors_code_does(method):
    """`local-clip-norm` (and the methods' own clip keys) clip the gradient and FedDyn's linear
    term, then alpha w is added: the authors' order. The earlier code clipped alpha w too (one
    round 69-79% off the authors' on the same batches at clip 0.3). rho = 0 makes FedSMOO's and
    FedSpeed's perturbed gradient the plain one, so the three share the hand step."""
    from clients import fedsmoo, fedspeed

    alpha, g_k = 0.4, (0.05, -0.15)
    state = {"grad": weight(g_k)}
    keys = {"feddyn": {"feddyn-alpha": alpha},
            "fedsmoo": {"smoo-alpha": alpha, "smoo-rho": 0.0, "smoo-s": "none", "smoo-clip-norm": 0.0},
            "fedspeed": {"fedspeed-prox": alpha, "fedspeed-rho": 0.0, "fedspeed-merge": 1.0,
                         "fedspeed-clip-norm": 0.0}}[method]
    update = {"feddyn": feddyn.UPDATE, "fedsmoo": fedsmoo.UPDATE, "fedspeed": fedspeed.UPDATE}[method]
    run = linear_round(update, keys, THETA, state=state, epochs=1, clip_norm=0.3, weight_decay=0.01)
    want = _authors_dynamic_step(alpha, g_k, 0.3, weight_decay=0.01)
    assert values(run.params) == pytest.approx(want, abs=1e-12)
    clipped_whole = np.array(THETA) - LR * 0.3 * (d := _grad(THETA) - np.array(g_k) + alpha * (np.array(THETA)
                                                  - np.array(THETA))) / (np.linalg.norm(d) + 1e-6)
    assert values(run.params) != pytest.approx(clipped_whole, abs=1e-3)  # the order matters here
    if method != "feddyn":  # the method's own clip key sits where local-clip-norm does
        own = {"fedsmoo": "smoo-clip-norm", "fedspeed": "fedspeed-clip-norm"}[method]
        by_key = linear_round(update, {**keys, own: 0.3}, THETA, state=state, epochs=1, weight_decay=0.01)
        assert torch.equal(by_key.params["weight"], run.params["weight"])


def test_without_a_clip_the_place_of_alpha_w_changes_nothing():
    """No clip: d = g - (g_k + alpha w_t) + alpha w whatever the place of alpha w."""
    alpha, g_k = 0.4, (0.05, -0.15)
    run = linear_round(feddyn.UPDATE, {"feddyn-alpha": alpha}, THETA, state={"grad": weight(g_k)}, epochs=1)
    want = np.array(THETA) - LR * (_grad(THETA) - np.array(g_k) + alpha * (np.array(THETA) - np.array(THETA)))
    assert values(run.params) == pytest.approx(want, abs=1e-12)


# ---- a method's own clip key and local-clip-norm together: both apply, one after the other ----------

FEDDC_STATE = {"h": (0.04, -0.02), "ci": (-0.02, 0.04)}
FEDDC_C = (0.03, -0.01)
FEDDC_ALPHA = 0.1


def _feddc_direction_at_theta() -> np.ndarray:
    """FedDC's first-step direction by hand: g + alpha (w - (theta - h_i)) + (c - c_i) at w = theta,
    that is g + alpha h_i + c - c_i."""
    return (_grad(THETA) + FEDDC_ALPHA * np.array(FEDDC_STATE["h"]) + np.array(FEDDC_C)
            - np.array(FEDDC_STATE["ci"]))


def _feddc_step(own_clip: float, local_clip: float):
    """One FedDC step (lr 0.5, batch 1, no momentum) with ``feddc-clip-norm`` = ``own_clip`` and
    the run-wide ``local-clip-norm`` = ``local_clip``."""
    keys = {"feddc-alpha": FEDDC_ALPHA, "feddc-clip-norm": own_clip}
    state = {name: weight(v) for name, v in FEDDC_STATE.items()}
    return linear_round(feddc.UPDATE, keys, THETA, lr=LR, epochs=1, state=state, server={"c": weight(FEDDC_C)},
                        clip_norm=local_clip)


def _clip_by_hand(d: np.ndarray, clip: float) -> np.ndarray:
    """``clip_grad_norm_``'s scaling: coefficient clip / (||d|| + 1e-6), never above 1."""
    return d * min(1.0, clip / (np.linalg.norm(d) + 1e-6))


@pytest.mark.parametrize(("own_clip", "local_clip"), [(10.0, 0.3), (0.3, 10.0)],
                         ids=["local-clip-norm-tighter", "own-clip-tighter"])
def test_a_methods_own_clip_and_local_clip_norm_both_apply(own_clip, local_clip):
    """With FedDC's ``feddc-clip-norm`` and ``local-clip-norm`` both set, the step's direction is
    clipped by the one, then by the other: whichever is tighter bounds the step, so the weights
    move lr x 0.3 = 0.15 (up to clip_grad_norm_'s 1e-6), not lr x ||d|| = 0.26 (the looser
    clip alone)."""
    d = _feddc_direction_at_theta()
    assert 0.3 < np.linalg.norm(d) < 10  # 0.5269: a bound of 0.3 binds, one of 10 does not
    want = np.array(THETA) - LR * _clip_by_hand(_clip_by_hand(d, own_clip), local_clip)
    moved = np.array(values(_feddc_step(own_clip, local_clip).params))
    assert moved == pytest.approx(want, abs=1e-12)
    assert np.linalg.norm(moved - np.array(THETA)) == pytest.approx(LR * 0.3, rel=1e-5)
    # the same round as the tighter bound alone: the looser one, applied too, changes nothing
    alone = _feddc_step(0.3, 0.0).params["weight"]
    assert torch.allclose(_feddc_step(own_clip, local_clip).params["weight"], alone, rtol=0, atol=1e-12)
