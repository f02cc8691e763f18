"""The cohort wire codec (protocol/cohort.py): K virtual clients' FitIns as one bundle
and the node's one reply as K FitRes, each client getting exactly what it would have on its own."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.common import Code, FitIns, Parameters, Status, ndarrays_to_parameters, parameters_to_ndarrays

from protocol.cohort import (
    COUNTS,
    PARTITIONS,
    bundle_instructions,
    bundle_replies,
    split_instructions,
    split_replies,
)
from tests.kit_server import reply_as_fitres


def arrays(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(3, 2)).astype(np.float32), rng.integers(0, 5, size=4).astype(np.int64)]


def fit_ins(seed: int, config: dict) -> FitIns:
    return FitIns(parameters=ndarrays_to_parameters(arrays(seed)), config=config)


def node_side(ins: FitIns):
    """What the node's NumPyClient.fit receives from Flower for the bundle."""
    return split_instructions(parameters_to_ndarrays(ins.parameters), dict(ins.config))


def assert_same_config(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        assert type(got[k]) is type(v), k
        assert got[k] == v or (isinstance(v, float) and math.isnan(v) and math.isnan(got[k])), k


def test_round_trip_identical_arrays_travel_once():
    config = {"server-round": 3, "lr": 0.1, "proximal": True, "run-dir": "/tmp/x", "blob": b"\x00\x01"}
    items = [(p, fit_ins(0, dict(config))) for p in (4, 1, 7)]
    bundle = bundle_instructions(items)
    assert len(bundle.parameters.tensors) == 2  # sent once, not three times
    assert bundle.config[PARTITIONS] == "4,1,7" and COUNTS not in bundle.config
    split = node_side(bundle)
    assert [p for p, _, _ in split] == [4, 1, 7]
    for _, got, cfg in split:
        for a, b in zip(got, arrays(0)):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        assert_same_config(cfg, config)


def test_differing_arrays_and_configs():
    configs = [{"server-round": 2, "seed-offset": 1, "lr": 0.1, "nan": float("nan")},
               {"server-round": 2, "seed-offset": 2.0, "lr": 0.1, "nan": float("nan"), "only-here": "x"},
               {"server-round": 2, "seed-offset": True, "lr": 0.1, "nan": float("nan")}]
    items = [(p, fit_ins(p, configs[i])) for i, p in enumerate((0, 5, 9))]
    bundle = bundle_instructions(items)
    assert len(bundle.parameters.tensors) == 6 and bundle.config[COUNTS] == "2,2,2"
    assert bundle.config["server-round"] == 2 and "seed-offset" not in bundle.config  # 1, 2.0, True differ
    for (p, got, cfg), want in zip(node_side(bundle), configs):
        for a, b in zip(got, arrays(p)):
            assert np.array_equal(a, b)
        assert_same_config(cfg, want)


def test_one_client_bundle():
    bundle = bundle_instructions([(3, fit_ins(1, {"a": 1}))])
    [(p, got, cfg)] = node_side(bundle)
    assert p == 3 and cfg == {"a": 1} and all(np.array_equal(a, b) for a, b in zip(got, arrays(1)))


def test_replies_round_trip_with_a_failed_client():
    replies = [(2, arrays(2), 10, {"loss": 0.5, "steps": 3, "ok": True, "tag": "a"}),
               (0, arrays(0)[:1], 7, {"loss": np.float32(0.25)})]
    ret = bundle_replies(replies, {5: "ValueError: boom"})
    assert ret[1] == 17 and len(ret[0]) == 3
    res = reply_as_fitres(ret)
    split = split_replies(res)
    assert [p for p, _ in split] == [2, 0, 5]
    assert split[2][1] == "ValueError: boom"
    for (_, fr), (_, want, n, _) in zip(split[:2], replies):
        assert fr.status.code == Code.OK and fr.num_examples == n
        assert fr.parameters.tensor_type == res.parameters.tensor_type
        # each client's bytes are exactly those its own reply would have carried
        assert fr.parameters.tensors == ndarrays_to_parameters(want).tensors
    assert_same_config(split[0][1].metrics, replies[0][3])
    assert split[1][1].metrics == {"loss": 0.25}


def test_failed_bundle_fails_every_client():
    ret = bundle_replies([(1, arrays(1), 3, {})], {})
    res = reply_as_fitres(ret)
    res.status = Status(code=Code.FIT_NOT_IMPLEMENTED, message="no fit")
    assert split_replies(res) == [(1, "cohort node failed: no fit")]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="'blob'"):
        bundle_instructions([(0, fit_ins(0, {"blob": b"a"})), (1, fit_ins(0, {"blob": b"b"}))])
    with pytest.raises(ValueError, match="'emb'"):
        bundle_replies([(0, arrays(0), 1, {"emb": b"x"})], {})
    with pytest.raises(ValueError, match="repeat"):
        bundle_instructions([(0, fit_ins(0, {})), (0, fit_ins(0, {}))])
    with pytest.raises(ValueError, match="empty"):
        bundle_instructions([])
    with pytest.raises(ValueError, match="reserved"):
        bundle_instructions([(0, fit_ins(0, {PARTITIONS: "0"}))])
    with pytest.raises(ValueError, match="tensor types"):
        other = FitIns(parameters=Parameters(tensors=[], tensor_type="other"), config={})
        bundle_instructions([(0, fit_ins(0, {})), (1, other)])
    with pytest.raises(ValueError, match="not a cohort bundle"):
        split_instructions(arrays(0), {"a": 1})
    with pytest.raises(ValueError, match="does not cut"):
        split_instructions(arrays(0), {PARTITIONS: "0,1", COUNTS: "1,2"})
    with pytest.raises(ValueError, match="not a cohort reply"):
        split_replies(reply_as_fitres((arrays(0), 1, {})))
