"""The omniscient attacks of inject-faults (fl_app/server/omniscient.py: alie, ipm, mimic): their
rows by hand on a few vectors, ALIE's z_max from the paper's formula, the replacement of the
attackers' replies at the server (extras following their reply, integer buffers and counts as
sent), the rounds it acts in, and a real FedAvg round whose aggregate takes the crafted replies."""

from statistics import NormalDist

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager

from clients import fedavg
from fl_app.common.faults import Attack, parse_faults
from fl_app.config import ConfigError
from fl_app.node.node_client import NodeClient
from fl_app.registry import validate_config
from fl_app.server.omniscient import OmniscientAttacks, alie_z, attack_row
from strategies.base import DriftFedAvg, fedavg_kwargs
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import Proxy, fake_context, fit_res, make_client
from tests.kit_server import RoundByRound

HONEST = np.array([[1.0, 2.0], [3.0, 2.0], [5.0, 8.0]])  # mean (3, 4); std (ddof 1): (2, sqrt(12))


@pytest.mark.parametrize("n, f, p", [(10, 3, 0.7), (10, 1, 0.5), (50, 12, 0.72), (5, 2, 0.8), (10, 6, 0.9)])
def test_alie_z_is_the_papers_z_max(n, f, p):
    """s = floor(n/2 + 1) - f (at least 1), z_max = Phi^-1((n - s)/n): n = 10, f = 3 -> s = 3,
    Phi^-1(0.7); f = 1 -> s = 5, Phi^-1(0.5) = 0; n = 50, f = 12 -> s = 14, Phi^-1(0.72);
    n = 10, f = 6 -> s = 0, held at 1: Phi^-1(0.9)."""
    assert NormalDist().cdf(alie_z(n, f)) == pytest.approx(p, abs=1e-12)


def test_alie_z_against_the_normal_table():
    assert alie_z(10, 3) == pytest.approx(0.5244, abs=1e-4)  # Phi(0.52) = 0.6985, Phi(0.53) = 0.7019
    assert alie_z(10, 1) == pytest.approx(0.0, abs=1e-12)


def test_alie_row_is_mean_minus_z_std():
    row = attack_row(Attack("alie", 0.5), HONEST, 5, 2)
    np.testing.assert_allclose(row, [3.0 - 0.5 * 2.0, 4.0 - 0.5 * 12**0.5], rtol=1e-12)
    z = alie_z(5, 2)  # no z given: the paper's for the round's n and f
    np.testing.assert_allclose(attack_row(Attack("alie", None), HONEST, 5, 2), [3.0 - 2.0 * z, 4.0 - 12**0.5 * z],
                               rtol=1e-12)
    np.testing.assert_array_equal(attack_row(Attack("alie", 0.5), HONEST[:1], 2, 1), HONEST[0])  # one: sigma 0


def test_ipm_row_is_minus_epsilon_times_the_mean():
    np.testing.assert_allclose(attack_row(Attack("ipm", 0.5), HONEST, 5, 2), [-1.5, -2.0], rtol=1e-12)


def test_mimic_row_is_the_first_honest_row():
    np.testing.assert_array_equal(attack_row(Attack("mimic", None), HONEST, 5, 2), HONEST[0])


def test_parse_and_bad_values_refused_in_one_line():
    assert parse_faults("alie:0, alie:1:1.5@2, ipm:2, ipm:3:4, mimic:4") == {
        0: Attack("alie", None), 1: Attack("alie", 1.5, 2), 2: Attack("ipm", 0.1), 3: Attack("ipm", 4.0),
        4: Attack("mimic", None)}
    for item, why in [("alie:0:0", "z must be > 0"), ("alie:0:-1", "z must be > 0"), ("ipm:0:0", "epsilon must be > 0"),
                      ("ipm:0:inf", "finite"), ("mimic:0:1", "mimic takes no number"), ("alie:0:1:2", "exactly one")]:
        with pytest.raises(ConfigError) as err:
            validate_config({"inject-faults": item})
        msg = str(err.value)
        assert "\n" not in msg and f"item {item!r}" in msg and why in msg
        assert "alie:<partition>[:<z>][@<round>]" in msg and "mimic:<partition>[@<round>]" in msg


