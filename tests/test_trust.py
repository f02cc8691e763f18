"""Issue 29: trustworthy runs. Each test reproduces one way a user could lose work or draw a
wrong conclusion without being told (resume, data folders, empty rounds, checkpoints,
collected runs, experiment files, pre-launch checks)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import run_simulation


def write_experiment(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


SYNTH_EXPERIMENT = """
name = "trust"
strategies = ["fedavg"]
seeds = [0]
clients = 4
[run-config]
dataset = "synthetic"
model = "logreg"
num-server-rounds = 2
data-dir = "{data}"
"""


# ---- 1. resume replays the recorded configuration ------------------------------------------------

def test_resume_of_an_experiment_with_data_dir_and_fl_data_dir_keeps_its_runs(tmp_path, monkeypatch):
    """The experiment file's data-dir beats $FL_DATA_DIR; --resume must replay that precedence
    rather than turn the recorded $FL_DATA_DIR into a --data-dir that overrides the file."""
    mine, env = tmp_path / "mine", tmp_path / "env"
    mine.mkdir()
    env.mkdir()
    monkeypatch.setenv("FL_DATA_DIR", str(env))
    exp = write_experiment(tmp_path / "exp.toml", SYNTH_EXPERIMENT.format(data=mine))
    out = tmp_path / "out"
    args = run_simulation.parse_args(["--config", str(exp), "--out", str(out)])
    configs = run_simulation.build_configs(args, out / "runs")
    assert configs[0][2]["data-dir"] == str(mine)
    out.mkdir()
    (out / "runner.json").write_text(json.dumps(run_simulation.runner_record(args)))
    started = out / "runs" / configs[0][2]["run-name"]
    started.mkdir(parents=True)
    from fl_app.config import validate_config

    (started / "run-config.json").write_text(json.dumps(validate_config(configs[0][2])))
    monkeypatch.delenv("FL_DATA_DIR")  # a new shell
    resumed = run_simulation.parse_args(["--resume", str(out)])
    again = run_simulation.build_configs(resumed, out / "runs")
    assert [c[2] for c in again] == [c[2] for c in configs]
    assert run_simulation.changed_runs(again, out / "runs", resumed.env_data_dir) == []


def test_no_message_advises_deleting_run_folders():
    for path in [Path(run_simulation.__file__), *Path(run_simulation.__file__).parent.glob("fl_app/**/*.py")]:
        assert "delete" not in path.read_text().replace("deleted in ``close()``", ""), path


# ---- 2. a data folder is used whole or refused ---------------------------------------------------

def half_folder(tmp_path: Path, shared_data: Path) -> Path:
    """A data folder with MNIST's train split only."""
    (tmp_path / "half" / "mnist").mkdir(parents=True)
    (tmp_path / "half" / "mnist" / "train.parquet").symlink_to(shared_data / "mnist" / "train.parquet")
    return tmp_path / "half"


def test_a_data_folder_missing_a_split_is_refused_naming_the_file(tmp_path, shared_data, monkeypatch, capsys):
    from fl_app.preflight import check_data_dir
    from tasks.datasets import DataUnavailableError
    from tasks.partition_spec import PartitionSpec
    from tasks.partitioning import federated_dataset

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the old code's hub fall back fails fast offline
    half = half_folder(tmp_path, shared_data)
    missing = str(half / "mnist" / "test.parquet")
    with pytest.raises(DataUnavailableError, match="has no " + re.escape(missing)):
        check_data_dir({"dataset": "mnist", "data-dir": str(half)})
    with pytest.raises(DataUnavailableError, match="has no " + re.escape(missing)):
        federated_dataset(PartitionSpec(dataset="mnist", num_partitions=2, partitioner="iid", seed=0,
                                        data_dir=str(half)))
    monkeypatch.setenv("FL_DATA_DIR", str(half))  # the environment's folder likewise
    assert run_simulation.main(["--dataset", "mnist", "--check", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and missing in err and "hub" in err
