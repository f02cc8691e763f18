"""FedGamma (Dai et al., IEEE TNNLS 2023): the corrected SAM step against a hand computation
(float64, the one-weight model) in both readings of the perturbation, the reductions (c = c_i =
0 is FedSAM bit for bit, each term active), c_i+ and delta c_i as SCAFFOLD's, the cohort against
the per-client path, and SCAFFOLD's server with D = N."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients import fedgamma, fedsam
from fl_app.registry import validate_config
from protocol.keys import ConfigError
from strategies.fedgamma import FedGammaStrategy
from tests.kit import assert_cohort_matches
from tests.kit_training import linear_round, values, weight

W_T, C, CI, RHO, LR = (0.2, -0.1), (0.3, -0.4), (-0.1, 0.2), 0.7, 0.5


def softmax_grad(w):
    """The hand model's cross-entropy gradient softmax(w) - e_0."""
    e = np.exp(np.asarray(w) - max(w))
    return e / e.sum() - np.array([1.0, 0.0])


def hand_round(mode):
    corr = np.array(C) - np.array(CI)
    w = np.array(W_T)
    for _ in range(2):
        g = softmax_grad(w)
        a = g + corr if mode == "global" else g
        w = w - LR * (softmax_grad(w + RHO * a / (np.linalg.norm(a) + 1e-12)) + corr)
    return w


def run(mode, c=C, ci=CI):
    return linear_round(fedgamma.UPDATE, {"fedgamma-rho": RHO, "fedgamma-perturbation": mode}, W_T,
                        state={"ci": weight(ci)}, server={"c": weight(c)})


@pytest.mark.parametrize("mode", ["local", "global"])
def test_client_steps_match_hand_computation(mode):
    result = run(mode)
    w2 = hand_round(mode)
    assert values(result.params) == pytest.approx(w2.tolist(), abs=1e-12)
    # option II: c_i+ = c_i - c + (w_t - w_K) / (lr K), K = 2; delta c_i = c_i+ - c_i
    ci_new = np.array(CI) - np.array(C) + (np.array(W_T) - w2) / (LR * 2)
    assert values(result.state["ci"]) == pytest.approx(ci_new.tolist(), abs=1e-12)
    assert values(result.reply["delta_c"]) == pytest.approx((ci_new - np.array(CI)).tolist(), abs=1e-12)


def test_each_term_acts_and_no_correction_is_fedsam_bit_for_bit():
    sam = linear_round(fedsam.UPDATE, {"sam-rho": RHO}, W_T)
    for mode in ("local", "global"):
        zero = run(mode, c=(0.0, 0.0), ci=(0.0, 0.0))
        assert torch.equal(zero.params["weight"], sam.params["weight"])
    local, glob = run("local"), run("global")
    for a, b in ((sam, local), (local, glob)):  # the correction acts; the global ascent differs from the local one
        assert np.abs(np.subtract(values(a.params), values(b.params))).max() > 1e-3


@pytest.mark.parametrize("mode", ["local", "global"])
def test_cohort_equals_per_client(mode):
    def states(shapes, k):
        gen = torch.Generator().manual_seed(20 + k)
        return {"ci": {n: 0.05 * torch.randn(s, generator=gen) for n, s in shapes.items()}}

    def server(shapes):
        gen = torch.Generator().manual_seed(1)
        return {"c": {n: 0.05 * torch.randn(s, generator=gen) for n, s in shapes.items()}}
    assert_cohort_matches(fedgamma.UPDATE, {"fedgamma-rho": 0.1, "fedgamma-perturbation": mode},
                          states=states, server=server)


def test_server_is_scaffolds_with_the_total_divisor_and_bad_values_are_refused():
    assert FedGammaStrategy.SERVER.parts["cv"].divisor == "total"
    base = {"strategy": "fedgamma", "dataset": "synthetic", "model": "logreg"}
    with pytest.raises(ConfigError, match="fedgamma-perturbation.*local.*global"):
        validate_config({**base, "fedgamma-perturbation": "paper"})
    with pytest.raises(ConfigError, match="fedgamma-rho"):
        validate_config({**base, "fedgamma-rho": 0.0})
