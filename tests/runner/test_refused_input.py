"""Bad input to the runner and the ServerApp is refused, with a message that names it, before
it can run under another meaning: an experiment file's [run-config] that would replace its
strategies, ``--clients 0``, a screening rule the sampled clients cannot meet, a federation
larger than the data, a results folder that cannot be written, an empty split, ``--resume
--check``, and a run whose clients all failed."""

from __future__ import annotations

import json
import logging
import threading

import pytest

import run_simulation
from fl_app.config import ConfigError
from fl_app.registry import validate_config
from runner import checks, cli, sweep
from tasks.datasets import DataUnavailableError, PartitionError
from tests.kit_runs import non_split_files

SYNTH = ["--dataset", "synthetic", "--set", "model=logreg"]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


# ---- an experiment file's [run-config] cannot replace its strategies ---------------------------------

THREE_METHODS = """
strategies = ["fedavg", "fedprox", "scaffold"]
clients = 4
[run-config]
{line}
dataset = "synthetic"
model = "logreg"
"""


@pytest.mark.parametrize("line, key", [('strategy = "fedavg"', "strategy"), ("seed = 3", "seed"),
                                       ('run-name = "x"', "run-name")])
def test_a_per_run_key_in_run_config_is_refused(tmp_path, line, key):
    """`strategy = "fedavg"` in [run-config] turned a file's three methods into one run."""
    from runner.experiment import read_experiment

    exp = tmp_path / "exp.toml"
    exp.write_text(THREE_METHODS.format(line=line))
    with pytest.raises(ConfigError, match=rf"\[run-config\] sets '{key}' = .* a key the runner sets for each run"):
        read_experiment(exp)
    with pytest.raises(SystemExit) as exit_:  # the runner refuses the file (argparse's exit code 2)
        cli.parse_args(["--config", str(exp), "--check"])
    assert exit_.value.code == 2


def test_a_variant_still_names_its_method_but_not_its_seed(tmp_path):
    from runner.experiment import read_experiment

    exp = tmp_path / "exp.toml"
    exp.write_text('strategies = ["slow"]\n[methods.slow]\nstrategy = "fedavg"\nlearning-rate = 0.001\n')
    assert read_experiment(exp)["methods"]["slow"]["strategy"] == "fedavg"
    exp.write_text('strategies = ["slow"]\n[methods.slow]\nstrategy = "fedavg"\nseed = 1\n')
    with pytest.raises(ConfigError, match=r"\[methods.slow\] sets 'seed' = 1"):
        read_experiment(exp)


def test_the_runner_now_runs_the_three_methods_of_the_file(tmp_path):
    exp = tmp_path / "exp.toml"
    exp.write_text(THREE_METHODS.format(line=""))
    args = cli.parse_args(["--config", str(exp), "--out", str(tmp_path / "o")])
    configs = checks.build_configs(args, tmp_path / "o" / "runs")
    assert [raw["strategy"] for _, _, raw in configs] == ["fedavg", "fedprox", "scaffold"]


@pytest.mark.parametrize("argv, expected", [
    (["--set", "seed=3"], "--set seed=... is invalid: the runner sets 'seed' for each run itself; list the seeds"),
    (["--grid", "seed=0,1"], "--grid seed=... is invalid"),
    (["--grid", "strategy=fedavg,fedprox"], "--grid strategy=... is invalid"),
    (["--set", "results-dir=/tmp/x"], "choose the folder with --out"),
])
def test_a_per_run_key_on_the_command_line_is_refused(tmp_path, capsys, argv, expected):
    """`--grid seed=0,1` made two rows labelled seed=0 and seed=1 that both ran --seeds' seed 0."""
    assert run_simulation.main([*SYNTH, *argv, "--check", "--out", str(tmp_path / "o")]) == 2
    assert expected in one_line_error(capsys)


def test_set_strategy_is_still_the_method_list(tmp_path):
    args = cli.parse_args([*SYNTH, "--set", "strategy=fedavg,fedprox"])
    configs = checks.build_configs(args, tmp_path / "runs")
    assert [raw["strategy"] for _, _, raw in configs] == ["fedavg", "fedprox"]


# ---- --clients 0 -------------------------------------------------------------------------------------

def test_clients_zero_is_refused_not_replaced_by_ten(tmp_path, capsys):
    assert run_simulation.main([*SYNTH, "--clients", "0", "--check", "--out", str(tmp_path / "o")]) == 2
    err = one_line_error(capsys)
    assert "--clients = 0 is invalid" in err and ">= 1" in err
    assert cli.parse_args([*SYNTH, "--clients", "0"]).clients == 0


