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


def test_a_resumed_run_keeps_one_row_per_fit(tmp_path):
    """A run killed after round 3's fits were recorded but with its checkpoint at round 2 runs
    round 3 again on resume: its old rows go, so each fit of the finished run is one row (the
    resumed server drops them as it starts; before, round 3 was listed twice)."""
    from fl_app.registry import validate_config
    from fl_app.server.checkpoint import Checkpoint
    from fl_app.server.server import DriftServer

    run = tmp_path / "run"
    run.mkdir()
    for rnd in (1, 2, 3):
        record_ray_nodes(run, rnd, [("0", {"ray_node": "a"}), ("1", {"ray_node": f"n{rnd}"})])
    cfg = validate_config({"num-server-rounds": 4})
    w = [np.zeros(2, np.float32)]
    DriftServer(client_manager=FakeManager(2), cfg=cfg, run_dir=run, resume_from=Checkpoint(round=2, weights=w))
    assert read_ray_nodes(run) == {1: {"a", "n1"}, 2: {"a", "n2"}}
    record_ray_nodes(run, 3, [("0", {"ray_node": "a"})])  # round 3 again
    lines = (run / "ray-nodes.csv").read_text().splitlines()
    assert lines[0] == "round,flower_node,ray_node" and [ln.split(",")[0] for ln in lines[1:]] == ["1", "1", "2", "2", "3"]
