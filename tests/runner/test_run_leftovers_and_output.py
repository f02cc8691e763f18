"""What a run leaves behind and what the runner prints, each checked where it can fail:

- a run refused by its start-up leaves no empty folder in the results;
- ``keep-checkpoint = false`` drops a finished run's checkpoint (and its resume is refused);
- the trackers get round 0, the initial model, as the run's plots do;
- ``--help`` points at README sections that exist (``--ray-address``: 'On a Ray cluster');
- ``--quiet`` prints the per-round lines and errors only;
- ``--check`` gives an execution path's reason once, not on every line;
- the runner's closing table has the essential columns, the file all of them.
"""

from __future__ import annotations

import pytest

from tasks.datasets import PartitionError
from tests.kit import serve_in_process
from tests.kit_runs import tiny_parquet


# ------------------------------------------------------------------ no empty run folders
def test_a_run_refused_by_its_start_up_leaves_no_folder(tmp_path):
    """30 nodes on a 20-example training split: the start-up refuses the partitioning before
    round 1, and the run's folder does not exist (before: an empty folder per failed run)."""
    data = tiny_parquet(tmp_path / "data")
    results = tmp_path / "results"
    cfg = {"dataset": "mnist", "model": "cnn-small", "data-dir": str(data), "partitioner": "iid",
           "results-dir": str(results), "run-name": "refused", "tracking": "none", "num-server-rounds": 1,
           "wait-for-nodes": 5.0}
    with pytest.raises(PartitionError, match="30 partitions requested"):
        serve_in_process(cfg, nodes=30)
    assert not (results / "refused").exists(), list(results.rglob("*"))


# ------------------------------------------------------------------ keep-checkpoint
def _synthetic(tmp_path, **keys) -> dict:
    return {"dataset": "synthetic", "model": "logreg", "num-server-rounds": 2, "fraction-fit": 1.0,
            "results-dir": str(tmp_path), "run-name": "run", "tracking": "none", **keys}


def test_keep_checkpoint_false_drops_the_final_checkpoint_and_refuses_a_resume(tmp_path):
    """By default a finished run keeps checkpoint.npz (resume can extend it); with
    ``keep-checkpoint=false`` it is gone when the run finishes, its results stay, and a resume
    of it is refused in one line instead of starting it over on top of them."""
    serve_in_process(_synthetic(tmp_path / "kept"), nodes=2)
    assert (tmp_path / "kept" / "run" / "checkpoint.npz").exists()
    cfg = _synthetic(tmp_path / "dropped", **{"keep-checkpoint": False})
    serve_in_process(cfg, nodes=2)
    run = tmp_path / "dropped" / "run"
    assert not (run / "checkpoint.npz").exists()
    assert (run / "summary.json").exists() and len((run / "metrics.csv").read_text().splitlines()) == 3
    before = (run / "metrics.csv").read_text()
    from protocol.keys import ConfigError

    with pytest.raises(ConfigError, match=r"holds a finished run \(summary.json\) and no checkpoint.npz \(keep-checkpoint"):
        serve_in_process({**cfg, "resume": True, "num-server-rounds": 3}, nodes=2)
    assert (run / "metrics.csv").read_text() == before


# ------------------------------------------------------------------ trackers from round 0
def test_the_trackers_log_round_0_the_initial_model(tmp_path, monkeypatch):
    """A run through the ServerApp's server: TensorBoard and MLflow get step 0, the initial
    model's test accuracy and loss as summary.json records them, then rounds 1 and 2 (before:
    their curves started at round 1 while the run's plots start at 0)."""
    import json

    mlflow = pytest.importorskip("mlflow")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    serve_in_process(_synthetic(tmp_path, tracking="tensorboard,mlflow"), nodes=2)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("test_accuracy")] == [0, 1, 2]
    assert events.Scalars("test_accuracy")[0].value == pytest.approx(summary["initial_accuracy"])
    assert events.Scalars("test_loss")[0].value == pytest.approx(summary["initial_loss"])
    client = mlflow.MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("fl-drift").experiment_id])
    history = client.get_metric_history(run.info.run_id, "test_accuracy")
    assert [m.step for m in history] == [0, 1, 2]
    assert history[0].value == pytest.approx(summary["initial_accuracy"])


