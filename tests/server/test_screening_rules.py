"""Screening's rules beyond Flower's (fl_app/server/robust_rules.py): geometric-median, centered-clip
and the screen-pre steps arc, nnm and bucketing, each against a hand computation on a few vectors;
that with f = 0 and identical updates every rule returns the mean; a chain through ``decide``;
the refusals (one line each, before launch); ``--list keys`` naming the new choices; and, where
ByzFL imports, the same numbers as ByzFL's implementations (skipped, saying why, where not)."""

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from fl_app.common.screening_modes import ROBUST_MODES, SELECTION_MODES
from fl_app.config import ConfigError
from fl_app.registry import resolve, validate_config
from fl_app.server import robust_rules as R
from fl_app.server.screening import Screening, check_replies, decide, min_replies
from tests.kit import Proxy, fit_res
from tests.kit_server import W_T, client


def line(*xs):
    """Rows (x, 0) for the 1-D points xs."""
    return np.array([[float(x), 0.0] for x in xs])


def screen(updates, mode, **kw):
    """``decide`` on replies whose matrix update is 0 and vector update is each of ``updates``."""
    return decide([client(0.0, u) for u in updates], W_T, mode, 0.0, 3.0, 0.2, **kw)


# ------------------------------------------------------------------------------ the rules by hand
def test_geometric_median_by_hand():
    # three collinear points: the middle one (sum of distances 10 there, more anywhere else)
    np.testing.assert_allclose(R.geometric_median(line(0, 1, 10)), [1.0, 0.0], atol=1e-6)
    # on a line the geometric median is the median: 0, 1, 2, 3, 1000 -> 2, the 1000 has no pull
    np.testing.assert_allclose(R.geometric_median(line(0, 1, 2, 3, 1000)), [2.0, 0.0], atol=1e-6)
    # the corners of a square and its centre twice: the centre
    square = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0], [1.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(R.geometric_median(square), [1.0, 1.0], atol=1e-6)


def test_centered_clip_by_hand():
    rows = line(1, 1, 1, 1, 101)  # four at 1, one far outlier; tau = 1, from v0 = 0
    # L = 1: every x - 0 clipped to norm 1 -> all (1, 0) -> v1 = 1
    np.testing.assert_allclose(R.centered_clip(rows, 1.0, 1), [1.0, 0.0])
    # L = 2: honest x - v1 = 0, outlier 100 -> clipped to 1 -> v2 = 1 + 1/5 = 1.2
    np.testing.assert_allclose(R.centered_clip(rows, 1.0, 2), [1.2, 0.0])
    # L = 3: honest -0.2 (within tau), outlier 99.8 -> 1: v3 = 1.2 + (4 x -0.2 + 1) / 5 = 1.24
    np.testing.assert_allclose(R.centered_clip(rows, 1.0, 3), [1.24, 0.0])
    # through decide: tau 0 = the median update norm (1 here), reported as the round's bound
    d = screen([[1.0, 0.0]] * 4 + [[101.0, 0.0]], "centered-clip", cc=(0.0, 3))
    np.testing.assert_allclose(d.robust[1], [1.24, 0.0], rtol=1e-6)
    assert d.bound == pytest.approx(1.0)


def test_nnm_by_hand():
    # n = 4, f = 1: each row -> the mean of its n - f = 3 nearest, itself included
    # 0: {0, 1, 3} -> 4/3; 1: {1, 0, 3} -> 4/3; 3: {3, 1, 0} -> 4/3; 10: {10, 3, 1} -> 14/3
    np.testing.assert_allclose(R.nnm(line(0, 1, 3, 10), 1)[:, 0], [4 / 3, 4 / 3, 4 / 3, 14 / 3])
    # f = 2: the 2 nearest: 0 -> {0, 1} 1/2; 1 -> {1, 0} 1/2; 3 -> {3, 1} 2; 10 -> {10, 3} 13/2
    np.testing.assert_allclose(R.nnm(line(0, 1, 3, 10), 2)[:, 0], [0.5, 0.5, 2.0, 6.5])


class FixedOrder:
    """An rng whose permutation is the one given."""

    def __init__(self, order):
        self.order = np.array(order)

    def permutation(self, n):
        return self.order


def test_bucketing_by_hand():
    rows = line(0, 1, 2, 3, 4)
    # order 4, 0, 3, 1, 2 and s = 2: buckets {4, 0} -> 2, {3, 1} -> 2, {2} -> 2
    np.testing.assert_allclose(R.bucketing(rows, 2, FixedOrder([4, 0, 3, 1, 2]))[:, 0], [2.0, 2.0, 2.0])
    # order 0 .. 4, s = 3: {0, 1, 2} -> 1, {3, 4} -> 3.5
    np.testing.assert_allclose(R.bucketing(rows, 3, FixedOrder(range(5)))[:, 0], [1.0, 3.5])
    # a fixed seed: the order is that seed's permutation, so a rerun (or a resumed run) buckets alike
    order = np.random.default_rng(7).permutation(5)
    want = [(order[0] + order[1]) / 2, (order[2] + order[3]) / 2, order[4]]
    np.testing.assert_allclose(R.bucketing(rows, 2, np.random.default_rng(7))[:, 0], want)


def test_arc_by_hand():
    rows = line(1, 2, 3, 4, 100)
    # n = 5, f = 1: k = floor(2 x 1/5 x 4) = floor(1.6) = 1: the 100 clipped to the next norm, 4
    assert R.arc_count(5, 1) == 1
    np.testing.assert_allclose(R.arc(rows, 1)[:, 0], [1, 2, 3, 4, 4])
    # f = 2: k = floor(2 x 2/5 x 3) = floor(2.4) = 2: the 4 and the 100 clipped to 3
    np.testing.assert_allclose(R.arc(rows, 2)[:, 0], [1, 2, 3, 3, 3])
    assert R.arc_count(5, 0) == 0


def test_nnm_is_the_mean_of_each_rows_nearest_rows():
    """The mixing-matrix product equals the mean of the indexed nearest rows (float64: only the
    summation order differs, a few ulps; 1e-12 relative leaves room for d = 5000)."""
    rows = np.random.default_rng(3).normal(size=(7, 5000))
    for f in (1, 2, 3):
        sq = (rows * rows).sum(axis=1)
        dist = np.maximum(sq[:, None] + sq[None, :] - 2.0 * rows @ rows.T, 0.0)
        np.fill_diagonal(dist, -1.0)
        nearest = np.argsort(dist, axis=1, kind="stable")[:, : 7 - f]
        np.testing.assert_allclose(R.nnm(rows, f), rows[nearest].mean(axis=1), rtol=1e-12, atol=1e-14)


def test_arc_nnm_trimmed_mean_chain_by_hand():
    # 0, 1, 3, 10 with f = 1. ARC: k = floor(2 x 1/4 x 3) = 1, the 10 clipped to 3 -> 0, 1, 3, 3.
    # NNM (3 nearest, ties by index): 0 -> {0, 1, 3} 4/3; 1 -> 4/3; each 3 -> {3, 3, 1} 7/3.
    # trimmed mean cutting f = 1 at each end of 4/3, 4/3, 7/3, 7/3 -> (4/3 + 7/3) / 2 = 11/6
    d = screen([[x, 0.0] for x in (0, 1, 3, 10)], "trimmed-mean", attackers=1, pre=("arc", "nnm"))
    np.testing.assert_allclose(d.robust[1], [11 / 6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(d.robust[0], W_T[0])  # the matrix update is 0 for everyone
    assert sorted(d.robust) == [0, 1]  # the integer buffer is not aggregated
    # nnm + median on 0, 1, 3, 10 (rows 4/3, 4/3, 4/3, 14/3): 4/3
    d = screen([[x, 0.0] for x in (0, 1, 3, 10)], "median", attackers=1, pre=("nnm",))
    np.testing.assert_allclose(d.robust[1], [4 / 3, 0.0], rtol=1e-6)


@pytest.mark.parametrize("mode", ROBUST_MODES + SELECTION_MODES)
@pytest.mark.parametrize("pre", [(), ("nnm",), ("bucketing",), ("arc",), ("arc", "nnm", "bucketing")])
def test_identical_updates_with_f_0_give_the_mean(mode, pre):
    if mode in SELECTION_MODES and not pre:
        pytest.skip("without screen-pre krum keeps replies whole (tests/server/test_screening_robust.py)")
    u = [0.5, -2.0]
    d = screen([u] * 5, mode, pre=pre, rng=np.random.default_rng(0))
    np.testing.assert_allclose(d.robust[1], u, rtol=1e-6)
    np.testing.assert_allclose(d.robust[0], W_T[0], rtol=1e-6)


def test_with_f_0_the_mixing_steps_give_the_mean_of_distinct_updates():
    rows = line(0, 1, 3, 10)
    np.testing.assert_allclose(R.nnm(rows, 0), np.tile(rows.mean(axis=0), (4, 1)))  # n - 0 nearest: all
    np.testing.assert_allclose(R.arc(rows, 0), rows)  # k = 0: nothing clipped
    np.testing.assert_allclose(R.bucketing(rows, 4, np.random.default_rng(1)), [rows.mean(axis=0)])


def test_too_few_rows_after_bucketing_update_nothing():
    # krum with f = 1 needs 2f + 3 = 5 rows; bucketing s = 2 leaves ceil(n / 2): n >= 9
    assert min_replies("krum", 1, ("bucketing",), 2) == 9
    assert min_replies("median", 2, ("nnm",)) == 3  # nnm needs more rows than f
    d = screen([[1.0, 0.0]] * 8, "krum", attackers=1, pre=("bucketing",))
    assert d.keep == [False] * 8 and not d.robust


def test_screening_applies_the_rule_to_every_reply():
    cfg = validate_config({"screening": "geometric-median"})
    screening = Screening(cfg)
    screening.begin_round(ndarrays_to_parameters(W_T))
    replies = [client(0.0, [x, 0.0]) for x in (0, 1, 10)]
    out = screening.apply(1, [(Proxy(str(k)), fit_res(r, 10)) for k, r in enumerate(replies)], {})
    for _, res in out:  # every reply now carries the geometric median, 1
        np.testing.assert_allclose(parameters_to_ndarrays(res.parameters)[1], [1.0, 0.0], atol=1e-6)


# ------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("cfg, words", [
    ({"screen-pre": "nnm+foo", "screening": "median", "screen-attackers": 1},
     ["'screen-pre' = 'nnm+foo'", "unknown step 'foo'", "arc, nnm, bucketing"]),
    ({"screen-pre": "nnm+nnm", "screening": "median", "screen-attackers": 1}, ["'nnm+nnm'", "twice"]),
    ({"screen-pre": "nnm", "screening": "clip", "screen-attackers": 1}, ["'nnm'", "'clip'", "geometric-median"]),
    ({"screen-pre": "nnm", "screening": "median"}, ["'screen-attackers' = 0", "nnm", ">= 1"]),
    ({"screen-pre": "arc", "screening": "krum", "screen-attackers": 1, "strategy": "scaffold"},
     ["'screen-pre' = 'arc'", "'scaffold'", "valid for it: none"]),
    ({"screening": "geometric-median", "strategy": "scaffold"}, ["'geometric-median'", "valid choices"]),
    ({"screening": "centered-clip", "strategy": "fednova"}, ["'centered-clip'", "valid choices"]),
    ({"screening": "geometric-mean"}, ["'geometric-mean'", "geometric-median"]),
    ({"screen-bucket-size": 0}, ["'screen-bucket-size' = 0", ">= 1"]),
    ({"screen-bucket-size": 2.5}, ["'screen-bucket-size'", "2.5"]),
    ({"screen-cc-tau": -1.0}, ["'screen-cc-tau' = -1", ">= 0"]),
    ({"screen-cc-iters": 0}, ["'screen-cc-iters' = 0", ">= 1"]),
])
def test_bad_values_are_refused_in_one_line(cfg, words):
    with pytest.raises(ConfigError) as err:
        resolve(cfg)  # the runner's and the ServerApp's validation, with the method's own checks
    assert "\n" not in str(err.value)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_a_federation_too_small_for_the_chain_is_refused_before_launch():
    cfg = validate_config({"screening": "krum", "screen-attackers": 1, "screen-pre": "bucketing",
                           "fraction-fit": 1.0, "min-fit-clients": 2})
    check_replies(cfg, 9)  # ceil(9 / 2) = 5 rows = 2f + 3
    with pytest.raises(ConfigError) as err:
        check_replies(cfg, 8)
    assert "\n" not in str(err.value) and "n >= 9" in str(err.value) and "screen-pre = bucketing" in str(err.value)


def test_list_keys_names_the_new_choices():
    from runner.listing import listing

    text = listing("keys")
    for word in ("geometric-median", "centered-clip", "screen-pre", "arc, nnm, bucketing", "screen-bucket-size",
                 "screen-cc-tau", "screen-cc-iters"):
        assert word in text


# ------------------------------------------------------------------------------ against ByzFL
def byzfl_or_skip():
    try:
        import byzfl  # noqa: F401
    except Exception as e:  # ImportError, or torchvision's RuntimeError on a CPU torch
        pytest.skip(f"ByzFL does not import here ({type(e).__name__}: {str(e)[:80]}): "
                    "the rules are checked against the hand computations above only")
    return byzfl


def test_the_rules_are_byzfls():
    byzfl = byzfl_or_skip()
    rows = np.random.default_rng(1).normal(size=(7, 5))
    rows[0] *= 30
    np.testing.assert_allclose(R.nnm(rows, 2), byzfl.NNM(2)(rows.copy()))
    np.testing.assert_allclose(R.arc(rows, 2), byzfl.ARC(2)(rows.copy()))
    np.testing.assert_allclose(R.centered_clip(rows, 1.5, 4), byzfl.CenteredClipping(L=4, tau=1.5)(rows.copy()))
    np.testing.assert_allclose(R.geometric_median(rows), byzfl.GeometricMedian(nu=1e-8, T=2000)(rows.copy()),
                               atol=1e-6)
    np.random.seed(3)
    want = byzfl.Bucketing(2)(rows.copy())
    np.testing.assert_allclose(R.bucketing(rows, 2, np.random.RandomState(3)), want)
