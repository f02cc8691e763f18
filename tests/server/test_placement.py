"""ray-nodes.csv and num_ray_nodes: which Ray node ran each fit (simulation on a Ray cluster)."""

from __future__ import annotations

import numpy as np

from fl_app.server.placement import read_ray_nodes, record_ray_nodes
from tests.kit import FakeManager, Proxy, fit_res
from tests.kit_server import make_strategy


def test_rounds_record_their_ray_nodes(tmp_path):
    strategy, _ = make_strategy(tmp_path, rounds=2)
    manager = FakeManager(3)
    params = strategy.initialize_parameters(manager)
    update = [np.ones((2, 2), np.float32), np.ones(2, np.float32)]
    placement = {1: ["a", "b", "a"], 2: ["b", "b", "b"]}
    for rnd in (1, 2):
        strategy.configure_fit(rnd, params, manager)
        results = [(Proxy(str(i)), fit_res(update, 10, {"train_loss": 1.0, "ray_node": node}))
                   for i, node in enumerate(placement[rnd])]
        params, _ = strategy.aggregate_fit(rnd, results, failures=[])
        strategy.evaluate(rnd, params)
    assert [r["num_ray_nodes"] for r in strategy.rows] == [2, 1]
    assert "ray_node_mean" not in strategy.rows[0]  # a string metric is not summarised
    assert read_ray_nodes(tmp_path / "run") == {1: {"a", "b"}, 2: {"b"}}


def test_no_ray_node_no_file(tmp_path):
    assert record_ray_nodes(tmp_path, 1, [("0", {})]) == {}
    assert not (tmp_path / "ray-nodes.csv").exists() and read_ray_nodes(tmp_path) == {}
