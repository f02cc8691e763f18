"""A kept result is never lost by --collect, and bad input (repeated seeds or grid values, an
attack on a partition that does not exist, labels outside the dataset's classes, no CPU per
client) is refused in one line before anything is launched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import run_simulation
from runner import checks, cli, sweep
from tests.kit_runs import load_make_results

SYNTH = ["--dataset", "synthetic", "--set", "model=logreg"]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "usage:" not in err
    return err


# ---- 1. --collect never destroys a kept run ---------------------------------------------------------

KEPT = """
name = "kept"
strategies = ["fedavg"]
seeds = [0]
clients = 4
[run-config]
dataset = "synthetic"
model = "logreg"
num-server-rounds = 2
"""

FINGERPRINT = {"digest": "d" * 16, "dataset": "synthetic", "train": {"source": "generated"},
               "test": {"source": "generated"}, "partition": {"num-partitions": 4}}


def finished_run(run_dir: Path, accuracy: float) -> Path:
    """A finished run of KEPT's fedavg seed 0, with the given final accuracy."""
    from fl_app.registry import validate_config

    run_dir.mkdir(parents=True)
    (run_dir / "metrics.csv").write_text(f"round,test_accuracy\n1,0.3\n2,{accuracy}\n")
    config = validate_config({"strategy": "fedavg", "dataset": "synthetic", "model": "logreg", "seed": 0,
                              "num-server-rounds": 2})
    (run_dir / "summary.json").write_text(json.dumps({
        "config": config, "rounds": 2, "final_accuracy": accuracy, "best_accuracy": accuracy, "final_loss": 1.0,
        "total_seconds": 1.0, "stopped": None, "num_clients": 4, "data_fingerprint": FINGERPRINT}))
    return run_dir


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``folder``, by relative path."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


@pytest.fixture
def kept_store(tmp_path):
    """(make_results, argv of a collect from tmp/results into tmp/store, the source run, the
    store's kept copy), after one successful collect of a run with final accuracy 0.5."""
    make_results = load_make_results()
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "kept.toml").write_text(KEPT)
    source = finished_run(tmp_path / "results" / "kept" / "runs" / "fedavg-seed0", 0.5)
    argv = ["--experiments", str(tmp_path / "experiments"), "--results", str(tmp_path / "store"),
            "--collect", str(tmp_path / "results"), "--out", str(tmp_path / "docs" / "results.md")]
    assert make_results.main(argv) == 0
    kept = tmp_path / "store" / "kept" / "fedavg-seed0"
    assert json.loads((kept / "summary.json").read_text())["final_accuracy"] == 0.5
    return make_results, argv, source, kept


@pytest.mark.parametrize("damage", ["no metrics.csv", "metrics.csv not a table", "fingerprint unparseable"])
def test_a_failed_collect_leaves_the_store_byte_identical(kept_store, tmp_path, capsys, damage):
    """The old collect removed the kept copy first, then failed copying a metrics.csv the source
    run lacked (a traceback, rc 1), leaving an empty folder: the report said "not run yet"."""
    make_results, argv, source, kept = kept_store
    summary = json.loads((source / "summary.json").read_text())
    (source / "summary.json").write_text(json.dumps({**summary, "final_accuracy": 0.7}))  # a newer run
    if damage == "no metrics.csv":
        (source / "metrics.csv").unlink()
    elif damage == "metrics.csv not a table":
        (source / "metrics.csv").write_text("\x00\x01 garbage")
    else:
        (source / "summary.json").write_text(json.dumps({**summary, "data_fingerprint": {"no": "digest"}}))
    before = snapshot(tmp_path / "store")
    capsys.readouterr()
    assert make_results.main(argv) == 2
    err = one_line_error(capsys)
    assert "--collect refused: kept/fedavg-seed0:" in err and "nothing in" in err
    assert snapshot(tmp_path / "store") == before
    assert json.loads((kept / "summary.json").read_text())["final_accuracy"] == 0.5


