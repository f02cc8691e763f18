"""Run folders and ``--resume``: two labels never share a run folder, and a resume never drops a
flag silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import run_simulation
from runner import cli
from runner.plan import check_run_names

COLLIDING = """
strategies = ["a/b", "a_b"]
seeds = [0]
clients = 4
[run-config]
dataset = "synthetic"
model = "logreg"
num-server-rounds = 2
[methods."a/b"]
strategy = "fedavg"
learning-rate = 0.05
[methods."a_b"]
strategy = "fedprox"
learning-rate = 0.01
"""


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("check", [True, False])
def test_two_labels_that_clean_to_one_folder_are_refused_before_launch(tmp_path, capsys, check):
    """`"a/b"` (FedAvg) and `"a_b"` (FedProx) were both run in `a_b-seed0`: the second
    "resumed" the first's finished folder, both rows showed FedAvg's accuracy, and the folder's
    summary.json said fedprox over FedAvg's weights. Refused before anything is written."""
    exp = tmp_path / "exp.toml"
    exp.write_text(COLLIDING)
    out = tmp_path / "o"
    assert run_simulation.main(["--config", str(exp), "--out", str(out), *(["--check"] if check else [])]) == 2
    err = one_line_error(capsys)
    assert "labels 'a/b' and 'a_b' are invalid together" in err and "a_b-seed<seed>" in err
    assert not out.exists()  # the store untouched: no folder, no runner.json


def test_labels_that_clean_to_distinct_folders_pass():
    check_run_names(["fedavg", "fedavg[learning-rate=0.05]", "fedavg[learning-rate=0.5]", "a/b", "a-b"])
    with pytest.raises(Exception, match="'x y' and 'x_y'"):
        check_run_names(["x y", "x_y"])


@pytest.fixture
def started(tmp_path):
    """An output folder as run_simulation.py leaves it after starting: its runner.json."""
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "runner.json").write_text(json.dumps({
        "strategy": "fedavg", "seeds": [0], "clients": 4, "overrides": ["model=logreg"], "dataset": "synthetic",
        "rounds": 2, "fraction": None, "alpha": None, "data_dir": None, "config": None, "quiet": False,
        "cpus_per_client": 1.0, "gpus_per_client": None, "ray_address": None, "env_data_dir": None,
        "cwd": str(tmp_path)}))
    return out


@pytest.mark.parametrize("flags, named", [
    (["--rounds", "5"], "--rounds"),
    (["--set", "learning-rate=0.5"], "--set"),
    (["--strategy", "fedprox"], "--strategy"),
    (["--seeds", "1"], "--seeds"),
    (["--rounds", "5", "--set", "learning-rate=0.5"], "--rounds, --set"),
    (["--grid", "learning-rate=0.1,0.2"], "--grid"),
    (["--out", "elsewhere"], "--out"),
])
def test_resume_with_a_flag_that_would_change_the_runs_is_refused(started, capsys, flags, named):
    """`--resume OUT --rounds 5` said "finished, kept" and ran no round: the flag was dropped."""
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--resume", str(started), *flags])
    assert exit_.value.code == 2
    err = one_line_error(capsys)
    assert f"--resume {started} with {named} is invalid" in err
    assert "takes only --quiet, --check, --parallel and --verbose" in err


def test_resume_takes_the_flags_that_change_only_how_it_runs(started):
    args = cli.parse_args(["--resume", str(started), "--quiet", "--check", "--parallel", "2", "--verbose"])
    assert (args.quiet, args.check, args.parallel, args.verbose) == (True, True, 2, True)
    assert (args.rounds, args.strategy, args.overrides) == (2, "fedavg", ["model=logreg"])  # runner.json's


class WritingSimulation:
    """A stand-in for ``LocalSimulation`` whose every run finishes at once, writing its summary
    (the config it was launched with) and metrics into its run folder."""

    def __init__(self, *args, **kwargs):
        self.ray_resources, self.env = {}, {}

    def start(self):
        pass

    def close(self):
        pass

    def run(self, cfg, num_supernodes, on_line=None, **kwargs):
        from fl_app.registry import validate_config

        run_dir = Path(cfg["results-dir"]) / cfg["run-name"]
        (run_dir / "summary.json").write_text(json.dumps({
            "config": validate_config(cfg), "rounds": 1, "final_accuracy": cfg["learning-rate"], "best_accuracy": 0.5,
            "total_seconds": 1.0}))
        (run_dir / "metrics.csv").write_text("round,test_accuracy\n1,0.5\n")
        return 0


def test_a_run_folder_written_with_other_settings_is_refused_not_resumed(tmp_path, monkeypatch, capsys):
    """The check at launch time, behind the one before the sweep: a folder that another run
    wrote meanwhile under the same name (here two configs forced into one folder) is refused,
    its record left as it is."""
    import argparse

    from runner import sweep

    monkeypatch.setattr(sweep, "LocalSimulation", WritingSimulation)
    runs = tmp_path / "runs"
    common = {"dataset": "synthetic", "model": "logreg", "seed": 0, "results-dir": str(runs), "run-name": "a_b-seed0"}
    configs = [("a/b", 0, {**common, "strategy": "fedavg", "learning-rate": 0.05}),
               ("a_b", 0, {**common, "strategy": "fedprox", "learning-rate": 0.01})]
    args = argparse.Namespace(parallel=1, clients=4, cpus_per_client=1.0, quiet=True, verbose=False, ray_address=None)
    outcome = sweep.launch(args, configs, runs, 0.0)
    assert outcome.runs == {"a/b": [runs / "a_b-seed0"]} and outcome.failed == ["a_b-seed0"]
    summary = json.loads((runs / "a_b-seed0" / "summary.json").read_text())
    assert (summary["config"]["strategy"], summary["final_accuracy"]) == ("fedavg", 0.05)  # the first run's, kept
    assert "run refused, its folder kept as it is" in capsys.readouterr().err
