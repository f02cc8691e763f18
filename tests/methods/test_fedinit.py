"""FedInit (Sun et al., NeurIPS 2023): the relaxed start against a hand computation (float64,
the one-weight model), beta = 0 and a first round as FedAvg bit for bit, the last local model
kept, the cohort against the per-client path, a bad key refused."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from clients import fedavg, fedinit
from fl_app.registry import validate_config
from protocol.keys import ConfigError
from tasks.functional.core import Hyper
from tasks.functional.update import Round
from tests.kit import assert_cohort_matches
from tests.kit_training import linear_round, values, weight

W_T, LAST, BETA = (0.2, -0.1), (0.5, 0.6), 0.3


def test_relaxed_start_matches_hand_computation_and_keeps_the_last_model():
    start = np.array(W_T) + BETA * (np.array(W_T) - np.array(LAST))
    job = Round(fedinit.UPDATE, None, weight(W_T), {}, {"last": weight(LAST)}, {},
                Hyper(lr=0.5, keys={"fedinit-beta": BETA}), None, None, 1, 1, None)
    assert values(fedinit.relaxed_start(job).params) == pytest.approx(start.tolist(), abs=1e-15)
    plain = linear_round(fedavg.UPDATE, {}, tuple(start))
    result = linear_round(fedinit.UPDATE, {"fedinit-beta": BETA}, tuple(start), state={"last": weight(LAST)})
    assert torch.equal(result.params["weight"], plain.params["weight"])
    assert torch.equal(result.state["last"]["weight"], result.params["weight"])


@pytest.mark.parametrize("reading", ["updates", "models"])
def test_the_reply_is_w_t_plus_the_update_or_the_local_model(reading):
    """``fedinit-server = updates`` (the authors' code, default): the reply is
    w_{i,K} - beta (w_t - w_i^last) = w_t + (w_{i,K} - w_i^0), so the server's mean steps from w_t;
    ``models``: the reply is w_{i,K}. The kept last model is w_{i,K} under both; float64, by hand."""
    keys = {"fedinit-beta": BETA, "fedinit-server": reading}
    job = fedinit.relaxed_start(Round(fedinit.UPDATE, None, weight(W_T), {}, {"last": weight(LAST)}, {},
                                      Hyper(lr=0.5, keys=keys), None, None, 1, 1, None))
    start = np.array(W_T) + BETA * (np.array(W_T) - np.array(LAST))
    result = linear_round(fedinit.UPDATE, keys, tuple(start), state={"last": weight(LAST)})
    w_k = np.array(values(result.params))
    replied = fedinit.fedinit_finish(job, result)
    want = np.array(W_T) + (w_k - start) if reading == "updates" else w_k
    assert values(replied.params) == pytest.approx(want.tolist(), abs=1e-15)
    assert values(replied.state["last"]) == pytest.approx(w_k.tolist(), abs=0)
    if reading == "updates":  # the update is a real one, so the two readings differ
        assert np.abs(want - w_k).max() > 0.05
    first = Round(fedinit.UPDATE, None, weight(W_T), {}, {}, {}, Hyper(lr=0.5, keys=keys), None, None, 1, 1, None)
    assert fedinit.fedinit_finish(fedinit.relaxed_start(first), result) is result  # no last model: no shift


def test_beta_zero_and_a_first_round_start_at_w_t():
    job = Round(fedinit.UPDATE, None, weight(W_T), {}, {}, {}, Hyper(lr=0.5, keys={"fedinit-beta": BETA}), None, None, 1, 1, None)
    assert fedinit.relaxed_start(job) is job
    zero = replace(job, state={"last": weight(LAST)}, hp=Hyper(lr=0.5, keys={"fedinit-beta": 0.0}))
    assert fedinit.relaxed_start(zero) is zero


def test_cohort_equals_per_client():
    assert_cohort_matches(fedinit.UPDATE, {"fedinit-beta": BETA})


def test_bad_beta_is_refused():
    with pytest.raises(ConfigError, match="fedinit-beta"):
        validate_config({"strategy": "fedinit", "dataset": "synthetic", "model": "logreg", "fedinit-beta": -1.0})
    with pytest.raises(ConfigError, match="fedinit-server.*updates.*models"):
        validate_config({"strategy": "fedinit", "dataset": "synthetic", "model": "logreg", "fedinit-server": "mean"})