def test_a_failed_collect_into_an_empty_store_leaves_no_folder(tmp_path, capsys):
    make_results = load_make_results()
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "kept.toml").write_text(KEPT)
    source = finished_run(tmp_path / "results" / "kept" / "runs" / "fedavg-seed0", 0.5)
    (source / "metrics.csv").unlink()
    argv = ["--experiments", str(tmp_path / "experiments"), "--results", str(tmp_path / "store"),
            "--collect", str(tmp_path / "results"), "--out", str(tmp_path / "docs" / "results.md")]
    assert make_results.main(argv) == 2
    assert "metrics.csv" in one_line_error(capsys)
    assert not (tmp_path / "store").exists()


def test_a_successful_collect_replaces_the_kept_run_whole(kept_store, tmp_path):
    make_results, argv, source, kept = kept_store
    (kept / "stale-extra-file.csv").write_text("from the old copy")
    summary = json.loads((source / "summary.json").read_text())
    (source / "summary.json").write_text(json.dumps({**summary, "final_accuracy": 0.7}))
    (source / "metrics.csv").write_text("round,test_accuracy\n1,0.3\n2,0.7\n")
    assert make_results.main(argv) == 0
    assert json.loads((kept / "summary.json").read_text())["final_accuracy"] == 0.7
    assert (kept / "metrics.csv").read_text().endswith("2,0.7\n")
    assert sorted(p.name for p in kept.parent.iterdir()) == ["fedavg-seed0"]  # no temporary or old copy left
    assert sorted(p.name for p in kept.iterdir()) == ["metrics.csv", "summary.json"]


# ---- 3. a seed or grid value given twice is refused before launch -------------------------------------

def refused_at_parse(argv: list[str], capsys) -> str:
    """The one line of a refusal that comes while the arguments are read (exit code 2)."""
    with pytest.raises(SystemExit) as exit_:
        run_simulation.main(argv)
    assert exit_.value.code == 2
    return one_line_error(capsys)


@pytest.mark.parametrize("seeds, repeated", [(["0", "0"], "0"), (["0", "0", "1"], "0"), (["3", "1", "3"], "3")])
def test_a_seed_given_twice_is_refused(tmp_path, capsys, seeds, repeated):
    """`--seeds 0 0` resumed the finished folder and the table showed `2 seeds, 0.7000 +- 0.0000`."""
    err = refused_at_parse([*SYNTH, "--seeds", *seeds, "--check", "--out", str(tmp_path / "o")], capsys)
    assert f"--seeds {' '.join(seeds)} is invalid: it lists seed {repeated} twice" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("grid, repeated", [("learning-rate=0.01,0.01", "0.01"), ("learning-rate=0.01,1e-2", "0.01"),
                                            ("local-epochs=1,2,1", "1"), ("model=logreg,logreg", "logreg")])
def test_a_grid_value_given_twice_is_refused(tmp_path, capsys, grid, repeated):
    assert run_simulation.main([*SYNTH, "--grid", grid, "--check", "--out", str(tmp_path / "o")]) == 2
    err = one_line_error(capsys)
    assert f"--grid {grid} is invalid: it lists value {repeated} twice" in err


EXPERIMENT = """
strategies = ["fedavg", "slow"]
seeds = {seeds}
clients = 4
[run-config]
dataset = "synthetic"
model = "logreg"
[methods.slow]
strategy = "fedavg"
{grid}
"""


@pytest.mark.parametrize("seeds, grid, expected", [
    ("[0, 0]", "", "entry 'seeds' = [0, 0] is invalid: it lists seed 0 twice"),
    ("[0, 1]", "[methods.slow.grid]\nlearning-rate = [0.1, 0.1]",
     "[methods.slow.grid] learning-rate = [0.1, 0.1] is invalid: it lists value 0.1 twice"),
    ("[0, 1]", "[grid]\nlocal-epochs = [2, 2]", "[grid] local-epochs = [2, 2] is invalid: it lists value 2 twice"),
])
def test_an_experiment_file_giving_a_seed_or_grid_value_twice_is_refused(tmp_path, capsys, seeds, grid, expected):
    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT.format(seeds=seeds, grid=grid))
    argv = ["--config", str(exp), "--check", "--out", str(tmp_path / "o")]
    try:
        assert run_simulation.main(argv) == 2
    except SystemExit as exit_:  # refused while the file is read
        assert exit_.code == 2
    assert expected in one_line_error(capsys)


