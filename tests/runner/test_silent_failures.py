"""No silent loss of work, no silent wrong conclusion: each test checks one way a user could
lose work or draw a wrong conclusion without being told (resume, data folders, empty rounds,
checkpoints, collected runs, experiment files, pre-launch checks, deployment keys)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

import run_simulation
from runner import checks, cli
from tests.kit import ROOT
from tests.kit_runs import load_make_results


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
    args = cli.parse_args(["--config", str(exp), "--out", str(out)])
    configs = checks.build_configs(args, out / "runs")
    assert configs[0][2]["data-dir"] == str(mine)
    out.mkdir()
    (out / "runner.json").write_text(json.dumps(cli.runner_record(args)))
    started = out / "runs" / configs[0][2]["run-name"]
    started.mkdir(parents=True)
    from fl_app.registry import validate_config

    (started / "run-config.json").write_text(json.dumps(validate_config(configs[0][2])))
    monkeypatch.delenv("FL_DATA_DIR")  # a new shell
    resumed = cli.parse_args(["--resume", str(out)])
    again = checks.build_configs(resumed, out / "runs")
    assert [c[2] for c in again] == [c[2] for c in configs]
    assert checks.changed_runs(again, out / "runs", resumed.env_data_dir) == []


def test_a_finished_cohort_run_is_kept_by_resume_though_the_launch_set_its_client_threads(tmp_path):
    """The runner adds ``client-threads`` (the per-client path's torch threads, from
    --cpus-per-client) to a cohort run's config as it launches it, so the run records 1 where the
    planned config holds the default 0: that is where it ran, not what it ran, and --resume (or
    the same command again) keeps the finished run instead of refusing it (it refused every
    finished cohort run: "client-threads 1 -> 0")."""
    from fl_app.api import changed_runs
    from fl_app.registry import validate_config

    raw = {"strategy": "scaffold", "dataset": "synthetic", "model": "logreg", "num-server-rounds": 2,
           "run-name": "scaffold-seed0", "execution": "cohort"}
    run_dir = tmp_path / "runs" / "scaffold-seed0"
    run_dir.mkdir(parents=True)
    recorded = {**validate_config(raw), "client-threads": 1}
    (run_dir / "summary.json").write_text(json.dumps({"config": recorded}))
    assert changed_runs([raw], tmp_path / "runs") == []
    (run_dir / "summary.json").write_text(json.dumps({"config": {**recorded, "local-epochs": 3}}))
    assert changed_runs([raw], tmp_path / "runs") != []  # what it ran is still compared


def test_resume_from_another_folder_keeps_a_relative_data_dir(tmp_path, monkeypatch):
    """An experiment file's relative data-dir means the folder the comparison was started
    from, also when --resume is run from elsewhere."""
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    exp = write_experiment(tmp_path / "exp.toml", SYNTH_EXPERIMENT.format(data="mine"))
    out = tmp_path / "out"
    args = cli.parse_args(["--config", str(exp), "--out", str(out)])
    configs = checks.build_configs(args, out / "runs")
    assert configs[0][2]["data-dir"] == str(tmp_path / "mine")
    out.mkdir()
    (out / "runner.json").write_text(json.dumps(cli.runner_record(args)))
    monkeypatch.chdir(ROOT)
    resumed = cli.parse_args(["--resume", str(out)])
    assert checks.build_configs(resumed, out / "runs")[0][2]["data-dir"] == str(tmp_path / "mine")


def test_no_message_advises_deleting_run_folders():
    """No string the product can print (any string literal, f-strings included) says "delete"."""
    import ast

    root = Path(run_simulation.__file__).parent
    for path in [root / "run_simulation.py", *root.glob("runner/**/*.py"), *root.glob("fl_app/**/*.py")]:
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 and id(n) not in docstrings]
        assert not [t for t in texts if "delete" in t.lower()], path


# ---- 2. a data folder is used whole or refused ---------------------------------------------------

def half_folder(tmp_path: Path, shared_data: Path) -> Path:
    """A data folder with MNIST's train split only."""
    (tmp_path / "half" / "mnist").mkdir(parents=True)
    (tmp_path / "half" / "mnist" / "train.parquet").symlink_to(shared_data / "mnist" / "train.parquet")
    return tmp_path / "half"


