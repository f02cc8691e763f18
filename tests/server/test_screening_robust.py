"""Byzantine-robust screening (fl_app/server/screening.py): Krum / Multi-Krum, Bulyan and the trimmed mean
sized from a declared number of attackers f, against hand computations and Flower's own
``aggregate_krum`` / ``aggregate_bulyan``; the config checks; SCAFFOLD keeps Krum's replies whole."""

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy.aggregate import aggregate_krum

from fl_app.config import ConfigError
from fl_app.registry import resolve, validate_config
from fl_app.server.screening import decide, krum_keep, krum_scores, min_replies, robust_weights
from tests.kit_server import W_T, client

# five updates on the float vector (the matrix update 0): four honest near (1, 1), one far
UPDATES = [[1.0, 1.0], [1.0, 2.0], [2.0, 1.0], [2.0, 2.0], [10.0, -10.0]]
CLIENTS = [client(0.0, u) for u in UPDATES]


def test_krum_scores_by_hand():
    # f = 1, n = 5: each score sums the squared distances to its n - f - 2 = 2 nearest others
    # (1,1): nearest (1,2) and (2,1), 1 + 1 = 2; likewise (1,2), (2,1), (2,2) score 2.
    # (10,-10): nearest (2,1) 64 + 121 = 185 and (1,1) 81 + 121 = 202 -> 387
    scores = krum_scores(CLIENTS, W_T, attackers=1)
    assert scores == pytest.approx([2.0, 2.0, 2.0, 2.0, 387.0])
    # f = 2: n - f - 2 = 1 nearest
    assert krum_scores(CLIENTS, W_T, attackers=2) == pytest.approx([1.0, 1.0, 1.0, 1.0, 185.0])


def test_krum_keeps_the_client_of_lowest_score():
    updates = [[1.0, 1.0], [1.2, 1.0], [3.0, 1.0], [1.0, 3.0], [9.0, 9.0]]
    # f = 1, 2 nearest: (1,1): .04 + 4 = 4.04; (1.2,1): .04 + 3.24 = 3.28; (3,1): 3.24 + 4 = 7.24;
    # (1,3): 4 + 4.04 = 8.04; (9,9): (36+64) + (64+36) = 200
    d = decide([client(0.0, u) for u in updates], W_T, "krum", 0.0, 3.0, 0.2, attackers=1)
    assert d.keep == [False, True, False, False, False]
    d = decide([client(0.0, u) for u in updates], W_T, "multi-krum", 0.0, 3.0, 0.2, attackers=1)
    assert d.keep == [True, True, True, True, False]  # n - f = 4 of lowest score


@pytest.mark.parametrize("mode, to_keep", [("krum", 0), ("multi-krum", 4)])
def test_krum_selection_is_flowers_aggregate_krum(mode, to_keep):
    """FedAvg's example-weighted mean of the kept replies == Flower's aggregate_krum."""
    rng = np.random.default_rng(0)
    clients = [[W_T[0] + rng.normal(size=(2, 2)).astype(np.float32), rng.normal(size=2).astype(np.float32)]
               for _ in range(5)]
    clients[3] = [a * 20 for a in clients[3]]
    examples = [10, 20, 30, 40, 50]
    keep = krum_keep(krum_scores(clients, W_T[:2], attackers=1), mode, 1)
    kept = [(c, n) for c, n, k in zip(clients, examples, keep) if k]
    mean = [sum(c[i].astype(np.float64) * n for c, n in kept) / sum(n for _, n in kept) for i in range(2)]
    expected = aggregate_krum(list(zip(clients, examples)), 1, to_keep)
    for got, want in zip(mean, expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)  # float32 inputs, float64 vs float32 sums


def test_bulyan_by_hand():
    """n = 7, f = 1 on the points x = 0, 1, 2, 3, 4, 6, 50: theta = n - 2f = 5 picks by Krum, each
    on what is left (n - f - 2 nearest, at least 1), then the mean of the beta = theta - 2f = 3
    values closest to the coordinate-wise median of the picks."""
    updates = [[x, 0.0] for x in (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 50.0)]
    # pick 1, 4 nearest: x=2 scores 1+1+4+4 = 10 (x=1: 15, x=3: 15, x=4: 18, x=0: 30, x=6: 54)
    # pick 2, 3 nearest of {0,1,3,4,6,50}: x=1, 3, 4 tie at 14 -> the first, x=1
    # pick 3, 2 nearest of {0,3,4,6,50}: x=4 scores 1+4 = 5 (x=3: 10, x=6: 13, x=0: 25)
    # pick 4, 1 nearest of {0,3,6,50}: all 9 but 50 -> the first, x=0; pick 5 of {3,6,50}: x=3
    # picks {2, 1, 4, 0, 3}: median 2, the 3 closest 1, 2, 3 -> 2; the 50 is never picked
    out = robust_weights([client(0.0, u) for u in updates], W_T, "bulyan", 0.2, attackers=1)
    np.testing.assert_allclose(out[1], [2.0, 0.0])
    np.testing.assert_allclose(out[0], W_T[0])  # matrix update 0 for everyone
    assert sorted(out) == [0, 1]  # the integer buffer is not aggregated


