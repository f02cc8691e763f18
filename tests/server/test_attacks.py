"""inject-faults attacks (fl_app/node/attacks.py): parsing, and what each does to a reply."""


import numpy as np
import pytest
import torch

from clients import fedavg, scaffold
from fl_app.common.faults import parse_faults
from fl_app.config import ConfigError
from fl_app.node.attacks import Attack, attacked_reply
from fl_app.node.node_client import NodeClient
from fl_app.registry import validate_config
from tests.kit import make_client

W_T = [np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.array([0.5, -0.5], np.float32), np.array(7, np.int64)]
W_K = [np.array([[2.0, 2.0], [3.0, 2.0]], np.float32), np.array([0.5, 0.5], np.float32), np.array(9, np.int64)]
EXTRA = [np.array([10.0, 20.0], np.float32)]  # a method's extra array (e.g. delta c_i)


def test_parse_all_forms():
    faults = parse_faults("raise:0, nan:1, crash-after:4, scale:2:100, flip:3, flip:4:2.5@3, noise:5:50@2")
    assert faults == {0: "raise", 1: "nan", "crash-after": 4, 2: Attack("scale", 100.0, 1),
                      3: Attack("flip", 1.0, 1), 4: Attack("flip", 2.5, 3), 5: Attack("noise", 50.0, 2)}


@pytest.mark.parametrize("item, why", [
    ("scale:3", "exactly one number"), ("scale:x:100", "partition"), ("flip:3:-1", "factor must be > 0"),
    ("noise:3:0", "norm must be > 0"), ("noise:3:nan", "finite"), ("scale:3:100@0", "'@'"),
    ("scale:3:abc", "not a number"), ("explode:1", "unknown kind"),
])
def test_bad_items_named_with_the_valid_forms(item, why):
    with pytest.raises(ConfigError) as err:
        validate_config({"inject-faults": f"raise:0,{item}"})
    msg = str(err.value)
    assert f"item {item!r}" in msg and why in msg
    assert "scale:<partition>:<factor>[@<round>]" in msg and "noise:<partition>:<norm>[@<round>]" in msg


def test_scale_and_flip_act_on_the_update_not_the_weights():
    reply = W_K + EXTRA
    sent = W_T + [np.zeros(2, np.float32)]
    scaled = attacked_reply(Attack("scale", 10.0), reply, sent, 3, 0, 0, 1)
    # w_t + 10 (w_k - w_t)
    np.testing.assert_array_equal(scaled[0], [[11.0, 2.0], [3.0, -16.0]])
    np.testing.assert_array_equal(scaled[1], [0.5, 9.5])
    assert scaled[2] == 9 and scaled[2].dtype == np.int64  # integer buffer sent as trained
    np.testing.assert_array_equal(scaled[3], EXTRA[0])  # extras untouched
    assert scaled[0].dtype == np.float32
    flipped = attacked_reply(Attack("flip", 1.0), reply, sent, 3, 0, 0, 1)
    np.testing.assert_array_equal(flipped[0], [[0.0, 2.0], [3.0, 6.0]])
    np.testing.assert_array_equal(flipped[1], [0.5, -1.5])
    flipped3 = attacked_reply(Attack("flip", 3.0), reply, sent, 3, 0, 0, 1)
    np.testing.assert_array_equal(flipped3[1], [0.5, -3.5])


def test_noise_has_the_norm_and_repeats_from_the_seed():
    a = attacked_reply(Attack("noise", 5.0), W_K, W_T, 3, 0, 4, 2)
    delta = np.concatenate([(x.astype(np.float64) - y).ravel() for x, y in zip(a[:2], W_T[:2])])
    assert np.linalg.norm(delta) == pytest.approx(5.0, rel=1e-5)
    assert a[2] == 9
    again = attacked_reply(Attack("noise", 5.0), W_K, W_T, 3, 0, 4, 2)
    other_round = attacked_reply(Attack("noise", 5.0), W_K, W_T, 3, 0, 4, 3)
    np.testing.assert_array_equal(a[0], again[0])
    assert not np.array_equal(a[0], other_round[0])


def test_from_round_and_non_attacks_leave_the_reply():
    assert attacked_reply(Attack("scale", 10.0, 3), W_K, W_T, 3, 0, 0, 2) is W_K
    assert attacked_reply("nan", W_K, W_T, 3, 0, 0, 2) is W_K
    assert attacked_reply(None, W_K, W_T, 3, 0, 0, 2) is W_K
    assert attacked_reply(Attack("scale", 10.0, 3), W_K, W_T, 3, 0, 0, 3) is not W_K


def _fit(client_cls, faults, server_round=1):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 60, generator=g), torch.randint(0, 10, (20,), generator=g)
    client = make_client(client_cls, {"inject-faults": faults, "learning-rate": 0.1}, x, y)
    sent = [np.full(a.shape, 0.1, a.dtype) for a in client.get_parameters({})]
    reply, _, _ = NodeClient(client).fit(sent, {"server-round": server_round})
    return sent, reply