def test_a_data_folder_missing_a_split_is_refused_naming_the_file(tmp_path, shared_data, monkeypatch, capsys):
    from fl_app.server.preflight import check_data_dir
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


# ---- 4. checkpoints are checked before use ----------------------------------------------------------

def small_checkpoint(run_dir: Path, model: str = "mlp"):
    from fl_app.server.checkpoint import Checkpoint, save_checkpoint
    from tasks.datasets import input_shape
    from tasks.models import build_model, get_weights

    weights = get_weights(build_model(model, input_shape("synthetic"), seed=0))
    save_checkpoint(run_dir, Checkpoint(2, weights, {}, 3, 1.0, model))
    return [w.shape for w in weights]


def test_a_checkpoint_of_another_model_is_refused_naming_file_and_fix(tmp_path):
    from fl_app.server.checkpoint import CheckpointError, load_checkpoint
    from fl_app.server_app import server_fn
    from tests.kit import fake_context

    shapes = small_checkpoint(tmp_path / "r", "mlp")
    assert load_checkpoint(tmp_path / "r", "mlp", shapes).round == 2
    path = str(tmp_path / "r" / "checkpoint.npz")
    with pytest.raises(CheckpointError, match=re.escape(path) + ".*model 'mlp'.*this run builds model 'logreg'"):
        server_fn(fake_context({"dataset": "synthetic", "model": "logreg", "results-dir": str(tmp_path),
                                "run-name": "r", "resume": True}))


def test_a_truncated_or_altered_checkpoint_is_one_line_naming_file_and_fix(tmp_path, capsys):
    from fl_app.server.checkpoint import CheckpointError, load_checkpoint

    shapes = small_checkpoint(tmp_path / "r")
    path = tmp_path / "r" / "checkpoint.npz"
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + " is unreadable.*rename") as info:
        load_checkpoint(tmp_path / "r", "mlp", shapes)
    assert "\n" not in str(info.value)
    import zipfile

    with zipfile.ZipFile(path.with_name("x.npz"), "w") as out, zipfile.ZipFile(io.BytesIO(good)) as src:
        for item in src.namelist():  # the same archive with one weight changed
            data = src.read(item)
            out.writestr(item, data[:-4] + b"\x00\x00\x80\x3f" if item == "w0.npy" else data)
    path.with_name("x.npz").replace(path)
    with pytest.raises(CheckpointError, match="does not match its recorded SHA-256"):
        load_checkpoint(tmp_path / "r", "mlp", shapes)
    # the runner refuses before any launch
    exp = ["--strategy", "fedavg", "--dataset", "synthetic", "--set", "model=mlp"]
    assert run_simulation.main([*exp, "--check", "--out", str(tmp_path / "o")]) == 0
    (tmp_path / "o" / "runs" / "fedavg-seed0").mkdir(parents=True)
    path.replace(tmp_path / "o" / "runs" / "fedavg-seed0" / "checkpoint.npz")
    assert run_simulation.main([*exp, "--check", "--out", str(tmp_path / "o")]) == 2
    assert "SHA-256" in capsys.readouterr().err


