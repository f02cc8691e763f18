"""DriftServer's record: metrics.csv / summary.json contents and rejection of bad updates."""

import csv
import json

import numpy as np
from flwr.common import parameters_to_ndarrays

from fl_app.server.recording import summarise_client_metrics
from runner.results.report import compare, read_metrics, read_summary, write_comparison
from tests.kit import FakeManager, Proxy, fit_res
from tests.kit_server import make_strategy


def test_rows_summary_and_rejections(tmp_path):
    strategy, w0 = make_strategy(tmp_path)
    manager = FakeManager(4)
    params = strategy.initialize_parameters(manager)
    strategy.evaluate(0, params)
    for rnd in (1, 2):
        ins = strategy.configure_fit(rnd, params, manager)
        assert len(ins) == 4
        good = [np.ones((2, 2), np.float32) * rnd, np.ones(2, np.float32)]
        nan = [np.full((2, 2), np.nan, np.float32), np.ones(2, np.float32)]
        wrong_shape = [np.ones((3, 2), np.float32), np.ones(2, np.float32)]
        results = [
            (Proxy("0"), fit_res(good, 10, {"train_loss": 1.0, "ri": 0.2, "num_steps": 3})),
            (Proxy("1"), fit_res(good, 30, {"train_loss": 2.0, "ri": 0.6, "num_steps": 5})),
            (Proxy("2"), fit_res(nan, 10, {"train_loss": 0.0})),
            (Proxy("3"), fit_res(wrong_shape, 10, {"train_loss": 0.0})),
        ]
        params, _ = strategy.aggregate_fit(rnd, results, failures=[RuntimeError("boom")])
        np.testing.assert_allclose(parameters_to_ndarrays(params)[0], good[0])
        strategy.evaluate(rnd, params)

    with (tmp_path / "run" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["round"] for r in rows] == ["1", "2"]
    r = rows[1]
    assert float(r["test_accuracy"]) == 0.7 and float(r["test_loss"]) == 8.0
    assert r["num_clients"] == "2" and r["num_failures"] == "1" and r["num_rejected"] == "2"
    assert float(r["train_loss"]) == (10 * 1.0 + 30 * 2.0) / 40
    assert float(r["ri_mean"]) == 0.4 and float(r["ri_min"]) == 0.2 and float(r["ri_max"]) == 0.6
    assert "num_steps_mean" not in r
    assert 0 <= float(r["fit_phase_seconds"]) <= float(r["round_seconds"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["final_accuracy"] == 0.7
    assert summary["best_accuracy"] == 0.7 and summary["config"]["num-server-rounds"] == 2


def test_all_bad_updates_keep_global_model(tmp_path):
    strategy, w0 = make_strategy(tmp_path, **{"min-fit-fraction": 0.0})
    manager = FakeManager(2)
    params = strategy.initialize_parameters(manager)
    strategy.configure_fit(1, params, manager)
    inf = [np.full((2, 2), np.inf, np.float32), np.ones(2, np.float32)]
    new, metrics = strategy.aggregate_fit(1, [(Proxy("0"), fit_res(inf, 5, {}))], [])
    assert new is None  # Flower keeps the previous global parameters


def test_summarise_client_metrics_weights_train_loss():
    out = summarise_client_metrics([(1, {"train_loss": 1.0, "x": 2}), (3, {"train_loss": 3.0, "x": 4})])
    assert out["train_loss"] == 2.5 and out["x_mean"] == 3 and out["x_min"] == 2 and out["x_max"] == 4


def test_comparison_mean_std_over_seeds(tmp_path):
    dirs = []
    for seed, (final, best) in enumerate([(0.5, 0.6), (0.7, 0.8)]):
        d = tmp_path / f"m-seed{seed}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps(
            {"final_accuracy": final, "best_accuracy": best, "total_seconds": 1.0, "rounds": 3}))
        (d / "metrics.csv").write_text("round,test_accuracy\n1,0.4\n2,0.5\n")
        dirs.append(d)
    table = compare({"m": dirs})
    assert table[0]["seeds"] == 2
    assert abs(table[0]["final_accuracy_mean"] - 0.6) < 1e-12
    assert abs(table[0]["final_accuracy_std"] - np.std([0.5, 0.7], ddof=1)) < 1e-12
    write_comparison(table, tmp_path / "out")
    assert "0.6000 ± 0.1414" in (tmp_path / "out" / "comparison.md").read_text()
    assert read_metrics(dirs[0])[1] == {"round": 2, "test_accuracy": 0.5}