def test_a_tuning_search_giving_a_seed_or_value_twice_is_refused(tmp_path):
    from fl_app.config import ConfigError
    from runner.experiment import read_experiment

    exp = tmp_path / "exp.toml"
    tune = '[tune]\nseeds = [{seeds}]\nbudget = 0.5\nmetric = "best"\n[tune.grid]\nlearning-rate = [{values}]\n'
    exp.write_text('strategies = ["fedavg"]\n' + tune.format(seeds="0, 0", values="0.1, 0.2"))
    with pytest.raises(ConfigError, match=r"\[tune\] seeds = \[0, 0\] is invalid: it lists seed 0 twice"):
        read_experiment(exp)
    exp.write_text('strategies = ["fedavg"]\n' + tune.format(seeds="0, 1", values="0.1, 0.1"))
    with pytest.raises(ConfigError, match=r"\[tune.grid\] learning-rate = \[0.1, 0.1\] is invalid: it lists value"):
        read_experiment(exp)


# ---- 10. an experiment file's error is one line, not argparse's usage block ----------------------------

@pytest.mark.parametrize("body, expected", [('name = "t\n', "is not valid TOML"),
                                            ('clients = "10"\n', "entry 'clients'"),
                                            (None, "no such file")])
def test_a_config_error_is_one_line(tmp_path, capsys, body, expected):
    exp = tmp_path / "exp.toml"
    if body is not None:
        exp.write_text(body)
    err = refused_at_parse(["--config", str(exp), "--check"], capsys)
    assert err.startswith("error: --config") and expected in err


@pytest.mark.parametrize("body, expected", [
    ('stratgies = ["fedavg"]\n', "unknown entry 'stratgies' (did you mean 'strategies'?)"),
    ('strategies = ["fedavg"]\n[run-config]\nlearning-rte = 0.1\n',
     "[run-config] names unknown run-config key 'learning-rte' (did you mean 'learning-rate'?)"),
    ('strategies = ["v"]\n[methods.v]\nstrategy = "fedprox"\nproximal-mew = 0.1\n',
     "[methods.v] names unknown run-config key 'proximal-mew' (did you mean 'proximal-mu'?)"),
    ('strategies = ["fedavg"]\n[grid]\nlearnin-rate = [0.1]\n', "[grid] names unknown run-config key 'learnin-rate'"),
])
def test_a_misspelled_key_in_an_experiment_file_names_the_closest_not_every_key(tmp_path, capsys, body, expected):
    """A key typo inside a --config file is refused naming the table, the key, its closest valid
    key and where the whole list is (not all ~140 keys on one line), and a misspelled top-level
    table gets a did-you-mean."""
    exp = tmp_path / "exp.toml"
    exp.write_text(body)
    err = refused_at_parse(["--config", str(exp), "--check"], capsys)
    assert err.startswith("error: --config") and expected in err and len(err.splitlines()) == 1
    assert "batch-size" not in err  # not the list of every key
    assert "--list keys" in err or "valid entries: chosen-by" in err


# ---- 4. a fault or attack on a partition that does not exist ----------------------------------------

@pytest.mark.parametrize("faults, named", [("flip:99", 99), ("flip:4", 4), ("raise:0,scale:7:100@2", 7),
                                           ("nan:5,noise:1:50", 5)])
def test_an_attack_on_a_partition_that_does_not_exist_is_refused(tmp_path, capsys, faults, named):
    """`inject-faults=flip:99` with 4 clients passed --check and ran a clean run, rc 0: a study
    with a wrong partition number reported a defence that lost nothing."""
    argv = [*SYNTH, "--clients", "4", "--set", f"inject-faults={faults}", "--check", "--out", str(tmp_path / "o")]
    assert run_simulation.main(argv) == 2
    err = one_line_error(capsys)
    assert f"'inject-faults' = '{faults}' is invalid: partition {named} does not exist" in err
    assert "4 partition(s), so a fault or attack names one of 0 to 3" in err


def test_an_attack_on_the_last_partition_passes(tmp_path):
    argv = [*SYNTH, "--clients", "4", "--set", "inject-faults=flip:3,crash-after:2", "--check",
            "--out", str(tmp_path / "o")]
    assert run_simulation.main(argv) == 0


