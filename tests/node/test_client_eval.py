"""Per-client evaluation (``client-test-fraction``): each client's local test split, cut from its
partition, scored with the global model in every evaluated round; mean, std and worst-10% client
accuracy in metrics.csv."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.common import Code, EvaluateRes, Status

from fl_app.registry import validate_config
from fl_app.server.recording import client_accuracy_stats
from runner.results.report import read_metrics
from tasks.partition_spec import PartitionSpec
from tasks.partitioning import load_client_split, load_partition, split_tensors
from tests.kit import FakeManager, Proxy, fit_res
from tests.kit_server import make_strategy


def test_client_accuracy_stats_by_hand():
    # 12 clients: worst 10% = the ceil(1.2) = 2 lowest (0.1, 0.2): 0.15; population std.
    accs = [0.1, 0.2] + [0.9] * 10
    out = client_accuracy_stats(accs)
    assert out["client_accuracy_mean"] == pytest.approx((0.3 + 9.0) / 12)
    assert out["client_accuracy_std"] == pytest.approx(np.std(accs))
    assert out["client_accuracy_worst10"] == pytest.approx(0.15)
    assert out["client_eval_clients"] == 12
    assert client_accuracy_stats([0.5, 0.7])["client_accuracy_worst10"] == 0.5  # at least one client
    assert math.isnan(client_accuracy_stats([])["client_accuracy_mean"])


def test_config_key_range():
    assert validate_config({})["client-test-fraction"] == 0.0
    with pytest.raises(Exception, match="client-test-fraction"):
        validate_config({"client-test-fraction": 1.0})


def test_split_tensors_is_seeded_disjoint_and_complete():
    x, y = torch.arange(20.0)[:, None], torch.arange(20)
    (xtr, ytr), (xte, yte) = split_tensors(x, y, 0.25, seed=3)
    assert len(yte) == 5 and len(ytr) == 15
    assert sorted(torch.cat([ytr, yte]).tolist()) == list(range(20))
    (_, ytr2), (_, yte2) = split_tensors(x, y, 0.25, seed=3)
    assert torch.equal(yte, yte2) and torch.equal(ytr, ytr2)
    assert len(split_tensors(x, y, 0.01, seed=0)[1][1]) == 1  # at least one test example


@pytest.mark.parametrize("dataset", ["synthetic", "mnist"])
def test_client_split_cuts_the_partition(dataset, request):
    """Train and test together are exactly the partition; the same seed gives the same cut.
    MNIST: the session's sample of it (conftest.py), as the check compares every pixel."""
    data_dir = str(request.getfixturevalue("small_mnist")) if dataset != "synthetic" else ""
    spec = PartitionSpec(dataset=dataset, num_partitions=10, alpha=0.5, seed=1, data_dir=data_dir)
    x, y = load_partition(spec, 2)
    (xtr, ytr), (xte, yte) = load_client_split(spec, 2, 0.2)
    assert len(yte) == math.ceil(0.2 * len(y)) and len(ytr) + len(yte) == len(y)
    both = torch.cat([xtr, xte]).flatten(1)
    assert sorted(map(tuple, both.round(decimals=4).tolist())) == sorted(map(tuple, x.flatten(1).round(decimals=4).tolist()))
    load_client_split.cache_clear()
    (_, ytr2), (_, yte2) = load_client_split(spec, 2, 0.2)
    assert torch.equal(yte, yte2)


def eval_res(acc: float) -> EvaluateRes:
    return EvaluateRes(Status(Code.OK, ""), 0.5, 10, {"accuracy": acc})


class EvalProxy(Proxy):
    """A node that scores the global model on its local test split at ``accuracy``."""

    def __init__(self, cid, accuracy):
        super().__init__(cid)
        self.accuracy, self.asked = accuracy, 0

    def evaluate(self, ins, timeout, group_id):
        self.asked += 1
        return eval_res(self.accuracy)


class EvalManager(FakeManager):
    def __init__(self, accuracies):
        self.proxies = [EvalProxy(str(i), a) for i, a in enumerate(accuracies)]


def test_row_waits_for_the_clients_scores(tmp_path):
    """The server's evaluate step asks the clients after its own evaluation, and the round's
    row (written by the record step after it) has both."""
    strategy, w0 = make_strategy(tmp_path, rounds=1, **{"client-test-fraction": 0.2})
    manager = EvalManager([0.2, 0.6, 0.8, 1.0])
    params = strategy.initialize_parameters(manager)
    strategy.evaluate(0, params)
    assert all(p.asked == 0 for p in manager.proxies)  # not for the initial model
    strategy.configure_fit(1, params, manager)
    new, _ = strategy.aggregate_fit(1, [(Proxy(str(i)), fit_res(w0, 5, {})) for i in range(4)], [])
    strategy.evaluate(1, new)
    assert [p.asked for p in manager.proxies] == [1, 1, 1, 1]  # every client
    row = read_metrics(strategy.run_dir)[0]
    assert row["client_accuracy_mean"] == pytest.approx(0.65) and row["client_accuracy_worst10"] == pytest.approx(0.2)
    assert row["client_eval_clients"] == 4 and row["test_accuracy"] == pytest.approx(0.6)
    assert (strategy.run_dir / "summary.json").exists()  # the last round is finished after the clients


