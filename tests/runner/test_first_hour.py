"""A new user's first hour: discovery, loud early failures, grids and variants, records, plots."""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import run_simulation
from fl_app.config import ConfigError
from fl_app.registry import method_names, parse_override, validate_config
from fl_app.server.sampling import NotEnoughNodes, SeededClientManager
from runner import checks, cli
from runner.listing import listing
from runner.plan import label, parse_grid, run_name
from runner.quiet import is_noise
from runner.results.report import compare, curve_stats, plot, plot_curves, write_comparison
from tests.kit import ROOT, fake_context
from tests.kit_runs import non_split_files

SYNTH = ["--dataset", "synthetic", "--set", "model=logreg"]


def args_for(argv: list[str]) -> argparse.Namespace:
    return cli.parse_args(argv)


def configs(argv: list[str], tmp_path: Path) -> list[tuple[str, int, dict]]:
    return checks.build_configs(args_for(argv), tmp_path / "runs")


# ---- did you mean -------------------------------------------------------------------------

@pytest.mark.parametrize("raw, hint", [
    ({"strategy": "fedavgg"}, "did you mean 'fedavg'"),
    ({"model": "cnn-smal"}, "did you mean 'cnn-small'"),
    ({"dataset": "mnst"}, "did you mean 'mnist'"),
    ({"learning-rat": 0.1}, "did you mean 'learning-rate'"),
])
def test_config_errors_suggest_the_closest_name(raw, hint):
    with pytest.raises(ConfigError, match=re.escape(hint)):
        validate_config(raw)