W_T = [np.array([[0.0, 1.0]], np.float32), np.array([2.0], np.float32), np.array(3, np.int64)]


def _reply(partition, delta, extra, buffer=5, examples=10):
    """w_t + delta on the two floating arrays, an integer buffer, one extra array; naming its partition."""
    arrays = [W_T[0] + np.array([delta[:2]], np.float32), W_T[1] + np.array(delta[2:], np.float32),
              np.array(buffer, np.int64), np.array(extra, np.float32)]
    return Proxy(str(partition)), fit_res(arrays, examples, partition=partition)


def _apply(faults, accepted, server_round=1):
    return OmniscientAttacks({"inject-faults": faults}).apply(server_round, accepted, W_T)


HONEST_REPLIES = [_reply(2, [1.0, 2.0, 0.0], [10.0]), _reply(3, [3.0, 2.0, 2.0], [20.0]),
                  _reply(4, [5.0, 8.0, 4.0], [60.0])]


def test_the_attackers_replies_are_replaced_extras_included():
    accepted = [_reply(0, [9.0, 9.0, 9.0], [9.0], buffer=7, examples=99), _reply(1, [8.0, 8.0, 8.0], [8.0])]
    out = _apply("alie:0:0.5,alie:1:0.5", accepted + HONEST_REPLIES)
    # honest rows (Delta, extra): (1, 2, 0, 10), (3, 2, 2, 20), (5, 8, 4, 60): mean (3, 4, 2, 30),
    # std (2, sqrt 12, 2, sqrt((400 + 100 + 900) / 2) = sqrt 700)
    want = np.array([3.0 - 1.0, 4.0 - 0.5 * 12**0.5, 2.0 - 1.0, 30.0 - 0.5 * 700**0.5])
    for k in (0, 1):
        arrays = parameters_to_ndarrays(out[k][1].parameters)
        np.testing.assert_allclose(arrays[0], W_T[0] + want[None, :2], rtol=1e-6)
        np.testing.assert_allclose(arrays[1], W_T[1] + want[2:3], rtol=1e-6)
        np.testing.assert_allclose(arrays[3], want[3:], rtol=1e-6)
        assert arrays[0].dtype == np.float32 and arrays[2].dtype == np.int64
    assert parameters_to_ndarrays(out[0][1].parameters)[2] == 7  # its own integer buffer
    assert out[0][1].num_examples == 99 and out[0][1].metrics == {"partition": 0}
    assert [o[1] for o in out[2:]] == [h[1] for h in HONEST_REPLIES]  # the honest replies as sent


def test_ipm_and_mimic_replies():
    accepted = [HONEST_REPLIES[1], _reply(0, [9.0, 9.0, 9.0], [9.0]), HONEST_REPLIES[2], HONEST_REPLIES[0],
                _reply(1, [8.0, 8.0, 8.0], [8.0])]
    out = _apply("ipm:0:2,mimic:1", accepted)
    ipm = parameters_to_ndarrays(out[1][1].parameters)
    np.testing.assert_allclose(ipm[0], W_T[0] + np.array([[-6.0, -8.0]]), rtol=1e-6)  # -2 x mean (3, 4, 2, 30)
    np.testing.assert_allclose(ipm[1], W_T[1] + np.array([-4.0]), rtol=1e-6)
    np.testing.assert_allclose(ipm[3], [-60.0], rtol=1e-6)
    mimic = parameters_to_ndarrays(out[4][1].parameters)  # partition 2's reply: the lowest honest partition
    for got, want in zip(mimic, parameters_to_ndarrays(HONEST_REPLIES[0][1].parameters)):
        np.testing.assert_array_equal(got, want)


