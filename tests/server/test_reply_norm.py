"""A reply of finite values whose float32 norm overflows is rejected like one with a NaN.

SCAFFOLD at learning rate 3 (with ``inject-faults = "nan:1"``) aggregated such replies: every
value finite, so the NaN check let them through, and the server's float32 sums over them
overflowed (``cv_norm`` inf) with no rejection counted. The rule (``protocol.layout.all_finite``):
the squared norm of a reply's floating arrays must fit a float32 (at most about 3.4e38)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from clients import scaffold
from fl_app.node.drift_client import tensors_finite, tensors_squared_norm
from fl_app.registry import validate_config
from fl_app.server.recording import check_reply
from protocol.cohort import SumSpec, sum_replies
from protocol.layout import FLOAT32_MAX, all_finite, squared_norm
from strategies.base import fedavg_kwargs
from strategies.scaffold import ScaffoldStrategy
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import Proxy, fake_context, make_client
from tests.kit_server import RoundByRound

# 2e19 is a finite float32 whose square, 4e38, is not: one such value overflows the float32 norm;
# 1e19 (square 1e38) does not, and neither do three of them (3e38), but four do (4e38).
OVER = [np.array([2e19, 0.0], np.float32)]
UNDER = [np.array([1e19, 1e19], np.float32), np.array([1e19], np.float32), np.array(7, np.int64)]
FOUR = [np.array([1e19, 1e19], np.float32), np.array([1e19, -1e19], np.float32)]


def test_the_float32_norm_of_the_replies_by_hand():
    assert all(np.isfinite(a).all() for a in OVER + UNDER + FOUR)  # no NaN, no Inf anywhere
    with np.errstate(over="ignore"):  # numpy's own float32 norm of them
        assert np.isinf(np.linalg.norm(OVER[0])) and np.isfinite(np.linalg.norm(UNDER[0]))
    assert squared_norm(OVER) == pytest.approx(4e38, rel=1e-6)
    assert squared_norm(UNDER) == pytest.approx(3e38, rel=1e-6) and squared_norm(FOUR) == pytest.approx(4e38, rel=1e-6)
    assert 3e38 < FLOAT32_MAX < 4e38
    assert [all_finite(r) for r in (OVER, UNDER, FOUR)] == [False, True, False]
    assert not all_finite([np.array([np.nan], np.float32)]) and not all_finite([np.array([np.inf], np.float32)])


def test_a_node_on_its_device_decides_as_the_server():
    for reply in (OVER, UNDER, FOUR):
        tensors = [torch.from_numpy(a) for a in reply]
        assert tensors_squared_norm(tensors) == pytest.approx(squared_norm(reply), rel=1e-12)
        assert tensors_finite(tensors) == all_finite(reply)


def fit_res(arrays: list[np.ndarray]) -> FitRes:
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 4, {})


def test_the_server_and_a_cohort_node_reject_it_naming_the_norm():
    shapes = [a.shape for a in OVER]
    problem = check_reply(fit_res(OVER), shapes)
    assert problem.startswith("its float32 norm is not finite (finite values, but norm^2 = 4e+38")
    assert check_reply(fit_res(UNDER), [a.shape for a in UNDER]) == ""
    assert check_reply(fit_res([np.array([np.nan, 0.0], np.float32)]), shapes) == "non-finite values (NaN or Inf)"
    sent = [np.zeros(2, np.float32)]
    _, total, _ = sum_replies([(0, [np.ones(2, np.float32)], 3, {}, sent), (1, OVER, 5, {}, sent)], {},
                              SumSpec(mean=1, head=(), body=()))
    assert total == 3  # the second client's 5 examples left out of the node's sum


def test_scaffold_rejects_an_overflowing_reply_and_keeps_c_finite(tmp_path):
    """Three SCAFFOLD clients train one round; the third's reply is replaced by the same arrays
    with one weight at 3e38 (finite): it is rejected (num_rejected 1), and the new weights and
    c are the two others' (each weight the n_k-weighted mean of theirs; c = (dc_0 + dc_1) / N)."""
    cfg = validate_config({"strategy": "scaffold", "dataset": "synthetic", "model": "logreg", "fraction-fit": 1.0,
                           "min-fit-clients": 3, "min-available-clients": 3, "learning-rate": 0.1})
    w0 = get_weights(build_model("logreg", input_shape("synthetic"), seed=3))
    inner = ScaffoldStrategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))
    strategy = RoundByRound(inner, cfg, tmp_path, num_rounds=1)
    from flwr.server.client_manager import SimpleClientManager

    manager = SimpleClientManager()
    for k in range(3):
        g = torch.Generator().manual_seed(10 + k)
        x, y = torch.randn(6, 60, generator=g), torch.randint(0, 10, (6,), generator=g)
        manager.register(Proxy(str(k), make_client(scaffold.UPDATE, dict(cfg), x, y, context=fake_context())))
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(w0), manager)
    results = [(p, p.fit(ins, None, None)) for p, ins in instructions]
    replies = [parameters_to_ndarrays(res.parameters) for _, res in results]
    blown = [a.copy() for a in replies[2]]
    blown[0].flat[0] = np.float32(3e38)
    assert all(np.isfinite(a).all() for a in blown)
    results[2] = (results[2][0], fit_res(blown))
    parameters, metrics = strategy.aggregate_fit(1, results, [])
    assert strategy.row["num_rejected"] == 1 and strategy.row["num_clients"] == 2
    new = parameters_to_ndarrays(parameters)
    n = [res.num_examples for _, res in results[:2]]
    for i in range(len(w0)):  # the weights: the mean over the two accepted replies
        want = (n[0] * replies[0][i].astype(np.float64) + n[1] * replies[1][i]) / sum(n)
        np.testing.assert_allclose(new[i], want, rtol=1e-5, atol=1e-7)
    assert np.isfinite(metrics["cv_norm"])
    c = [(replies[0][len(w0) + i].astype(np.float64) + replies[1][len(w0) + i]) / 3 for i in range(len(w0))]
    assert metrics["cv_norm"] == pytest.approx(float(np.sqrt(sum((a**2).sum() for a in c))), rel=1e-5)