@pytest.mark.parametrize("listed", ["", ",", " , "])
def test_empty_strategy_list_is_refused_not_replaced_by_fedavg(listed, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args([*SYNTH, "--strategy", listed])
    assert exc.value.code == 2
    assert "names no method" in capsys.readouterr().err


# ---- a screening rule needs enough sampled replies -------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["--clients", "10", "--fraction", "1", "--set", "screening=bulyan"], "n >= 4f + 3 = 15 replies per round, but a"
     " round samples only n = 10 (fraction-fit 1 x 10 clients"),
    (["--clients", "10", "--fraction", "0.5", "--set", "screening=multi-krum"], "n >= 2f + 3 = 9 replies per round,"
     " but a round samples only n = 5 (fraction-fit 0.5 x 10 clients"),
])
def test_check_refuses_a_screening_rule_the_sampled_clients_cannot_meet(tmp_path, capsys, argv, expected):
    """Both passed --check, then every round dropped every reply ('10 rejected') and the run
    stopped after 0 rounds."""
    assert run_simulation.main([*SYNTH, *argv, "--set", "screen-attackers=3", "--check",
                                "--out", str(tmp_path / "o")]) == 2
    err = one_line_error(capsys)
    assert expected in err and "screen-attackers f = 3" in err


def test_a_screening_rule_the_sampled_clients_meet_passes(tmp_path, capsys):
    argv = ["--clients", "10", "--fraction", "1", "--set", "screening=multi-krum", "--set", "screen-attackers=3"]
    assert run_simulation.main([*SYNTH, *argv, "--check", "--out", str(tmp_path / "o")]) == 0  # 10 >= 9


class GrowingFederation:
    """A client manager as Flower's legacy ServerApp sees a simulation's nodes: registered one
    by one by another thread while the ServerApp starts (``step`` nodes between two reads)."""

    def __init__(self, final: int, step: int):
        self.final, self.step, self.count, self.asked = final, step, 0, False
        self.lock = threading.Lock()

    def wait_for(self, n):
        return True

    def num_available(self):
        with self.lock:
            self.count = min(self.final, self.count + self.step)
            return self.count

    def learn_partitions(self):
        self.asked = True


def test_the_server_start_up_refuses_the_screening_rule_naming_it(tmp_path):
    """`flwr run` without the runner: the ServerApp refuses before any node is asked."""
    from fl_app.server.startup import ServerStartup

    cfg = validate_config({"dataset": "synthetic", "model": "logreg", "screening": "bulyan", "screen-attackers": 3,
                           "fraction-fit": 1.0})
    nodes = GrowingFederation(final=10, step=10)
    with pytest.raises(ConfigError, match=r"n >= 4f \+ 3 = 15 .* n = 10"):
        ServerStartup(cfg, nodes)._learn()
    assert not nodes.asked


# ---- a federation larger than the data: the right numbers, before Ray starts ---------------------------

def test_the_partition_count_is_checked_on_the_whole_federation(shared_data):
    """Flower registers a simulation's nodes while the ServerApp starts: the count read first
    was part of it ('64855 partitions' for num-supernodes = 200000)."""
    from fl_app.server.startup import ServerStartup

    cfg = validate_config({"dataset": "mnist", "model": "cnn-small", "data-dir": str(shared_data)})
    nodes = GrowingFederation(final=200_000, step=25_000)
    with pytest.raises(PartitionError, match="^200000 partitions requested .* at most 6000 dirichlet partitions"):
        ServerStartup(cfg, nodes)._learn()
    assert not nodes.asked


def test_a_refusal_is_logged_once_and_stops_nothing_outside_a_simulation(shared_data, caplog):
    """test_split() raises the refusal as one fl-drift line (also through the ServerApp's own
    ``loud``); the simulation process is stopped only when this is ``flwr-simulation``."""
    from fl_app.server.preflight import loud
    from fl_app.server.startup import ServerStartup

    cfg = validate_config({"dataset": "mnist", "model": "cnn-small", "data-dir": str(shared_data)})
    startup = ServerStartup(cfg, GrowingFederation(final=7000, step=7000))
    with caplog.at_level(logging.ERROR, logger="flwr.fl_drift"), pytest.raises(PartitionError):
        with loud(PartitionError):  # as the ServerApp's evaluate_fn wraps it
            startup.test_split()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fl-drift:")]
    assert len(lines) == 1 and "7000 partitions requested" in lines[0]


@pytest.mark.slow  # a real `flwr run` whose start-up registers 200000 nodes (about 1 min on 2 busy cores)
def test_flwr_run_with_200000_supernodes_is_refused_before_ray_starts():
    """It was refused after 176 s naming "64855 partitions"; now with the whole count, and the
    simulation process ends before Ray starts (its private temp folder has no session)."""
    from tests.kit_runs import local_simulation

    lines: list[str] = []
    with local_simulation() as sim:
        sim.run({"model": "cnn-small", "num-server-rounds": 1, "tracking": "none",
                 "results-dir": str(sim.home / "r")}, num_supernodes=200_000, on_line=lines.append, timeout=600)
        ray_sessions = list((sim.ray_dir / "ray").glob("session_2*"))
    refusals = [line for line in lines if "fl-drift: PartitionError" in line]
    assert refusals and "200000 partitions requested" in refusals[0] and "at most 6000" in refusals[0]
    assert any("stopping the simulation" in line for line in lines)
    assert ray_sessions == []


# ---- a results folder that cannot be written ------------------------------------------------------------