def test_check_says_which_runs_are_kept_or_continued_and_estimates_only_what_is_left(tmp_path, capsys):
    """A sweep continued after an interruption: --check names each run's fate, and its time
    estimate counts only the rounds still to train (it counted every run before)."""
    exp = ["--strategy", "fedavg,fedprox", "--dataset", "synthetic", "--set", "model=mlp", "--rounds", "5",
           "--out", str(tmp_path / "o")]
    assert run_simulation.main([*exp, "--check"]) == 0
    assert "for 2 runs, at load" in capsys.readouterr().out
    runs = tmp_path / "o" / "runs"
    configs = {raw["run-name"]: raw for _, _, raw in checks.build_configs(cli.parse_args(exp), runs)}
    (runs / "fedavg-seed0").mkdir(parents=True)
    (runs / "fedavg-seed0" / "summary.json").write_text(json.dumps({"config": configs["fedavg-seed0"]}))
    small_checkpoint(runs / "fedprox-seed0")  # written after round 2 of 5
    assert run_simulation.main([*exp, "--check"]) == 0
    out = capsys.readouterr().out
    assert "fedavg seed 0 -> " in out and "(finished, kept; per-client)" in out
    assert "fedprox seed 0 -> " in out and "(continues after round 2; per-client)" in out
    assert "for 1 runs (1 finished runs kept)" in out
    (runs / "fedprox-seed0" / "summary.json").write_text(json.dumps({"config": configs["fedprox-seed0"]}))
    assert run_simulation.main([*exp, "--check"]) == 0
    assert "nothing left to run (2 finished runs kept)" in capsys.readouterr().out


# ---- 3. a round without any usable update is flagged ------------------------------------------------

def recorded_run(run_dir: Path, rounds_ok: list[bool]) -> Path:
    """A RoundByRound run of len(rounds_ok) rounds under min-fit-fraction = 0; in a round
    marked False the only sampled client failed."""
    import numpy as np
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.server.strategy import FedAvg

    from fl_app.registry import validate_config
    from tests.kit import Proxy
    from tests.kit_server import RoundByRound

    cfg = validate_config({"dataset": "synthetic", "model": "logreg", "min-fit-fraction": 0.0})
    params = ndarrays_to_parameters([np.ones((2,), np.float32)])
    inner = FedAvg(evaluate_fn=lambda rnd, arrays, config: (1.0, {"accuracy": 0.1 + 0.1 * rnd}))
    recording = RoundByRound(inner, cfg, run_dir, num_rounds=len(rounds_ok))
    for rnd, ok in enumerate(rounds_ok, 1):
        recording.participation.sampled, recording.round_started = 1, 0.0
        recording.row = {"round": rnd, "num_clients": 0, "num_failures": 0, "num_rejected": 0, "num_dropped": 0}
        reply = [(Proxy("0"), FitRes(Status(Code.OK, ""), params, 10, {}))]
        recording.aggregate_fit(rnd, reply if ok else [], [] if ok else [RuntimeError("client failed")])
        recording.evaluate(rnd, params)
    return run_dir