def test_trimmed_mean_cuts_f_at_each_end():
    vectors = [[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 0.0], [100.0, 0.0], [200.0, 0.0], [300.0, 0.0],
               [-5.0, 0.0]]
    clients = [client(0.0, v) for v in vectors]
    # f = 3 of 8: cut 3 at each end -> keep 3 and 4 (screen-trim 0.2 would cut only 1)
    out = robust_weights(clients, W_T, "trimmed-mean", 0.2, attackers=3)
    np.testing.assert_allclose(out[1], [3.5, 0.0])
    two = robust_weights(clients, W_T, "trimmed-mean", 0.2)  # int(0.2 * 8) = 1 cut per end
    np.testing.assert_allclose(two[1][0], (1 + 2 + 3 + 4 + 100 + 200) / 6)


@pytest.mark.parametrize("mode, f, fewest", [("krum", 1, 5), ("multi-krum", 3, 9), ("bulyan", 1, 7),
                                             ("bulyan", 3, 15), ("trimmed-mean", 3, 8), ("median", 3, 1)])
def test_min_replies(mode, f, fewest):
    assert min_replies(mode, f) == fewest


def test_too_few_replies_update_nothing():
    d = decide(CLIENTS[:4], W_T, "krum", 0.0, 3.0, 0.2, attackers=1)  # krum needs 5 for f = 1
    assert d.keep == [False] * 4
    d = decide(CLIENTS, W_T, "bulyan", 0.0, 3.0, 0.2, attackers=1)  # bulyan needs 7
    assert d.keep == [False] * 5 and not d.robust


@pytest.mark.parametrize("cfg, words", [
    ({"screening": "krum"}, ["'screen-attackers' = 0", "screening = 'krum'", ">= 1"]),
    ({"screening": "bulyan", "strategy": "scaffold", "screen-attackers": 1}, ["'bulyan'", "krum, multi-krum"]),
    ({"screening": "krum", "strategy": "dp-fedavg", "screen-attackers": 1}, ["'krum'", "valid choices"]),
    ({"screen-attackers": -1}, ["'screen-attackers' = -1", ">= 0"]),
])
def test_config_refusals_are_one_line(cfg, words):
    with pytest.raises(ConfigError) as err:
        resolve(cfg)  # the ServerApp's validation, with the method's own checks
    assert "\n" not in str(err.value)
    for w in words:
        assert w in str(err.value)


def test_krum_on_scaffold_drops_the_attackers_delta_c():
    """Krum keeps or drops a reply whole: SCAFFOLD's delta c_i (after the weights) follows it."""
    from fl_app.server.screening import Screening
    from tests.kit import Proxy, fit_res

    cfg = validate_config({"strategy": "scaffold", "screening": "krum", "screen-attackers": 1})
    w_t = [np.zeros(3, np.float32), np.zeros(1, np.float32)]
    screening = Screening(cfg)
    screening.begin_round(ndarrays_to_parameters(w_t))
    honest = [(1.0, 1.0), (1.1, 2.0), (0.8, 3.0), (1.5, 4.0)]  # (weight update, delta c) per client
    replies = [[np.full(3, v, np.float32), np.zeros(1, np.float32), np.full(3, c, np.float32),
                np.zeros(1, np.float32)] for v, c in honest + [(-50.0, 99.0)]]
    kept = screening.apply(1, [(Proxy(str(k)), fit_res(r, 10)) for k, r in enumerate(replies)], {})
    # The distances count delta c too, times median ||Delta|| / median ||delta c|| = 1.1 / 3: per
    # coordinate pair (dv^2 + (1.1/3)^2 dc^2): 0-1 .1444, 0-2 .5778, 0-3 1.46, 1-2 .2244, 1-3 .6978,
    # 2-3 .6244; scores / 3 (the 2 nearest): .7222, .3689, .8022, 1.3222, the attacker's far more.
    assert [p.cid for p, _ in kept] == ["1"]
    arrays = parameters_to_ndarrays(kept[0][1].parameters)
    np.testing.assert_array_equal(arrays[2], np.full(3, 2.0, np.float32))  # its own delta c, unchanged