def test_the_server_refuses_an_attack_on_a_partition_no_node_reported(tmp_path):
    """`flwr run` without the runner: the ServerApp's check of the reported partitioning."""
    from fl_app.config import ConfigError
    from fl_app.registry import validate_config
    from fl_app.server.startup import ServerStartup

    class Reported:
        num_partitions = 4

    cfg = validate_config({"dataset": "synthetic", "model": "logreg", "inject-faults": "flip:99"})
    with pytest.raises(ConfigError, match="partition 99 does not exist; the federation has 4 partition"):
        ServerStartup(cfg, Reported())._check()


# ---- 9. labels outside the dataset's classes; no CPU per client --------------------------------------

@pytest.fixture(scope="module")
def mnist_rows(mnist_sample):
    """A small MNIST sample (its folder), for data folders with altered labels."""
    return mnist_sample(600, 100)


def relabelled(tmp_path: Path, source: Path, split: str, label) -> Path:
    """A copy of the MNIST data folder ``source`` whose ``split`` has ``label`` in its row 7."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "data"
    (folder / "mnist").mkdir(parents=True)
    for name in ("train", "test"):
        table = pq.read_table(source / "mnist" / f"{name}.parquet")
        if name == split:
            labels = table.column("label").to_pylist()
            labels[7] = label
            kind = pa.float64() if isinstance(label, float) else pa.int64()
            table = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels, type=kind))
        pq.write_table(table, folder / "mnist" / f"{name}.parquet")
    return folder


@pytest.mark.parametrize("split, label, expected", [
    ("train", 42, "label 42 is outside mnist's classes; valid labels: the integers 0 to 9"),
    ("test", -1, "label -1 is outside mnist's classes"),
    ("train", 10, "label 10 is outside mnist's classes"),
    ("train", 3.5, "label column 'label' holds double values, not integers"),
])
def test_labels_outside_the_classes_are_refused_before_launch(tmp_path, capsys, mnist_rows, split, label, expected):
    """Label 42 in an MNIST file passed --check; after launch every client failed with
    `IndexError: Target 42 is out of bounds`, buried in a 622-line log."""
    data = relabelled(tmp_path, mnist_rows, split, label)
    argv = ["--dataset", "mnist", "--set", "model=cnn-small", "--data-dir", str(data), "--clients", "4",
            "--out", str(tmp_path / "o")]
    for check in (["--check"], []):  # --check, and a launch (refused before anything starts)
        assert run_simulation.main([*argv, *check]) == 2
        err = one_line_error(capsys)
        assert f"{data / 'mnist' / split}.parquet: {expected}" in err
    assert not (tmp_path / "o" / "runs").exists()


def test_the_server_refuses_labels_outside_the_classes(tmp_path, mnist_rows):
    """The ServerApp's check of the data (``check_data``, before round 1), for `flwr run`."""
    from tasks.datasets import DataUnavailableError
    from tasks.partitioning import PartitionSpec, check_data

    spec = PartitionSpec(dataset="mnist", num_partitions=4, partitioner="iid", seed=0,
                         data_dir=str(relabelled(tmp_path, mnist_rows, "train", 42)))
    with pytest.raises(DataUnavailableError, match="label 42 is outside mnist's classes"):
        check_data(spec)
    check_data(PartitionSpec(dataset="mnist", num_partitions=4, partitioner="iid", seed=0, data_dir=str(mnist_rows)))


@pytest.mark.parametrize("flag, value, expected", [
    ("--cpus-per-client", "0", "--cpus-per-client = 0 is invalid: must be > 0"),
    ("--cpus-per-client", "-1", "--cpus-per-client = -1 is invalid: must be > 0"),
    ("--cpus-per-client", "nan", "--cpus-per-client = nan is invalid"),
    ("--gpus-per-client", "-0.5", "--gpus-per-client = -0.5 is invalid: must be >= 0"),
])
def test_no_cpu_per_client_is_refused_before_launch(tmp_path, capsys, flag, value, expected):
    """`--cpus-per-client 0` launched and failed inside Flower (ZeroDivisionError), its last
    line "An error was encountered. Ending simulation."."""
    for check in (["--check"], []):
        assert run_simulation.main([*SYNTH, flag, value, *check, "--out", str(tmp_path / "o")]) == 2
        assert expected in one_line_error(capsys)
    assert not (tmp_path / "o" / "runs").exists()