def test_rounds_without_any_update_are_flagged_and_untrained_runs_are_no_result(tmp_path):
    from runner.results.report import compare, read_summary, write_comparison

    dead = read_summary(recorded_run(tmp_path / "dead-seed0", [False, False]))
    assert dead["rounds_without_update"] == [1, 2] and dead["untrained"] is True
    gap = read_summary(recorded_run(tmp_path / "gap-seed0", [False, True]))
    assert gap["rounds_without_update"] == [1] and gap["untrained"] is False
    good = read_summary(recorded_run(tmp_path / "good-seed0", [True, True]))
    assert good["rounds_without_update"] == [] and good["untrained"] is False
    table = compare({"dead": [tmp_path / "dead-seed0"], "gap": [tmp_path / "gap-seed0"],
                     "good": [tmp_path / "good-seed0"]})
    write_comparison(table, tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "| dead (!) | 0 | 2 | no result | no result |" in md  # the initial model's 0.3 is not shown
    assert "| gap (!) | 1 | 2 | 0.3000 |" in md and "| good | 1 | 2 | 0.3000 |" in md
    assert "- dead: dead-seed0: untrained" in md and "- gap: gap-seed0: no client update used in rounds [1]" in md


# ---- 6. experiment-file and runner.json errors are one line ------------------------------------------

@pytest.mark.parametrize("line, key, expected", [
    ('clients = "10"', "clients", "an integer >= 1"),
    ('strategies = "fedavg,fedprox"', "strategies", "a non-empty list of method names"),
    ("seeds = 0", "seeds", "a non-empty list of integers"),
    ('run-config = "x"', "run-config", "a table"),
])
def test_experiment_file_type_errors_name_key_file_and_type(tmp_path, capsys, line, key, expected):
    exp = write_experiment(tmp_path / "exp.toml", f'name = "t"\n{line}\n')
    with pytest.raises(SystemExit) as info:
        cli.parse_args(["--config", str(exp)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert str(exp) in err and f"entry {key!r}" in err and expected in err and "Traceback" not in err


def test_malformed_experiment_file_and_corrupt_runner_json_are_one_line(tmp_path, capsys):
    exp = write_experiment(tmp_path / "exp.toml", 'name = "t\nclients = 4\n')
    with pytest.raises(SystemExit):
        cli.parse_args(["--config", str(exp)])
    assert f"{exp} is not valid TOML" in capsys.readouterr().err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "runner.json").write_text('{"strategy": "fedavg", "seeds": [0')
    with pytest.raises(SystemExit):
        cli.parse_args(["--resume", str(tmp_path / "out")])
    assert "runner.json is not readable JSON" in capsys.readouterr().err
    (tmp_path / "out" / "runner.json").write_text('{"strategy": "fedavg", "seeds": 0}')
    with pytest.raises(SystemExit):
        cli.parse_args(["--resume", str(tmp_path / "out")])
    assert "has no list 'seeds'" in capsys.readouterr().err


def test_make_results_reports_a_bad_experiment_file_in_one_line(tmp_path, capsys):
    make_results = load_make_results()
    write_experiment(tmp_path / "exp.toml", 'name = "t"\nclients = "10"\n')
    assert make_results.main(["--experiments", str(tmp_path), "--results", str(tmp_path / "r"),
                              "--out", str(tmp_path / "results.md")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "entry 'clients'" in err


# ---- 5. --collect refuses runs made with another setting -----------------------------------------------

BIG = """
name = "big"
strategies = ["fedavg"]
seeds = [0]
clients = 100
[run-config]
dataset = "synthetic"
model = "logreg"
num-server-rounds = 20
local-epochs = 2
data-dir = "/somewhere"
"""


def finished_run(runs: Path, name: str, config: dict, num_clients: int) -> None:
    from fl_app.registry import validate_config

    d = runs / name
    d.mkdir(parents=True)
    (d / "metrics.csv").write_text("round,test_accuracy\n1,0.5\n")
    (d / "summary.json").write_text(json.dumps({
        "config": validate_config(config), "rounds": 1, "final_accuracy": 0.5, "best_accuracy": 0.5,
        "final_loss": 1.0, "total_seconds": 1.0, "stopped": None, "num_clients": num_clients}))


def test_collect_refuses_a_run_made_with_another_setting(tmp_path, capsys):
    make_results = load_make_results()
    exps, source, store = tmp_path / "experiments", tmp_path / "results", tmp_path / "store"
    exps.mkdir()
    exp = write_experiment(exps / "big.toml", BIG)
    runs = source / "big" / "runs"
    same = {"strategy": "fedavg", "dataset": "synthetic", "model": "logreg", "seed": 0,
            "num-server-rounds": 20, "local-epochs": 2, "data-dir": "/my/machine", "evaluate-every": 5}
    finished_run(runs, "fedavg-seed0", same, 100)  # a machine path and an unfixed key may differ
    argv = ["--experiments", str(exps), "--results", str(store), "--collect", str(source),
            "--out", str(tmp_path / "results.md")]
    assert make_results.main(argv) == 0 and (store / "big" / "fedavg-seed0" / "summary.json").exists()
    capsys.readouterr()
    finished_run(source / "big2", "x", same, 100)  # (not an experiment folder: ignored)
    (runs / "fedavg-seed0").rename(runs.parent / "kept")
    finished_run(runs, "fedavg-seed0", {**same, "num-server-rounds": 3, "local-epochs": 1}, 10)
    (store / "big" / "fedavg-seed0").rename(store / "big" / "before")
    assert make_results.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{exp}: run fedavg-seed0: num-server-rounds = 3, the experiment file fixes 20" in err
    assert "local-epochs = 1, the experiment file fixes 2" in err and "clients = 10, the experiment file fixes 100" in err
    assert not (store / "big" / "fedavg-seed0").exists()  # nothing copied
    summary = json.loads((runs.parent / "kept" / "summary.json").read_text())
    (runs / "fedavg-seed0" / "summary.json").write_text(json.dumps({**summary, "untrained": True}))
    assert make_results.main(argv) == 2
    assert "run fedavg-seed0 is untrained" in capsys.readouterr().err


# ---- 7. refused before launch or before training ----------------------------------------------------

def test_a_federation_larger_than_the_data_is_refused_before_any_node_is_asked(shared_data, caplog):
    """`flwr run` with num-supernodes = 100000: the ServerApp's start-up refuses it in one
    fl-drift line instead of polling every node."""
    from fl_app.registry import validate_config
    from fl_app.server.startup import ServerStartup
    from tasks.datasets import PartitionError

    class Nodes:  # the client manager as Flower fills it: every simulated node registered
        asked = False

        def wait_for(self, n):
            return True

        def num_available(self):
            return 100_000

        def learn_partitions(self):
            Nodes.asked = True

    cfg = validate_config({"dataset": "mnist", "model": "cnn-small", "data-dir": str(shared_data)})
    startup = ServerStartup(cfg, Nodes())
    with pytest.raises(PartitionError, match="100000 partitions requested .* at most 6000 dirichlet partitions"):
        startup._learn()
    assert not Nodes.asked


def test_check_refuses_gpus_without_a_cuda_gpu(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["--dataset", "synthetic", "--set", "model=logreg", "--check", "--out", str(tmp_path / "o")]
    assert run_simulation.main([*argv, "--gpus-per-client", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpus-per-client = 0.5" in err and "no CUDA GPU" in err
    assert run_simulation.main([*argv, "--gpus-per-client", "0"]) == 0


def test_the_runner_finds_flower_beside_its_python_or_names_what_is_missing(tmp_path, monkeypatch, capsys):
    """`venv/bin/python run_simulation.py` without the venv on PATH: the SuperLink it starts
    must find flower-superexec beside sys.executable; with no Flower at all, the runner names
    the missing flower-superexec instead of 'flower-superlink exited early'."""
    import os

    from runner import processes

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = processes.private_env(tmp_path / "home")
    assert env["PATH"].split(os.pathsep)[0] == str(processes.BIN_DIR)
    monkeypatch.setattr(processes, "BIN_DIR", tmp_path)  # a Python without Flower's scripts
    with pytest.raises(processes.MissingTool, match=r"flower-superexec is neither beside .* nor on PATH"):
        processes.exe("flower-superexec")
    argv = ["--dataset", "synthetic", "--set", "model=logreg", "--rounds", "1", "--clients", "2",
            "--out", str(tmp_path / "o")]
    assert run_simulation.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "flower-superexec is neither beside" in err


# ---- 8. deployment keys ------------------------------------------------------------------------------

def test_private_keys_are_created_0600_not_chmod_ed_after(tmp_path, monkeypatch):
    """With chmod disabled, a key written with default permissions and chmod-ed afterwards
    would be left world-readable: the keys must be created 0600."""
    import os
    import stat

    spec = __import__("importlib.util").util.spec_from_file_location("make_certs", ROOT / "scripts" / "make_certs.py")
    make_certs = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(make_certs)
    monkeypatch.setattr(Path, "chmod", lambda self, mode: None)
    old = os.umask(0o022)
    try:
        make_certs.main(["--out", str(tmp_path), "--host", "127.0.0.1", "--node-key", "dev1"])
    finally:
        os.umask(old)
    for name in ("ca.key", "server.key", "supernode-dev1.key"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    assert not list(tmp_path.glob(".*.tmp"))


def test_gitignore_covers_every_key_path_the_readme_uses():
    import subprocess

    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "deployment.md").read_text()
    paths = sorted(set(re.findall(r"[\w./-]+\.(?:key|pem)\b", text)))
    assert "supernode-dev1.key" in paths and "certs/ca.key" in paths
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *paths],
                             capture_output=True, text=True).stdout.split()
    assert sorted(ignored) == paths