def test_off_by_default_asks_no_client(tmp_path):
    strategy, w0 = make_strategy(tmp_path, rounds=1)
    manager = EvalManager([0.5] * 4)
    params = strategy.initialize_parameters(manager)
    strategy.configure_fit(1, params, manager)
    new, _ = strategy.aggregate_fit(1, [(Proxy(str(i)), fit_res(w0, 5, {})) for i in range(4)], [])
    strategy.evaluate(1, new)
    assert "client_accuracy_mean" not in read_metrics(strategy.run_dir)[0]
    assert all(p.asked == 0 for p in manager.proxies)


def test_client_evaluation_leaves_the_fit_sampling_unchanged():
    """Evaluating every client between fit rounds uses no draw of the seeded sampler, so a run
    with client evaluation samples the same clients for fit as one without it."""
    from fl_app.server.sampling import SeededClientManager
    from tests.kit import Proxy

    def fit_draws(evaluate_all: bool) -> list[list[int]]:
        manager = SeededClientManager(5)
        for pid in range(10):
            manager.register(Proxy(str(500 - pid), partition=pid))
        out = []
        for _ in range(4):
            out.append(sorted(c.partition for c in manager.sample(3)))
            if evaluate_all:
                assert len(manager.sample(10, min_num_clients=1)) == 10
        return out

    assert fit_draws(True) == fit_draws(False)


@pytest.mark.slow  # launches a simulation: about 2.5 min on the shared 2-core machine
def test_tiny_run_writes_client_columns(tmp_path):
    """End to end through `flwr run`: 2 rounds, 4 synthetic clients, a 25% local test split each."""
    from tests.kit_runs import local_simulation

    cfg = {"strategy": "scaffold", "dataset": "synthetic", "model": "logreg", "num-server-rounds": 2,
           "fraction-fit": 0.5, "learning-rate": 0.05, "results-dir": str(tmp_path), "run-name": "c",
           "client-test-fraction": 0.25}
    lines: list[str] = []
    with local_simulation() as sim:
        assert sim.run(cfg, num_supernodes=4, on_line=lines.append) == 0
    rows = read_metrics(tmp_path / "c")
    assert len(rows) == 2, "\n".join(lines[-30:])
    for r in rows:
        assert r["client_eval_clients"] == 4 and r["num_clients"] == 2
        assert 0 <= r["client_accuracy_worst10"] <= r["client_accuracy_mean"] <= 1
        assert r["client_accuracy_std"] >= 0


def test_comparison_carries_the_client_columns(tmp_path):
    import json

    from runner.results.report import compare, write_comparison

    dirs = []
    for seed, worst in enumerate([0.4, 0.6]):
        d = tmp_path / f"fedavg-seed{seed}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"final_accuracy": 0.7, "best_accuracy": 0.7, "rounds": 1,
                                                    "total_seconds": 1.0, "config": {"seed": seed}}))
        (d / "metrics.csv").write_text("round,test_accuracy,client_accuracy_mean,client_accuracy_std,"
                                       f"client_accuracy_worst10\n1,0.7,0.75,0.1,{worst}\n")
        dirs.append(d)
    table = compare({"fedavg": dirs})
    assert table[0]["final_client_accuracy_worst10"] == pytest.approx(0.5)
    write_comparison(table, tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "client accuracy, local test splits (final): mean / std / worst 10%" in md and "0.7500 / 0.1000 / 0.5000" in md


def test_client_trains_on_the_rest_and_evaluates_on_its_split():
    from clients import fedavg
    from fl_app.node.drift_client import DriftClient
    from tasks.models import get_weights
    from tests.kit import fake_context

    cfg = validate_config({"dataset": "synthetic", "model": "logreg", "client-test-fraction": 0.25, "seed": 2})
    client = DriftClient(fedavg.UPDATE, cfg, fake_context(), partition_id=1, num_partitions=4)
    x, y = load_partition(PartitionSpec.from_config(cfg, 4), 1)
    assert len(client.data[1]) + len(client.test_data[1]) == len(y)
    assert len(client.test_data[1]) == math.ceil(0.25 * len(y))
    _, n, metrics = client.evaluate(get_weights(client.model), {})
    assert n == len(client.test_data[1]) and 0 <= metrics["accuracy"] <= 1
    _, n_fit, _ = client.fit(get_weights(client.model), {"server-round": 1})
    assert n_fit == len(client.data[1])  # FedAvg weights by the examples trained on
    off = DriftClient(fedavg.UPDATE, validate_config({"dataset": "synthetic", "model": "logreg", "seed": 2}), fake_context(), 1, 4)
    assert off.test_data is off.data and len(off.data[1]) == len(y)  # 0.0: unchanged
