"""Issue 52 ("trust v3"), items 1, 3, 4, 9 and 10: a kept result is never lost by --collect,
and bad input (repeated seeds or grid values, an attack on a partition that does not exist,
labels outside the dataset's classes, no CPU per client) is refused in one line before
anything is launched. Every test here failed on the code before the fix (main fb2d34f)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT

SYNTH = ["--dataset", "synthetic", "--set", "model=logreg"]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "usage:" not in err
    return err


def load_make_results():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_results", ROOT / "scripts" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