# ------------------------------------------------------------------ the runner's output
def test_help_points_at_readme_sections_that_exist(capsys):
    """``--help`` names the README section it points at (``--ray-address``: 'On a Ray
    cluster'), and README has it (before: "see README", and no such section)."""
    import re

    from runner import cli
    from tests.kit import ROOT

    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    titles = re.findall(r"README: '([^']+)'", text)
    assert "On a Ray cluster" in titles and "see README" not in text, text
    headings = {line[3:].strip() for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("## ")}
    assert set(titles) <= headings, (titles, headings)


def test_quiet_prints_the_round_lines_and_errors_only(capsys):
    """``--quiet``: of a run's output, the per-round lines and fl-drift's errors; not the
    execution path and initial-model lines of its start-up (before: two such lines per run)."""
    import argparse

    from runner import sweep

    lines = ["\x1b[92mINFO \x1b[0m:      fl-drift: execution per-client (auto: per-client, no CUDA GPU: ...)",
             "\x1b[92mINFO \x1b[0m:      initial model: test accuracy 0.0250, loss 2.8092",
             "\x1b[92mINFO \x1b[0m:      round 1/2: test accuracy 0.2500, test loss 2.0049, clients 2, failures 0, 14.4s",
             "\x1b[92mINFO \x1b[0m:      [ROUND 2]",
             "\x1b[91mERROR \x1b[0m:     fl-drift: PartitionError: partition 3 of 4 (dirichlet) is empty",
             "\x1b[92mINFO \x1b[0m:      round 2/2: test accuracy 0.6750, test loss 1.5296, clients 2, failures 0, 0.2s"]
    on_line = sweep.progress_printer(argparse.Namespace(quiet=True, verbose=False), [])
    for line in lines:
        on_line(line)
    shown = capsys.readouterr().out.splitlines()
    assert [line.split(":", 1)[1].strip()[:20] for line in shown] == [
        "round 1/2: test accu", "fl-drift: PartitionE", "round 2/2: test accu"], shown


def test_check_gives_the_execution_reason_once(tmp_path, capsys):
    """``--check`` over four runs on one execution path: a line per run naming the path, and
    the path's reason once (before: the same ~150-character reason on every line)."""
    import run_simulation

    assert run_simulation.main(["--check", "--strategy", "fedavg,fedprox", "--dataset", "synthetic",
                                "--set", "model=logreg", "--seeds", "0", "1", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    runs = [line for line in out.splitlines() if line.startswith("ok: ")]
    paths = {line.rsplit("; ", 1)[1].rstrip(")") for line in runs}
    assert len(runs) == 4 and len(paths) == 1 and all("(to run; " in line for line in runs), out
    lead = f"{paths.pop()} (4 of 4 runs): "
    (why,) = [line[len(lead):] for line in out.splitlines() if line.startswith(lead)]
    assert len(why) > 40 and out.count(why) == 1, out


def test_the_runners_summary_shows_the_essential_columns(tmp_path, capsys):
    """The runner's closing table: method, seeds, final and best accuracy, the worst class's,
    the paired difference from FedAvg; 6 columns that fit a terminal, and where the full table is
    (before: comparison.md's 15 columns, printed whole, wrapping)."""
    import json

    from runner import sweep

    runs = {}
    for method, accs in (("fedavg", (0.60, 0.62)), ("fedprox", (0.64, 0.65))):
        for seed, acc in enumerate(accs):
            d = tmp_path / "runs" / f"{method}-seed{seed}"
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps({"final_accuracy": acc, "best_accuracy": acc, "rounds": 2,
                                                        "total_seconds": 9.0, "config": {"seed": seed}}))
            (d / "metrics.csv").write_text(f"round,test_accuracy,min_class_accuracy\n1,0.5,0.1\n2,{acc},0.2\n")
            runs.setdefault(method, []).append(d)
    assert sweep.report(sweep.Outcome(runs=runs), tmp_path) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert table[0] == ("| method | seeds | final accuracy | best accuracy | final min-class accuracy |"
                        " final − fedavg, paired (95% CI) |"), out
    assert len(table) == 4 and max(len(line) for line in table) <= 120, out
    assert table[3].startswith("| fedprox | 2 | 0.6450 ± 0.0071 | 0.6450 ± 0.0071 | 0.2000 ± 0.0000 | +0.0350"), out
    assert f"all columns (run time, cost, drift, client views) and their notes: {tmp_path / 'comparison.md'}" in out
    assert "MB per client per round" in (tmp_path / "comparison.md").read_text()  # the file keeps them all