def test_too_few_successes_stop_the_run_with_a_clear_error(tmp_path):
    import pytest

    from fl_app.server.participation import RunAborted

    strategy, w0 = make_strategy(tmp_path, **{"min-fit-fraction": 0.75})
    manager = FakeManager(4)
    params = strategy.initialize_parameters(manager)
    strategy.configure_fit(1, params, manager)
    good = [np.ones((2, 2), np.float32), np.ones(2, np.float32)]
    ok = [(Proxy(str(i)), fit_res(good, 5, {})) for i in range(2)]
    with pytest.raises(RunAborted, match=r"only 2 of 4 sampled clients .*2 failed.*min-fit-fraction = 0.75"):
        strategy.aggregate_fit(1, ok, [RuntimeError("a"), RuntimeError("b")])
    # The stop is a result: summary.json says where and why, so sweeps keep it and reports show it.
    summary = read_summary(strategy.run_dir)
    assert summary["stopped"].startswith("round 1: only 2 of 4") and summary["rounds"] == 0


def test_drop_rate_is_reproducible(tmp_path):
    dropped = []
    for name in ("a", "b"):
        strategy, _ = make_strategy(tmp_path / name, **{"drop-rate": 0.5})
        manager = FakeManager(20)
        params = strategy.initialize_parameters(manager)
        kept = [c.cid for c, _ in strategy.configure_fit(1, params, manager)]
        dropped.append((kept, strategy.row["num_dropped"]))
    assert dropped[0] == dropped[1]
    assert 0 < dropped[0][1] < 20 and len(dropped[0][0]) == 20 - dropped[0][1]


def test_comparison_paired_difference_against_fedavg(tmp_path):
    """With >= 2 seeds, comparison.md/.csv carry each row's final accuracy minus FedAvg's on the
    same seed: mean and 95% t interval (hand computation below); FedAvg is the reference even
    when it is not the first row."""
    finals = {"fedprox": [0.80, 0.86, 0.83], "fedavg": [0.78, 0.85, 0.80]}
    runs = {}
    for method, values in finals.items():
        for seed, final in enumerate(values):
            d = tmp_path / f"{method}-seed{seed}"
            d.mkdir()
            (d / "summary.json").write_text(json.dumps({"final_accuracy": final, "best_accuracy": final,
                                                        "total_seconds": 1.0, "rounds": 3,
                                                        "config": {"seed": seed}}))
            # 6 rounds: the last 5 are 0.5 four times and the final accuracy (round 1 is left out)
            accs = [0.1, 0.5, 0.5, 0.5, 0.5, final]
            (d / "metrics.csv").write_text("round,test_accuracy\n" + "".join(f"{i},{a}\n" for i, a in enumerate(accs, 1)))
            runs.setdefault(method, []).append(d)
    table = compare(runs)
    prox = table[0]
    # last 5 rounds: the four equal rounds cancel, so each seed's difference is (final difference) / 5
    assert prox["tail_diff_seeds"] == 3 and abs(prox["tail_diff_mean"] - 0.004) < 1e-12
    assert abs(prox["tail_diff_ci_high"] - (0.004 + 0.024843 / 5)) < 1e-6
    # d = 0.02, 0.01, 0.03: mean 0.02, sd 0.01, t(0.975, df 2) = 4.303: half 4.303 * 0.01 / sqrt(3) = 0.024843
    assert prox["paired_reference"] == "fedavg" and prox["paired_seeds"] == 3
    assert abs(prox["final_diff_mean"] - 0.02) < 1e-12
    assert abs(prox["final_diff_ci_low"] - (0.02 - 0.024843)) < 1e-6
    assert abs(prox["final_diff_ci_high"] - (0.02 + 0.024843)) < 1e-6
    assert table[1]["final_diff_mean"] is None  # the reference itself
    write_comparison(table, tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "final − fedavg, paired (95% CI)" in md and "+0.0200 [-0.0048, +0.0448]" in md
    assert "last 5 rounds − fedavg, paired (95% CI)" in md and "+0.0040 [-0.0010, +0.0090]" in md
    header = (tmp_path / "out" / "comparison.csv").read_text().splitlines()[0]
    assert header.endswith("paired_reference,paired_seeds,final_diff_mean,final_diff_ci_low,final_diff_ci_high,"
                           "tail_diff_seeds,tail_diff_mean,tail_diff_ci_low,tail_diff_ci_high,"
                           "compute_diff_seeds,compute_diff_mean,compute_diff_ci_low,compute_diff_ci_high")


def test_comparison_without_a_second_seed_has_no_paired_columns(tmp_path):
    d = tmp_path / "fedprox-seed0"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"final_accuracy": 0.5, "best_accuracy": 0.5,
                                                "total_seconds": 1.0, "rounds": 3, "config": {"seed": 0}}))
    table = compare({"fedprox": [d], "fedavg": [d]})
    assert "final_diff_mean" not in table[0]