def test_out_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "a-file").write_text("x")
    assert run_simulation.main([*SYNTH, "--rounds", "1", "--out", str(tmp_path / "a-file")]) == 2
    assert "it is a file, not a folder" in one_line_error(capsys)
    assert run_simulation.main([*SYNTH, "--out", str(tmp_path / "a-file" / "sub"), "--check"]) == 2
    assert "is not a folder" in one_line_error(capsys)


# ---- an empty test.parquet -------------------------------------------------------------------------------

def test_an_empty_split_is_named_as_empty(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fl_app.server.preflight import check_data_dir
    from tasks.local_files import load_local_file

    (tmp_path / "mnist").mkdir()
    table = pa.table({"image": pa.array([{"bytes": b"", "path": None}]), "label": pa.array([1], pa.int64())})
    pq.write_table(table, tmp_path / "mnist" / "train.parquet")
    pq.write_table(table.slice(0, 0), tmp_path / "mnist" / "test.parquet")
    empty = str(tmp_path / "mnist" / "test.parquet")
    with pytest.raises(DataUnavailableError, match=f"^{empty} is empty \\(a parquet file with 0 rows\\)"):
        check_data_dir({"dataset": "mnist", "data-dir": str(tmp_path)})
    assert run_simulation.main(["--dataset", "mnist", "--data-dir", str(tmp_path), "--check",
                                "--out", str(tmp_path / "o")]) == 2
    assert f"{empty} is empty" in one_line_error(capsys)
    with pytest.raises(DataUnavailableError, match="is empty"):  # a SuperNode's own data-path
        load_local_file(empty, "mnist")


# ---- --resume DIR --check only checks ----------------------------------------------------------------

def test_resume_with_check_only_checks(tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"
    args = cli.parse_args([*SYNTH, "--strategy", "fedavg,fedprox", "--out", str(out)])
    out.mkdir()
    (out / "runner.json").write_text(json.dumps(cli.runner_record(args)))

    def launched(*a, **k):
        raise AssertionError("--resume --check launched the runs")

    monkeypatch.setattr(sweep, "launch", launched)
    assert run_simulation.main(["--resume", str(out), "--check"]) == 0
    printed = capsys.readouterr().out
    assert "ok: fedavg seed 0" in printed and "ok: fedprox seed 0" in printed
    assert non_split_files(out) == ["runner.json"]  # nothing written but the split's picture


# ---- a run in which every client failed is a failure ---------------------------------------------------

def test_a_run_whose_clients_all_failed_exits_non_zero(tmp_path, capsys):
    """Every client raises in round 1: the run stops with 0 rounds (its summary says why); the
    runner exited 0 ("stopped", a result) and now exits 1 naming the reason."""
    from fl_app.server.participation import RunAborted
    from tests.kit import serve_in_process

    cfg = {"dataset": "synthetic", "model": "logreg", "num-server-rounds": 2, "fraction-fit": 1.0,
           "min-available-clients": 3, "inject-faults": "raise:0,raise:1,raise:2", "tracking": "none",
           "results-dir": str(tmp_path / "runs"), "run-name": "fedavg-seed0"}
    with pytest.raises(RunAborted):
        serve_in_process(cfg, 3)
    outcome = sweep.Outcome()
    sweep.record_run("fedavg", "fedavg-seed0", tmp_path / "runs" / "fedavg-seed0", [], outcome)
    assert outcome.failed == ["fedavg-seed0"] and outcome.stopped == []
    assert sweep.report(outcome, tmp_path / "out") == 1
    err = capsys.readouterr().err
    assert "run failed: no round completed (round 1: only 0 of 3 sampled clients returned a usable update" in err
    assert "error: 1 run(s) failed: fedavg-seed0" in err


def test_an_untrained_run_is_a_failure_and_a_trained_one_is_not():
    assert "never trained" in sweep.trained_nothing({"rounds": 2, "untrained": True})
    assert sweep.trained_nothing({"rounds": 2, "untrained": False, "stopped": "diverged"}) == ""


def test_nested_loud_logs_once(caplog):
    from fl_app.server.preflight import loud

    with caplog.at_level(logging.ERROR, logger="flwr.fl_drift"), pytest.raises(ConfigError):
        with loud(ConfigError), loud(ConfigError):
            raise ConfigError("x")
    assert [r.getMessage() for r in caplog.records] == ["fl-drift: ConfigError: x"]


def test_sampled_per_round_is_flowers(tmp_path):
    from flwr.server.strategy import FedAvg

    from fl_app.server.screening import sampled_per_round

    for fraction, min_fit, nodes in ((0.5, 1, 10), (0.3, 4, 10), (1.0, 1, 7), (0.1, 1, 5)):
        cfg = validate_config({"fraction-fit": fraction, "min-fit-clients": min_fit, "min-available-clients": 4})
        expected = FedAvg(fraction_fit=fraction, min_fit_clients=min_fit).num_fit_clients(nodes)[0]
        assert sampled_per_round(cfg, nodes) == expected == max(int(fraction * nodes), min_fit)