def test_client_sends_the_scaled_update():
    sent, honest = _fit(fedavg.UPDATE, "")
    _, attacked = _fit(fedavg.UPDATE, "scale:0:100")
    for s, h, a in zip(sent, honest, attacked):
        np.testing.assert_allclose(a - s, 100 * (h - s), rtol=1e-4, atol=1e-5)
    _, later = _fit(fedavg.UPDATE, "scale:0:100@2")  # not yet in round 1
    for h, a in zip(honest, later):
        np.testing.assert_array_equal(a, h)
    _, other = _fit(fedavg.UPDATE, "scale:1:100")  # another partition's attack
    for h, a in zip(honest, other):
        np.testing.assert_array_equal(a, h)


def test_scaffold_client_attacks_its_weights_only():
    sent, honest = _fit(scaffold.UPDATE, "")
    _, attacked = _fit(scaffold.UPDATE, "flip:0:5")
    assert len(attacked) == 4  # weight, bias, delta c_weight, delta c_bias
    for s, h, a in zip(sent[:2], honest[:2], attacked[:2]):
        np.testing.assert_allclose(a - s, -5 * (h - s), rtol=1e-4, atol=1e-5)
    for h, a in zip(honest[2:], attacked[2:]):
        np.testing.assert_array_equal(a, h)


# W_K - W_T: matrix [[1, 0], [0, -2]], vector [0, 1] -> ||Delta|| = sqrt(6)
@pytest.mark.parametrize("cfg, norm", [
    ({"screening": "reject", "screen-reject-multiple": 3.0}, 0.9 * 3.0 * 6**0.5),
    ({"screening": "none", "screen-reject-multiple": 2.0}, 0.9 * 2.0 * 6**0.5),  # reject's bound by default
    ({"screening": "clip", "screen-clip-multiple": 1.5, "screen-clip-norm": 0.0}, 0.9 * 1.5 * 6**0.5),
    ({"screening": "clip", "screen-clip-norm": 2.0}, 0.9 * 2.0),
])
def test_adaptive_is_a_sign_flip_sized_to_the_screening_bound(cfg, norm):
    a = attacked_reply(Attack("adaptive", 0.9), W_K, W_T, 3, 0, 0, 1, cfg)
    delta = [x.astype(np.float64) - y for x, y in zip(a[:2], W_T[:2])]
    assert np.linalg.norm(np.concatenate([d.ravel() for d in delta])) == pytest.approx(norm, rel=1e-6)
    s = norm / 6**0.5  # Delta -> -s Delta
    np.testing.assert_allclose(delta[0], -s * np.array([[1.0, 0.0], [0.0, -2.0]]), rtol=1e-6)
    np.testing.assert_allclose(delta[1], -s * np.array([0.0, 1.0]), rtol=1e-6, atol=1e-7)
    assert a[2] == 9


def test_adaptive_parses_with_a_default_margin():
    assert parse_faults("adaptive:3, adaptive:4:0.5@2") == {3: Attack("adaptive", 0.9), 4: Attack("adaptive", 0.5, 2)}
    for bad in ("adaptive:3:0", "adaptive:3:1.5"):
        with pytest.raises(ConfigError, match="margin must be in"):
            validate_config({"inject-faults": bad})


def test_three_adaptive_attackers_of_ten_pass_reject():
    """Honest updates of norms 1 to 1.1 (IID clients' norms are close): each attacker scales its
    own to 0.9 x 3 x its norm, under 3 x the round's median (which the 7 honest hold near 1.05),
    so reject keeps all. (An attacker whose own norm exceeds the median by more than 1/0.9 is
    caught: the margin is its slack for that estimate.)"""
    from fl_app.server.screening import decide

    rng = np.random.default_rng(1)
    w_t = [np.zeros(50, np.float32)]
    honest = []
    for norm in np.linspace(1.0, 1.1, 10):
        d = rng.normal(size=50)
        honest.append([(d * norm / np.linalg.norm(d)).astype(np.float32)])
    cfg = {"screening": "reject", "screen-reject-multiple": 3.0}
    sent = honest[:7] + [attacked_reply(Attack("adaptive", 0.9), h, w_t, 1, 0, k, 1, cfg) for k, h in
                         enumerate(honest[7:])]
    d = decide(sent, w_t, "reject", 0.0, 3.0, 0.2)
    assert d.keep == [True] * 10
    assert max(d.norms[7:]) > 2.5 * d.median  # each attacker weighs ~2.7 honest clients


