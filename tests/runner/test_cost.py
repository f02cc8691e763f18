"""What a run costs beside its accuracy: rounds to the run's target accuracy,
megabytes per client per round measured from the messages, client compute per round; in
metrics.csv (``fl_app/server/recording.py``) and comparison.md/.csv (``runner/results/report.py``)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from flwr.common import parameters_to_ndarrays

from fl_app.config import ConfigError
from fl_app.registry import validate_config
from runner.results.report import (
    compare,
    cost_columns,
    read_metrics,
    rounds_to_target,
    tail_header,
    write_comparison,
)
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import FakeManager, Proxy, fit_res, serve_in_process
from tests.kit_server import make_strategy


def nbytes(parameters) -> int:
    return sum(a.nbytes for a in parameters_to_ndarrays(parameters))


# ------------------------------------------------------------------ bytes, from the messages
def test_bytes_of_the_round_are_the_arrays_sent_and_received(tmp_path):
    """By hand: FedAvg sends the 2x2 + 2 float32 model (24 bytes) to each of 4 clients; the
    replies are 24, 24, 24 (NaN, rejected but received) and 32 bytes (a 3x2 array, rejected):
    up = (24 + 24 + 24 + 32) / 4 = 26 bytes per client."""
    strategy, _ = make_strategy(tmp_path)
    manager = FakeManager(4)
    params = strategy.initialize_parameters(manager)
    instructions = strategy.configure_fit(1, params, manager)
    assert [nbytes(ins.parameters) for _, ins in instructions] == [24] * 4
    good = [np.ones((2, 2), np.float32), np.ones(2, np.float32)]
    results = [(Proxy("0"), fit_res(good, 10, {})), (Proxy("1"), fit_res(good, 10, {})),
               (Proxy("2"), fit_res([np.full((2, 2), np.nan, np.float32), np.ones(2, np.float32)], 10, {})),
               (Proxy("3"), fit_res([np.ones((3, 2), np.float32), np.ones(2, np.float32)], 10, {}))]
    strategy.aggregate_fit(1, results, failures=[RuntimeError("no reply, no bytes")])
    assert strategy.row["bytes_down_per_client"] == 24
    assert strategy.row["bytes_up_per_client"] == 26


@pytest.mark.parametrize("method,copies", [("fedavg", 1), ("scaffold", 2), ("fedsmoo", 2)])
def test_metrics_csv_bytes_equal_the_messages_each_method_sends(tmp_path, monkeypatch, method, copies):
    """Two rounds of the ServerApp and ClientApp in this process (``serve_in_process``), every
    FitIns and FitRes measured where the client receives and answers it: metrics.csv's bytes per
    client equal the mean of those messages' array bytes, and SCAFFOLD and FedSMOO send and
    receive twice FedAvg's (the model, then c or s: logreg's parameters are all trainable)."""
    seen: dict[int, list[tuple[int, int]]] = {}
    fit = Proxy.fit

    def measured_fit(self, ins, timeout, group_id):
        res = fit(self, ins, timeout, group_id)
        seen.setdefault(int(ins.config["server-round"]), []).append((nbytes(ins.parameters), nbytes(res.parameters)))
        return res

    monkeypatch.setattr(Proxy, "fit", measured_fit)
    cfg = {"strategy": method, "dataset": "synthetic", "model": "logreg", "num-server-rounds": 2,
           "fraction-fit": 0.75, "learning-rate": 0.05, "tracking": "none", "checkpoint-every": 0,
           "results-dir": str(tmp_path), "run-name": method}
    serve_in_process(cfg, 4)
    rows = read_metrics(tmp_path / method)
    model = sum(w.nbytes for w in get_weights(build_model("logreg", input_shape("synthetic"))))
    assert [r["round"] for r in rows] == [1, 2] and sorted(seen) == [1, 2]
    for r in rows:
        messages = seen[r["round"]]
        assert len(messages) == 3
        assert r["bytes_down_per_client"] == np.mean([down for down, _ in messages]) == copies * model
        assert r["bytes_up_per_client"] == np.mean([up for _, up in messages]) == copies * model
        assert r["fit_seconds_mean"] > 0  # the clients' compute, reported by fl_app/node/node_client.py


# ------------------------------------------------------------------ rounds to target
def test_rounds_to_target_on_a_hand_made_table():
    rows = [{"round": 1, "test_accuracy": 0.5}, {"round": 2, "test_accuracy": None},  # not evaluated
            {"round": 3, "test_accuracy": math.nan}, {"round": 4, "test_accuracy": 0.79999},
            {"round": 5, "test_accuracy": 0.8}, {"round": 6, "test_accuracy": 0.95}]
    assert rounds_to_target(rows, 0.8) == 5  # at or above: 0.8 itself counts
    assert rounds_to_target(rows, 0.5) == 1
    assert rounds_to_target(rows, 0.9) == 6
    assert rounds_to_target(rows, 0.96) is None
    assert rounds_to_target([], 0.5) is None


def test_target_accuracy_is_a_run_config_key():
    assert validate_config({})["target-accuracy"] == 0.0  # no target unless asked for
    assert validate_config({"target-accuracy": 0.9})["target-accuracy"] == 0.9
    with pytest.raises(ConfigError, match=r"'target-accuracy' = 1.5 is invalid: must be in \[0, 1\)"):
        validate_config({"target-accuracy": 1.5})


# ------------------------------------------------------------------ the comparison
def make_run(folder, seed, accs, target=0.0, down=None, up=None, fit=None, untrained=False):
    """A finished run: summary.json and a metrics.csv with the cost columns when given."""
    folder.mkdir(parents=True)
    config = {"seed": seed, **({"target-accuracy": target} if target is not None else {})}
    (folder / "summary.json").write_text(json.dumps({
        "final_accuracy": accs[-1], "best_accuracy": max(accs), "total_seconds": 10.0, "rounds": len(accs),
        "config": config, "untrained": untrained}))
    columns = ["round", "test_accuracy"] + [c for c, v in (("bytes_down_per_client", down),
                                                            ("bytes_up_per_client", up),
                                                            ("fit_seconds_mean", fit)) if v is not None]
    with (folder / "metrics.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for i, acc in enumerate(accs):
            writer.writerow([i + 1, acc] + [v[i] for v in (down, up, fit) if v is not None])
    return folder


def test_comparison_shows_the_three_cost_columns_for_every_row(tmp_path):
    """Hand-made runs: fedavg (2 seeds, target 0.8 reached at rounds 2 and 3; 1 MB each way;
    fit 1.0 and 3.0 s per round), scaffold (2 seeds, reached by one; twice the bytes; 2.0 and
    5.0 s per round) and an old run without the columns or a target (n/a, no target)."""
    mb = 1_000_000
    runs = {
        "fedavg": [make_run(tmp_path / "fedavg-seed0", 0, [0.5, 0.8, 0.9], 0.8, [mb] * 3, [mb] * 3, [1.0] * 3),
                   make_run(tmp_path / "fedavg-seed1", 1, [0.5, 0.7, 0.85], 0.8, [mb] * 3, [mb] * 3, [3.0] * 3)],
        "scaffold": [make_run(tmp_path / "scaffold-seed0", 0, [0.6, 0.85, 0.9], 0.8, [2 * mb] * 3, [2 * mb] * 3,
                              [2.0, 2.0, 2.0]),
                     make_run(tmp_path / "scaffold-seed1", 1, [0.5, 0.6, 0.7], 0.8, [2 * mb] * 3, [2 * mb] * 3,
                              [4.0, 5.0, 6.0])],
        "old": [make_run(tmp_path / "old-seed0", 0, [0.4, 0.5, 0.6], target=None)],
    }
    table = {r["method"]: r for r in compare(runs)}
    assert table["fedavg"]["rounds_to_target_mean"] == 2.5 and table["fedavg"]["target_reached_seeds"] == 2
    assert table["scaffold"]["rounds_to_target_mean"] == 2 and table["scaffold"]["target_reached_seeds"] == 1
    assert table["scaffold"]["mb_down_per_round"] == 2.0 and table["scaffold"]["mb_up_per_round"] == 2.0
    assert table["scaffold"]["client_seconds_per_round_mean"] == 3.5  # runs: 2.0 and 5.0
    # paired compute, scaffold - fedavg per seed: 2 - 1 = 1 and 5 - 3 = 2: mean 1.5
    assert table["scaffold"]["compute_diff_seeds"] == 2 and table["scaffold"]["compute_diff_mean"] == 1.5
    write_comparison(list(table.values()), tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text().splitlines()
    header = md[0].split(" | ")
    cells = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in md[2:5]}
    cost = [header.index(h) for h in ("rounds to 80%", "MB per client per round (down / up)",
                                      "client compute s per round")]
    assert [cells["fedavg"][i] for i in cost] == ["2.5", "1 / 1", "2 ± 1.4"]
    assert [cells["scaffold"][i] for i in cost] == ["2.0 (1/2 seeds)", "2 / 2", "3.5 ± 2.1"]
    assert [cells["old"][i] for i in cost] == ["no target", "n/a", "n/a"]
    assert "client compute − fedavg, paired (95% CI)" in md[0]
    written = list(csv.DictReader((tmp_path / "out" / "comparison.csv").open()))
    assert [r["rounds_to_target_mean"] for r in written] == ["2.5", "2.0", ""]


def test_a_target_never_reached_and_untrained_runs(tmp_path):
    runs = [make_run(tmp_path / "a-seed0", 0, [0.1, 0.2], 0.9, fit=[1.0, 1.0]),
            make_run(tmp_path / "a-seed1", 1, [0.1, 0.1], 0.9, fit=[9.0, 9.0], untrained=True)]
    table = compare({"a": runs})
    assert table[0]["target_seeds"] == 1 and table[0]["rounds_to_target_mean"] is None  # untrained: no result
    assert table[0]["client_seconds_per_round_mean"] == 1.0
    write_comparison(table, tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "| not reached | n/a | 1 |" in md and "| a (!) |" in md
    assert "**Warning: rounds without any usable client update**" in md and "- a: a-seed1: untrained" in md
    assert cost_columns([])["target_accuracy"] is None


def test_the_last_rounds_header_says_how_many_rounds_were_averaged(tmp_path):
    """A 3-round comparison averages 3 rounds, and its header says so (it said 'last 5')."""
    runs = {m: [make_run(tmp_path / f"{m}-seed{s}", s, [0.5, 0.6, 0.7 + 0.01 * s + (m == "fedprox") * 0.02])
                for s in (0, 1)] for m in ("fedavg", "fedprox")}
    table = compare(runs)
    assert {r["tail_rounds"] for r in table} == {3}
    write_comparison(table, tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "last 3 rounds − fedavg, paired (95% CI)" in md and "last 5" not in md
    assert tail_header([{"tail_rounds": 5}, {"tail_rounds": "3-5"}]) == "last 3-5 rounds"
    assert tail_header([{"tail_rounds": 1}]) == "last round"


def test_docs_results_table_shows_the_cost_columns(tmp_path):
    """scripts/make_results.py's table (docs/results.md): rounds to the experiment's target, then
    MB per client per round and client compute per round; n/a for a run without the columns."""
    from tests.kit_runs import load_make_results

    mr = load_make_results()
    mb = 1_000_000
    new = [make_run(tmp_path / "scaffold-seed0", 0, [0.5, 0.9], None, [2 * mb] * 2, [2 * mb] * 2, [1.5, 2.5])]
    old = [make_run(tmp_path / "fedavg-seed0", 0, [0.5, 0.6], None)]
    exp = {"target-accuracy": 0.8, "strategies": ["fedavg", "scaffold"]}
    rows = {"fedavg": mr.method_row("fedavg", old, mr.experiment_target(exp), None),
            "scaffold": mr.method_row("scaffold", new, mr.experiment_target(exp), None)}
    lines = mr.results_table(exp, [("fedavg", "fedavg", "fedavg"), ("scaffold", "scaffold", "scaffold")], rows)
    header = lines[0].split(" | ")
    assert header[3:6] == ["rounds to 80%", "MB per client per round (down / up)", "client compute s per round"]
    assert lines[2].split(" | ")[3:6] == ["not reached", "n/a", "n/a"]
    assert lines[3].split(" | ")[3:6] == ["2.0", "2 / 2", "2"]
    # the target may also come from the file's [run-config] (the run-config key)
    assert mr.experiment_target({"run-config": {"target-accuracy": 0.7}}) == 0.7
    assert mr.experiment_target({}) is None


def test_runs_whose_sampled_clients_failed_are_flagged(tmp_path):
    """A client that fails every round (a FedBN client on a batch of one, say) makes the run's
    federation smaller without a word; comparison.md now marks the row (!) and names the runs."""
    def with_failures(folder, failures):
        rows = list(csv.DictReader((folder / "metrics.csv").open()))
        with (folder / "metrics.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[*rows[0], "num_failures"])
            writer.writeheader()
            writer.writerows({**r, "num_failures": n} for r, n in zip(rows, failures))
        return folder

    runs = {"fedavg": [with_failures(make_run(tmp_path / "fedavg-seed0", 0, [0.5, 0.6, 0.7]), [0, 0, 0])],
            "fedbn": [with_failures(make_run(tmp_path / "fedbn-seed0", 0, [0.5, 0.6, 0.7]), [1, 1, 1]),
                      with_failures(make_run(tmp_path / "fedbn-seed1", 1, [0.5, 0.6, 0.7]), [0, 2, 0])]}
    table = {r["method"]: r for r in compare(runs)}
    assert table["fedavg"]["client_failures"] == ""
    assert table["fedbn"]["client_failures"] == ("fedbn-seed0: 3 failed client updates in 3 of 3 rounds (every round);"
                                                 " fedbn-seed1: 2 failed client updates in 1 of 3 rounds")
    write_comparison(list(table.values()), tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "| fedbn (!) |" in md and "| fedavg |" in md
    assert "**Warning: sampled clients' updates were lost**" in md and "- fedbn: fedbn-seed0: 3 failed" in md


def test_runs_whose_client_updates_were_rejected_are_flagged(tmp_path):
    """A diverging run whose clients send back non-finite updates (SCAFFOLD at too high a rate,
    say) loses them to the server's checks (``num_rejected``), not to failures: flagged alike."""
    def with_losses(folder, failures, rejected):
        rows = list(csv.DictReader((folder / "metrics.csv").open()))
        with (folder / "metrics.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[*rows[0], "num_failures", "num_rejected"])
            writer.writeheader()
            writer.writerows({**r, "num_failures": n, "num_rejected": j} for r, n, j in zip(rows, failures, rejected))
        return folder

    runs = {"scaffold": [with_losses(make_run(tmp_path / "scaffold-seed0", 0, [0.5, 0.6, 0.1]), [0, 0, 0], [0, 0, 2]),
                         with_losses(make_run(tmp_path / "scaffold-seed1", 1, [0.5, 0.6, 0.7]), [0, 1, 0], [0, 3, 0]),
                         with_losses(make_run(tmp_path / "scaffold-seed2", 2, [0.5, 0.6, 0.7]), [0, 0, 0], [0, 0, 0])]}
    table = compare(runs)
    assert table[0]["client_failures"] == ("scaffold-seed0: 2 rejected client updates in 1 of 3 rounds;"
                                           " scaffold-seed1: 1 failed and 3 rejected client updates in 1 of 3 rounds")