def test_before_its_round_an_attacker_is_honest_and_nothing_changes():
    accepted = [_reply(0, [9.0, 9.0, 9.0], [9.0])] + HONEST_REPLIES
    assert _apply("ipm:0:2@3", accepted, server_round=2) is accepted
    later = _apply("ipm:0:2@3,mimic:1@2", accepted + [_reply(1, [8.0, 8.0, 8.0], [8.0])], server_round=2)
    mimic = parameters_to_ndarrays(later[4][1].parameters)  # partition 0 is honest in round 2: the lowest
    np.testing.assert_array_equal(mimic[0], parameters_to_ndarrays(accepted[0][1].parameters)[0])
    assert _apply("scale:0:10", accepted) is accepted  # a node-side attack is not the server's
    alone = [_reply(0, [9.0, 9.0, 9.0], [9.0])]
    assert _apply("ipm:0", alone) is alone  # no honest reply: nothing to craft from


def test_a_reply_without_its_partition_is_refused():
    proxy, res = _reply(2, [1.0, 2.0, 0.0], [10.0])
    res.metrics = {}
    with pytest.raises(RuntimeError, match="names no partition"):
        _apply("ipm:0", [(proxy, res)])


K = 4


class Everyone(SimpleClientManager):
    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return [self.clients[str(k)] for k in range(K)]


def test_a_fedavg_round_aggregates_the_crafted_reply(tmp_path):
    """Real FedAvg clients behind NodeClient (which names each reply's partition in such a run)
    and DriftServer's screen + aggregate: the new model is the weighted mean of the three honest
    replies and partition 0's IPM reply, w_t - 0.5 x the honest mean update."""
    cfg = validate_config({"strategy": "fedavg", "dataset": "synthetic", "model": "logreg", "fraction-fit": 1.0,
                           "min-fit-clients": K, "min-available-clients": K, "learning-rate": 0.1, "batch-size": 8,
                           "inject-faults": "ipm:0:0.5"})
    w0 = get_weights(build_model("logreg", input_shape("synthetic"), seed=1))
    strategy = RoundByRound(DriftFedAvg.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None)),
                            cfg, tmp_path, num_rounds=1)
    manager = Everyone()
    sizes = [12, 20, 16, 24]
    for k in range(K):
        g = torch.Generator().manual_seed(10 + k)
        x, y = torch.randn(sizes[k], 60, generator=g), torch.randint(0, 10, (sizes[k],), generator=g)
        client = make_client(fedavg.UPDATE, dict(cfg), x, y, context=fake_context(), partition=k, num_partitions=K)
        manager.register(Proxy(str(k), NodeClient(client)))
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(w0), manager)
    results = [(p, p.fit(ins, None, None)) for p, ins in instructions]
    assert [r.metrics["partition"] for _, r in results] == [0, 1, 2, 3]
    replies = [parameters_to_ndarrays(r.parameters) for _, r in results]
    new = parameters_to_ndarrays(strategy.aggregate_fit(1, results, [])[0])
    for i in range(len(w0)):
        w = w0[i].astype(np.float64)
        honest_mean = np.mean([r[i].astype(np.float64) - w for r in replies[1:]], axis=0)
        crafted = w - 0.5 * honest_mean
        want = (sizes[0] * crafted + sum(n * r[i].astype(np.float64) for n, r in zip(sizes[1:], replies[1:]))) / sum(sizes)
        np.testing.assert_allclose(new[i], want, rtol=1e-5, atol=1e-6)
    assert "partition_mean" not in strategy.row  # bookkeeping, not a metric column


def test_cohort_nodes_reply_in_full_with_an_omniscient_attack():
    """``cohort-replies = "auto"`` sums only where it can: not where the server replaces single
    replies (``"sum"`` is refused: tests/server/test_summed_replies.py)."""
    from fl_app.common.execution_checks import summed_replies
    from fl_app.registry import METHODS

    cfg = validate_config({"strategy": "fedavg", "execution": "cohort"})
    assert summed_replies(cfg, METHODS["fedavg"].strategy)
    assert not summed_replies({**cfg, "inject-faults": "mimic:0"}, METHODS["fedavg"].strategy)