# ---- 10. a full disk, Ctrl-C, a clean exit --------------------------------------------------------------

def full_disk(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_a_checkpoint_write_on_a_full_disk_leaves_the_old_one_and_no_temp_file(tmp_path, monkeypatch):
    """A full disk left `checkpoint.npz.tmp` beside the checkpoint."""
    import numpy as np

    from fl_app.server.checkpoint import CHECKPOINT, Checkpoint, load_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, Checkpoint(1, [np.ones((2, 3), np.float32)], model="logreg"))
    before = (tmp_path / CHECKPOINT).read_bytes()

    def half_then_full(file, **arrays):
        file.write(b"PK\x03\x04 half a zip")
        full_disk()

    monkeypatch.setattr(np, "savez", half_then_full)
    with pytest.raises(OSError, match="No space left") as error:
        save_checkpoint(tmp_path, Checkpoint(2, [np.zeros((2, 3), np.float32)], model="logreg"))
    assert error.value.filename == str(tmp_path / CHECKPOINT)  # named, for the one line that reports it
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT]
    assert (tmp_path / CHECKPOINT).read_bytes() == before and load_checkpoint(tmp_path).round == 1


def test_a_comparison_written_on_a_full_disk_is_left_whole(tmp_path, monkeypatch):
    """A full disk left a 0-byte comparison.csv."""
    import csv

    from runner.results.report import write_comparison

    table = [{"method": "fedavg", "seeds": 1, "rounds": 2, "final_accuracy_mean": 0.5, "final_accuracy_std": 0.0,
              "best_accuracy_mean": 0.5, "best_accuracy_std": 0.0, "seconds_mean": 1.0}]
    (tmp_path / "comparison.csv").write_text("method\nearlier\n")
    monkeypatch.setattr(csv.DictWriter, "writerows", full_disk)
    with pytest.raises(OSError):
        write_comparison(table, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comparison.csv"]
    assert (tmp_path / "comparison.csv").read_text() == "method\nearlier\n"


@pytest.fixture
def launched(monkeypatch):
    """The runner with its launch replaced (``launch(args, configs, runs_dir)``, the test's) and
    the checkout shipped as it is: what happens around the runs, in a second."""
    from runner.launch import APP_DIR

    def use(launch):
        monkeypatch.setattr(sweep, "snapshot", lambda out: APP_DIR)
        monkeypatch.setattr(sweep, "launch", lambda args, configs, runs_dir, *rest: launch(runs_dir))

    return use


def test_a_full_disk_while_reporting_is_one_line(tmp_path, capsys, launched, monkeypatch):
    launched(lambda runs_dir: sweep.Outcome())
    def no_space(table, out, setup=""):
        raise OSError(28, "No space left on device", str(out / "comparison.csv"))

    monkeypatch.setattr(sweep, "write_comparison", no_space)
    assert run_simulation.main([*SYNTH, "--out", str(tmp_path / "o")]) == 1
    err = one_line_error(capsys)
    assert f"cannot write {tmp_path / 'o' / 'comparison.csv'}: No space left on device" in err
    assert f"--resume {tmp_path / 'o'}" in err


def test_ctrl_c_is_one_line_without_a_traceback(tmp_path, capsys, launched):
    """Ctrl-C printed a 20-line traceback (the runner's stack down to the line it was reading)."""
    def interrupted(runs_dir):
        raise KeyboardInterrupt

    launched(interrupted)
    assert run_simulation.main([*SYNTH, "--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err
    assert err.strip() == (f"interrupted (Ctrl-C): the runs finished or checkpointed in {tmp_path / 'o'} are kept:"
                           f" run_simulation.py --resume {tmp_path / 'o'} continues them")


def test_the_lock_file_is_removed_after_a_clean_exit_and_kept_while_held(tmp_path, launched):
    """`<out>/.lock` stayed in the results folder after every run."""
    seen = []
    launched(lambda runs_dir: seen.append((runs_dir.parent / ".lock").exists()) or sweep.Outcome())
    assert run_simulation.main([*SYNTH, "--out", str(tmp_path / "o")]) == 0
    assert seen == [True] and not (tmp_path / "o" / ".lock").exists()
    assert (tmp_path / "o" / "runner.json").exists()


def test_a_lock_file_removed_by_its_holder_is_not_taken(tmp_path, monkeypatch):
    """A runner that opened `.lock` just before its holder removed it (on a clean exit) would
    lock a file no one else sees: it takes the lock again on the file now at the path."""
    import os

    from runner.processes import LOCK_NAME, lock_folder, release_folder

    first = lock_folder(tmp_path)
    stale = os.open(tmp_path / LOCK_NAME, os.O_RDWR)  # the other runner's open, before the removal
    release_folder(tmp_path, first, remove=True)
    assert not (tmp_path / LOCK_NAME).exists()
    opened, real_open = [], os.open
    monkeypatch.setattr(os, "open", lambda *a: opened.append(a[0]) or (stale if len(opened) == 1 else real_open(*a)))
    second = lock_folder(tmp_path)
    assert len(opened) == 2 and second != stale
    assert os.path.samestat(os.fstat(second), os.stat(tmp_path / LOCK_NAME))
    release_folder(tmp_path, second, remove=False)
    assert (tmp_path / LOCK_NAME).exists()


def test_a_finished_run_whose_metrics_were_deleted_is_named(tmp_path, capsys, monkeypatch):
    """A kept run whose metrics.csv was deleted was shown as a plain row, rc 0, nothing said."""
    from fl_app.registry import validate_config
    from runner.launch import APP_DIR

    monkeypatch.setattr(sweep, "snapshot", lambda out: APP_DIR)
    out = tmp_path / "o"
    argv = [*SYNTH, "--rounds", "2", "--clients", "4", "--out", str(out)]
    (_, _, raw), = checks.build_configs(cli.parse_args(argv), out / "runs")
    run_dir = out / "runs" / raw["run-name"]
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({
        "config": validate_config(raw), "rounds": 2, "final_accuracy": 0.6, "best_accuracy": 0.6, "final_loss": 1.0,
        "total_seconds": 3.0, "stopped": None, "num_clients": 4}))  # and no metrics.csv
    assert run_simulation.main(argv) == 1
    captured = capsys.readouterr()
    assert "fedavg seed 0: finished earlier, but its metrics.csv is missing (removed after it finished), kept" in (
        captured.out)
    assert captured.err.strip().splitlines()[-1].startswith("error: 1 finished run(s) have no metrics.csv")
    assert "fedavg-seed0; run them again with another --out" in captured.err
    comparison = (out / "comparison.md").read_text()
    assert "| fedavg (!) |" in comparison and "- fedavg: fedavg-seed0" in comparison
    assert "finished runs without their metrics.csv" in comparison


STOPPED_OUTPUT = """\
WARNING :   round 3: rejected the update of node 42: non-finite values (NaN or Inf)
ERROR :     Simulation raised an exception
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/flwr/simulation/app.py", line 337, in run_simulation_process
    simulation_result = _run_simulation(
                        ^^^^^^^^^^^^^^^^
  File "/tmp/apps/fl_app/server/server.py", line 226, in screen
    raise RunAborted(f"{reason}. Stopping the run; the summary and the last checkpoint are kept.")
{exception}: round 3: only 0 of 2 sampled clients returned a usable update (0 failed, 2 rejected)
ERROR :     Exit Code: 700
An unhandled exception occurred when running the simulation.
For more information, visit: <https://flower.ai/docs/framework/1.41/en/ref-exit-codes/700.html>
INFO :      after the run"""


@pytest.mark.parametrize("exception, hidden", [("fl_app.server.participation.RunAborted", True),
                                               ("ValueError", False)])
def test_a_run_that_stopped_itself_shows_no_traceback(capsys, exception, hidden):
    """Every reply non-finite: the run stopped (its line "stopped after 2 rounds: ..." comes from
    its summary), but a 30-line traceback of RunAborted and Flower's exit code 700 came first."""
    import argparse

    lines = STOPPED_OUTPUT.replace("{exception}", exception).splitlines()
    tail: list[str] = []
    on_line = sweep.progress_printer(argparse.Namespace(quiet=False, verbose=False), tail, lead="")
    for line in lines:
        on_line(line)
    shown = capsys.readouterr().out.splitlines()
    assert tail == lines  # the run's failure report still has every line
    if hidden:
        assert shown == [lines[0], lines[-1]]
    else:  # any other error is shown whole
        assert shown == lines