def test_client_sends_the_adaptive_update():
    sent, honest = _fit(fedavg.UPDATE, "")
    _, attacked = _fit(fedavg.UPDATE, "adaptive:0:0.5")  # default screening: reject's bound 3
    for s, h, a in zip(sent, honest, attacked):
        np.testing.assert_allclose(a - s, -1.5 * (h - s), rtol=1e-4, atol=1e-5)


def test_gaussian_sends_n_0_sigma2_coordinates_repeatably():
    """gaussian:<p>:<sigma>: Delta's coordinates are independent N(0, sigma^2) (ByzFL's Gaussian),
    seeded by (seed, partition, round); integer buffers and extras are sent as computed."""
    w_t = [np.zeros((100, 200), np.float32), np.zeros(3, np.int64)]
    w_k = [np.ones((100, 200), np.float32), np.full(3, 4, np.int64)]
    reply = w_k + EXTRA
    a = attacked_reply(Attack("gaussian", 0.5), reply, w_t + [np.zeros(2, np.float32)], 2, 0, 4, 2)
    delta = a[0].astype(np.float64)
    assert abs(delta.mean()) < 4 * 0.5 / np.sqrt(delta.size)  # 4 standard errors
    assert delta.std() == pytest.approx(0.5, rel=0.03)
    np.testing.assert_array_equal(a[1], w_k[1])
    np.testing.assert_array_equal(a[2], EXTRA[0])
    again = attacked_reply(Attack("gaussian", 0.5), reply, w_t, 2, 0, 4, 2)
    np.testing.assert_array_equal(a[0], again[0])
    assert not np.array_equal(a[0], attacked_reply(Attack("gaussian", 0.5), reply, w_t, 2, 0, 4, 3)[0])
    assert not np.array_equal(a[0], attacked_reply(Attack("gaussian", 0.5), reply, w_t, 2, 0, 5, 2)[0])


def test_new_node_attacks_parse_and_refuse_bad_values():
    assert parse_faults("gaussian:1, gaussian:2:0.01@3, label-flip:3, label-flip:4@2") == {
        1: Attack("gaussian", 1.0), 2: Attack("gaussian", 0.01, 3), 3: Attack("label-flip", None),
        4: Attack("label-flip", None, 2)}
    for item, why in [("gaussian:1:0", "sigma must be > 0"), ("gaussian:1:-2", "sigma must be > 0"),
                      ("label-flip:1:3", "label-flip takes no number"), ("label-flip:x", "partition")]:
        with pytest.raises(ConfigError) as err:
            validate_config({"inject-faults": item})
        assert f"item {item!r}" in str(err.value) and why in str(err.value) and "\n" not in str(err.value)


def test_label_flip_trains_on_c_minus_1_minus_y():
    from fl_app.node.attacks import attacked_labels

    cfg = {"inject-faults": "label-flip:2@2"}
    y = torch.tensor([0, 3, 9])
    assert attacked_labels(cfg, 2, 2, y, 10).tolist() == [9, 6, 0]
    assert attacked_labels(cfg, 2, 1, y, 10) is y  # before its round
    assert attacked_labels(cfg, 1, 2, y, 10) is y  # another partition
    assert attacked_labels({"inject-faults": "scale:2:3"}, 2, 2, y, 10) is y


def test_a_label_flipping_client_is_an_honest_client_of_flipped_data():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 60, generator=g), torch.randint(0, 10, (20,), generator=g)
    attacker = make_client(fedavg.UPDATE, {"inject-faults": "label-flip:0", "learning-rate": 0.1}, x, y)
    flipped = make_client(fedavg.UPDATE, {"learning-rate": 0.1}, x, 9 - y)
    honest = make_client(fedavg.UPDATE, {"learning-rate": 0.1}, x, y)
    sent = [np.full(a.shape, 0.1, a.dtype) for a in honest.get_parameters({})]
    got = NodeClient(attacker).fit([a.copy() for a in sent], {"server-round": 1})[0]
    want = NodeClient(flipped).fit([a.copy() for a in sent], {"server-round": 1})[0]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(got[0], NodeClient(honest).fit([a.copy() for a in sent], {"server-round": 1})[0][0])


def test_nodes_name_their_partition_only_in_a_run_with_an_omniscient_attack():
    _, _, metrics = NodeClient(_client({"inject-faults": "alie:1"}, partition=3)).fit(*_sent_and_config())
    assert metrics["partition"] == 3
    _, _, metrics = NodeClient(_client({"inject-faults": "scale:1:10"}, partition=3)).fit(*_sent_and_config())
    assert "partition" not in metrics


def _client(overrides, partition=0):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 60, generator=g), torch.randint(0, 10, (20,), generator=g)
    return make_client(fedavg.UPDATE, overrides, x, y, partition=partition, num_partitions=5)


def _sent_and_config():
    sent = [np.full(a.shape, 0.1, a.dtype) for a in _client({}).get_parameters({})]
    return sent, {"server-round": 1}