def test_override_and_runner_suggest_the_closest_name(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'learning-rate'"):
        parse_override("learnig-rate=0.1")
    with pytest.raises(ConfigError, match="did you mean 'scaffold'"):
        configs(["--strategy", "scafold", *SYNTH], tmp_path)


# ---- discovery ------------------------------------------------------------------------------

def test_list_prints_methods_models_datasets_and_every_key(capsys):
    assert run_simulation.main(["--list"]) == 0
    out = capsys.readouterr().out
    from fl_app.config import DATASETS, MODELS
    from fl_app.registry import spec

    for name in method_names():
        line = next(line for line in out.splitlines() if line.split()[:1] == [name])
        assert len(line.split()) > 2, line  # a description, not just the name
    for name in (*MODELS, *DATASETS):
        assert re.search(rf"^  {re.escape(name)}\s", out, re.MULTILINE), name
    for name, key in spec().items():
        assert re.search(rf"^  {re.escape(name)}\s+default {re.escape(repr(key.default))}", out, re.MULTILINE), name
    assert "wait-for-nodes" in listing("keys") and "fedavg" not in listing("keys").split("strategy")[0]


def test_help_shows_defaults_and_choices(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no line wrapping inside "(default: ...)"
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "(default: fedavg)" in out and "(default: 10)" in out and "(default: mnist)" in out
    assert "methods: fedavg, fedprox" in out and "--list" in out and "--grid" in out


# ---- --set wins over the experiment file ------------------------------------------------------

def write_experiment(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


def test_set_wins_over_the_files_per_method_key(tmp_path):
    exp = write_experiment(tmp_path, """
strategies = ["fedgam-cv"]
[run-config]
dataset = "synthetic"
model = "logreg"
[methods.fedgam-cv]
gam-cv-alpha = 0.4
learning-rate = 0.02
""")
    rows = configs(["--config", str(exp), "--set", "gam-cv-alpha=0", "--out", str(tmp_path / "o")], tmp_path)
    assert [validate_config(raw)["gam-cv-alpha"] for _, _, raw in rows] == [0.0]
    assert validate_config(rows[0][2])["learning-rate"] == 0.02  # the file's other keys still apply
    rows = configs(["--config", str(exp), "--out", str(tmp_path / "o")], tmp_path)
    assert validate_config(rows[0][2])["gam-cv-alpha"] == 0.4


# ---- grid and labelled variants ---------------------------------------------------------------

def test_grid_from_the_command_line_gives_one_labelled_row_per_value(tmp_path):
    rows = configs(["--strategy", "fedavg,fedprox", *SYNTH, "--grid", "learning-rate=0.01,0.05",
                    "--grid", "local-epochs=1,2", "--seeds", "0", "1"], tmp_path)
    labels = sorted({r for r, _, _ in rows})
    assert len(rows) == 2 * 2 * 2 * 2 and len(labels) == 8
    assert "fedavg[learning-rate=0.05,local-epochs=2]" in labels
    for row, seed, raw in rows:
        cfg = validate_config(raw)
        lr, ep = re.search(r"learning-rate=([\d.]+),local-epochs=(\d)", row).groups()
        assert cfg["learning-rate"] == float(lr) and cfg["local-epochs"] == int(ep)
        assert cfg["run-name"] == run_name(row, seed)
    assert len({raw["run-name"] for _, _, raw in rows}) == len(rows)  # one folder per run
    assert parse_grid(["learning-rate=0.01,0.05"]) == {"learning-rate": [0.01, 0.05]}
    assert label("fedavg", {}) == "fedavg"
    with pytest.raises(ConfigError, match="both by --set"):
        configs(["--strategy", "fedavg", *SYNTH, "--set", "learning-rate=0.1", "--grid", "learning-rate=0.2,0.3"], tmp_path)
    with pytest.raises(ConfigError, match="learning-rate"):  # every grid value is validated up front
        configs(["--strategy", "fedavg", *SYNTH, "--grid", "learning-rate=0.1,-1"], tmp_path)


def test_experiment_file_grid_and_the_same_method_twice_under_two_labels(tmp_path):
    exp = write_experiment(tmp_path, """
strategies = ["fedavg", "fedsol", "fedsol-all"]
[run-config]
dataset = "synthetic"
model = "logreg"
[grid]
learning-rate = [0.01, 0.05]
[methods.fedsol]
fedsol-perturb = "head"
[methods."fedsol-all"]
strategy = "fedsol"
fedsol-perturb = "all"
[methods.fedavg.grid]
local-epochs = [1, 3]
""")
    rows = configs(["--config", str(exp), "--out", str(tmp_path / "o")], tmp_path)
    by_label = {r: validate_config(raw) for r, _, raw in rows}
    assert set(by_label) == {
        "fedavg[learning-rate=0.01,local-epochs=1]", "fedavg[learning-rate=0.01,local-epochs=3]",
        "fedavg[learning-rate=0.05,local-epochs=1]", "fedavg[learning-rate=0.05,local-epochs=3]",
        "fedsol[learning-rate=0.01]", "fedsol[learning-rate=0.05]",
        "fedsol-all[learning-rate=0.01]", "fedsol-all[learning-rate=0.05]",
    }
    assert by_label["fedsol-all[learning-rate=0.05]"]["strategy"] == "fedsol"
    assert by_label["fedsol-all[learning-rate=0.05]"]["fedsol-perturb"] == "all"
    assert by_label["fedsol[learning-rate=0.05]"]["fedsol-perturb"] == "head"
    # the command line's --set drops the file's grid for that key
    rows = configs(["--config", str(exp), "--set", "learning-rate=0.2", "--out", str(tmp_path / "o")], tmp_path)
    assert {r for r, _, _ in rows} == {"fedavg[local-epochs=1]", "fedavg[local-epochs=3]", "fedsol", "fedsol-all"}
    bad = write_experiment(tmp_path, 'strategies = ["fedsol-x"]\n[methods."fedsol-x"]\nstrategy = "fedsoll"\n')
    with pytest.raises(ConfigError, match="did you mean 'fedsol'"):
        configs(["--config", str(bad), "--dataset", "synthetic", "--set", "model=logreg"], tmp_path)


def fake_run(run_dir: Path, label_cfg: dict, accs: list[float], losses: list[float], extra: dict | None = None):
    run_dir.mkdir(parents=True)
    cfg = validate_config({"dataset": "mnist", "model": "cnn", "partitioner": "dirichlet", "alpha": 0.3,
                           "fraction-fit": 0.25, "num-server-rounds": len(accs), **label_cfg})
    cols = ["round", "test_accuracy", "test_loss", *(extra or {})]
    lines = [",".join(cols)]
    for i, (a, l) in enumerate(zip(accs, losses), 1):
        lines.append(",".join([str(i), repr(a), repr(l), *(repr(v[i - 1]) for v in (extra or {}).values())]))
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({
        "config": cfg, "rounds": len(accs), "final_accuracy": accs[-1], "best_accuracy": max(accs),
        "final_loss": losses[-1], "total_seconds": 1.0, "stopped": None, "num_clients": 20}))
    return run_dir


# 70 s through flwr run, marked slow to keep the default run under 10 minutes (the comparison files
# themselves are checked in the default run by tests/runner/test_simulation.py)
@pytest.mark.slow
def test_grid_rows_reach_the_comparison_and_one_seed_prints_no_spread(tmp_path):
    runs = {
        "fedavg[learning-rate=0.01]": [fake_run(tmp_path / "a0", {}, [0.5, 0.6], [1.0, 0.9]),
                                       fake_run(tmp_path / "a1", {"seed": 1}, [0.5, 0.8], [1.0, 0.7])],
        "fedavg[learning-rate=0.05]": [fake_run(tmp_path / "b0", {}, [0.6, 0.7], [0.9, 0.8])],
    }
    write_comparison(compare(runs), tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "| fedavg[learning-rate=0.01] | 2 | 2 | 0.7000 ± 0.1414 |" in md
    assert "| fedavg[learning-rate=0.05] | 1 | 2 | 0.7000 | 0.7000 |" in md
    assert "± 0.0000" not in md
    csv_text = (tmp_path / "out" / "comparison.csv").read_text()
    assert "fedavg[learning-rate=0.05]" in csv_text.replace('"', "")
    assert plot_curves(runs, tmp_path / "out" / "accuracy.png")
    assert (tmp_path / "out" / "accuracy.png").stat().st_size > 10_000


def test_plot_statistics_band_and_flat_noise(tmp_path):
    runs = {"x": [fake_run(tmp_path / "x0", {}, [0.5, 0.6], [1.0, 0.9]),
                  fake_run(tmp_path / "x1", {"seed": 1}, [0.7, 0.8], [0.8, 0.7])]}
    rounds, mean, lo, hi, n = curve_stats(runs, "test_accuracy")["x"]
    assert n == 2 and list(rounds) == [1, 2]
    assert np.allclose(mean, [0.6, 0.7]) and np.allclose(lo, [0.5, 0.6]) and np.allclose(hi, [0.7, 0.8])
    noise = {"ri_mean": [1e-17, 3e-17, 2e-17]}
    flat = {"ri-fedavg": [fake_run(tmp_path / "r0", {"strategy": "ri-fedavg"}, [0.1, 0.2, 0.3], [1, 1, 1], noise)]}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from runner.results.report import _draw

    fig, ax = plt.subplots()
    _draw(ax, curve_stats(flat, "ri_mean"), "ri")
    low, high = ax.get_ylim()
    assert high - low >= 1e-3  # float noise is not stretched over the whole axis
    assert any("constant" in t.get_text() for t in ax.texts)
    plt.close(fig)
    assert plot(flat, "ri_mean", "roughness", tmp_path / "roughness.png")


# ---- loud, early, bounded failures ------------------------------------------------------------

def test_waiting_for_nodes_ends_in_an_error_naming_both_numbers():
    manager = SeededClientManager(0, wait_seconds=0.3)
    manager.num_available = lambda: 3
    started = time.monotonic()
    with pytest.raises(NotEnoughNodes, match=r"min-available-clients = 5 but only 3 node.*0.3 s"):
        manager.wait_for(5)
    assert time.monotonic() - started < 2


def test_runner_refuses_more_min_available_clients_than_supernodes(tmp_path):
    with pytest.raises(ConfigError, match=r"'min-available-clients' = 5 .* only 3 SuperNode"):
        configs(["--strategy", "fedavg", *SYNTH, "--clients", "3", "--set", "min-available-clients=5"], tmp_path)


def server_context(tmp_path: Path, **extra) -> object:
    return fake_context({"dataset": "synthetic", "model": "logreg", "results-dir": str(tmp_path / "results"),
                         "run-name": "r", **extra})


def test_server_app_uses_wait_for_nodes_and_logs_one_error_line(tmp_path, caplog):
    from fl_app.server_app import server_fn

    components = server_fn(server_context(tmp_path, **{"wait-for-nodes": 0.5}))
    assert components.client_manager.wait_seconds == 0.5
    with caplog.at_level("ERROR", logger="flwr.fl_drift"), pytest.raises(ConfigError):
        server_fn(server_context(tmp_path, **{"learning-rate": -1.0}))
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("fl-drift: ConfigError: run-config key 'learning-rate'")


def test_missing_data_dir_fails_fast_and_writes_nothing(tmp_path, capsys):
    missing = tmp_path / "no-such-folder"
    out = tmp_path / "out"
    started = time.monotonic()
    assert run_simulation.main(["--strategy", "fedavg", "--dataset", "mnist", "--data-dir", str(missing),
                                "--out", str(out)]) == 2
    assert time.monotonic() - started < 2
    assert "no such folder" in capsys.readouterr().err and not out.exists()
    from fl_app.server_app import server_fn

    started = time.monotonic()
    with pytest.raises(ConfigError, match="no such folder"):
        server_fn(fake_context({"dataset": "mnist", "model": "cnn-small", "data-dir": str(missing),
                                "results-dir": str(tmp_path / "results"), "run-name": "r"}))
    assert time.monotonic() - started < 2
    assert not (tmp_path / "results").exists()


def test_runner_json_keeps_the_resolved_data_source(tmp_path, monkeypatch):
    data = tmp_path / "data"
    (data / "mnist").mkdir(parents=True)
    for split in ("train", "test"):
        (data / "mnist" / f"{split}.parquet").touch()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FL_DATA_DIR", raising=False)
    saved = cli.runner_record(args_for(["--strategy", "fedavg", "--data-dir", "data", "--out", "o"]))
    assert saved["data_dir"] == str(data.resolve())
    monkeypatch.setenv("FL_DATA_DIR", "data")  # a new shell may lack it, or have another one
    saved = cli.runner_record(args_for(["--strategy", "fedavg", "--out", "o"]))
    assert saved["data_dir"] is None and saved["env_data_dir"] == str(data.resolve())
    out = tmp_path / "o"
    out.mkdir()
    (out / "runner.json").write_text(json.dumps(saved))
    monkeypatch.delenv("FL_DATA_DIR")
    monkeypatch.chdir(ROOT)
    resumed = args_for(["--resume", str(out)])
    assert resumed.env_data_dir == str(data.resolve())
    assert checks.build_configs(resumed, out / "runs")[0][2]["data-dir"] == str(data.resolve())


def test_fedbn_with_cnn_is_refused_naming_cnn_bn(tmp_path):
    with pytest.raises(ConfigError, match="set model = 'cnn-bn'"):
        configs(["--strategy", "fedavg,fedbn", "--dataset", "mnist", "--set", "model=cnn"], tmp_path)


# ---- records ------------------------------------------------------------------------------------

def test_summary_records_clients_data_source_versions_and_revision(tmp_path, monkeypatch):
    from fl_app.registry import get_method
    from strategies.base import fedavg_kwargs
    from tests.kit_server import RoundByRound

    monkeypatch.delenv("FL_DRIFT_REVISION", raising=False)
    cfg = validate_config({"dataset": "synthetic", "model": "logreg"})
    inner = get_method("fedavg").strategy.from_config(cfg, **fedavg_kwargs(cfg, None, None))
    recording = RoundByRound(inner, cfg, tmp_path / "run", 1)
    recording.client_manager = SeededClientManager(0)
    recording.client_manager.num_partitions = 7
    recording.write_summary()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_clients"] == 7
    assert summary["data_source"] == "synthetic"
    assert set(summary["versions"]) >= {"python", "flwr", "torch"}
    # the tests run from a git checkout: the revision is found, a full commit id, never "unknown"
    # (wherever provenance.py lies in the checkout)
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", summary["code_revision"])
    from fl_app.server.provenance import data_source

    monkeypatch.delenv("FL_DATA_DIR", raising=False)
    assert data_source(validate_config({"dataset": "mnist"})) == "hub:ylecun/mnist"  # no folder set


def test_shared_data_fixture_honours_fl_data_dir(tmp_path, monkeypatch):
    from tests.kit import SHARED_DATA, find_data_dir

    monkeypatch.setenv("FL_DATA_DIR", str(tmp_path))
    assert find_data_dir() == tmp_path.resolve()
    monkeypatch.delenv("FL_DATA_DIR")
    assert find_data_dir() == SHARED_DATA


def test_flower_boilerplate_is_hidden_but_errors_and_progress_are_not():
    assert is_noise("\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed")
    assert is_noise("\x1b[92mINFO \x1b[0m:      configure_fit: strategy sampled 3 clients (out of 3)")
    assert is_noise("\x1b[92mINFO \x1b[0m:      \t\tround 2: 0.293863037109375")
    assert not is_noise("\x1b[92mINFO \x1b[0m:      round 1/2: test accuracy 0.8001, test loss 0.5853")
    assert not is_noise("\x1b[91mERROR \x1b[0m:     fl-drift: ConfigError: bad")
    assert not is_noise("Traceback (most recent call last):")
    assert not is_noise("Successfully started run 11452657718894811928")


# ---- hygiene ------------------------------------------------------------------------------------

def test_python_floor_ignores_and_no_pkill():
    pyproject = (ROOT / "pyproject.toml").read_text()
    readme = (ROOT / "README.md").read_text()
    assert 'requires-python = ">=3.11"' in pyproject and "Python >= 3.11" in readme
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:  # the commands a user pastes
        text = path.read_text()
        assert "pkill" not in text and "killall" not in text, path.name
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "certs/" in ignored and "state.db*" in ignored
    assert math.isfinite(1.0)


def test_check_validates_everything_and_launches_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert run_simulation.main(["--check", "--strategy", "fedavg,fedprox", *SYNTH, "--grid", "learning-rate=0.01,0.1",
                                "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("ok: ") for line in lines) == 4 and non_split_files(out) == []
    assert run_simulation.main(["--check", "--strategy", "fedavg", *SYNTH, "--set", "learnig-rate=0.1"]) == 2
    assert "did you mean 'learning-rate'" in capsys.readouterr().err


def test_results_report_prints_no_spread_for_one_seed():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_results", ROOT / "scripts" / "make_results.py")
    make_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_results)
    assert make_results.fmt_acc((0.5, 0.0), seeds=1) == "0.5000"
    assert make_results.fmt_acc((0.5, 0.1), seeds=2) == "0.5000 ± 0.1000"


def test_runner_refuses_a_missing_data_dir_before_importing_torch(tmp_path):
    """The command-line runner fails on an explicit --data-dir that does not exist before it
    imports torch or Flower (the imports take seconds), writing nothing."""
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['run_simulation.py', '--dataset', 'mnist', '--set', 'data-dir={tmp_path / 'none'}',"
        f" '--out', {str(tmp_path / 'out')!r}]\n"
        "try:\n"
        "    runpy.run_path('run_simulation.py', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code, 'torch' in sys.modules, 'flwr' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "exit 2 False False", proc.stdout + proc.stderr
    assert "'data-dir'" in proc.stderr and "no such folder" in proc.stderr and str(tmp_path / "none") in proc.stderr
    assert list(tmp_path.iterdir()) == []
