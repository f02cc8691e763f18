"""Results never mix data: every run records a fingerprint of what it trained and
tested on (``fl_app/server/provenance.py``), and ``scripts/make_results.py --collect``, the
report and the runner's re-run and ``--resume`` checks refuse to put two fingerprints in one
table. Runs made before fingerprints existed are labelled, never guessed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from fl_app.common.run_files import read_metrics
from fl_app.config import ConfigError
from fl_app.registry import validate_config
from fl_app.server import provenance
from fl_app.server.provenance import data_fingerprint
from runner import checks, cli, sweep
from tasks.partition_spec import PartitionSpec
from tests.kit_runs import load_make_results


def data_folder(where: Path, train: bytes, test: bytes = b"the test split", stamp: int = 1) -> Path:
    """A data folder holding mnist/{train,test}.parquet with these bytes (the fingerprint hashes
    the files as they are; nothing here parses them). ``stamp`` sets both files' mtime."""
    (where / "mnist").mkdir(parents=True, exist_ok=True)
    for split, content in (("train", train), ("test", test)):
        path = where / "mnist" / f"{split}.parquet"
        path.write_bytes(content)
        os.utime(path, ns=(stamp * 10**9, stamp * 10**9))
    return where


def mnist_cfg(data: Path, **keys) -> dict:
    return validate_config({"strategy": "fedavg", "dataset": "mnist", "model": "cnn-small", "data-dir": str(data),
                            **keys})


# ---- the fingerprint ---------------------------------------------------------------------------------

def test_fingerprint_of_local_files_is_their_size_and_sha256_and_the_partition(tmp_path):
    data = data_folder(tmp_path / "a", b"x" * 6000, b"t" * 100)
    fp = data_fingerprint(mnist_cfg(data, alpha=0.5), 10)
    assert fp["train"] == {"source": "local parquet", "bytes": 6000, "sha256": hashlib.sha256(b"x" * 6000).hexdigest()}
    assert fp["test"] == {"source": "local parquet", "bytes": 100, "sha256": hashlib.sha256(b"t" * 100).hexdigest()}
    assert fp["partition"] == {"num-partitions": 10, "partitioner": "dirichlet", "alpha": 0.5,
                               "min-partition-size": 10, "client-test-fraction": 0.0}
    assert fp["dataset"] == "mnist" and fp["seed"] == 0 and len(fp["digest"]) == 12
    assert fp["digest"] == provenance.fingerprint_digest(fp)
    moved = shutil.copytree(data, tmp_path / "elsewhere")  # a path is not data: same files, same digest
    assert data_fingerprint(mnist_cfg(moved, alpha=0.5), 10)["digest"] == fp["digest"]
    assert data_fingerprint(mnist_cfg(data, alpha=0.5, seed=3), 10)["digest"] == fp["digest"]  # seeds share a table
    for other in (data_fingerprint(mnist_cfg(data, alpha=0.3), 10), data_fingerprint(mnist_cfg(data, alpha=0.5), 20),
                  data_fingerprint(mnist_cfg(data, alpha=0.5, **{"client-test-fraction": 0.2}), 10)):
        assert other["digest"] != fp["digest"]
    data_folder(data, b"y" * 6000, b"t" * 100, stamp=2)  # same size, other content, same path
    assert data_fingerprint(mnist_cfg(data, alpha=0.5), 10)["digest"] != fp["digest"]


def test_partition_identity_holds_only_the_keys_its_partitioner_reads():
    base = dict(dataset="mnist", num_partitions=10, seed=1)
    assert PartitionSpec(**base, partitioner="iid", alpha=0.1).identity() == \
        PartitionSpec(**base, partitioner="iid", alpha=9.0).identity() == \
        {"dataset": "mnist", "num-partitions": 10, "seed": 1, "partitioner": "iid"}
    assert PartitionSpec(**base, partitioner="shard", shards_per_client=3).identity()["shards-per-client"] == 3
    synthetic = PartitionSpec(dataset="synthetic", num_partitions=5, synthetic_alpha=0.5).identity()
    assert synthetic == {"dataset": "synthetic", "num-partitions": 5, "seed": 0, "synthetic-alpha": 0.5,
                         "synthetic-beta": 1.0}


def cache_hub_dataset(cache: Path, hub_id: str, commit: str, rows: int) -> None:
    """What ``datasets`` leaves in its cache after loading ``hub_id`` at ``commit``: its own
    parquet builder, given the repository and commit as the hub loader gives them, writes the
    split files and dataset_info.json under <owner>___<name>/<config>/<version>/<commit>/."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.packaged_modules.parquet.parquet import Parquet

    source = cache.parent / f"source-{commit[:4]}.parquet"
    pq.write_table(pa.table({"label": list(range(rows))}), source)
    Parquet(cache_dir=str(cache), repo_id=hub_id, dataset_name=hub_id.split("/")[1], config_name="mnist",
            hash=commit, data_files={"train": str(source), "test": str(source)}).download_and_prepare()


def test_fingerprint_of_a_hub_dataset_is_its_id_revision_and_rows_from_the_cache(tmp_path, monkeypatch):
    """No data folder: the hub id, the one revision in datasets' cache and its rows per split,
    read without any network; with two cached revisions the revision is not guessed."""
    from datasets import config

    monkeypatch.delenv("FL_DATA_DIR", raising=False)
    monkeypatch.setattr(config, "HF_DATASETS_CACHE", tmp_path / "cache")
    cfg = validate_config({"strategy": "fedavg", "dataset": "mnist", "model": "cnn-small"})
    nothing = data_fingerprint(cfg, 10)  # never loaded here: known by its id alone
    assert nothing["train"] == {"source": "hub", "id": "ylecun/mnist", "revision": None, "split": "train",
                                "rows": None}
    cache_hub_dataset(tmp_path / "cache", "ylecun/mnist", "a" * 40, 5)
    fp = data_fingerprint(cfg, 10)
    assert fp["train"] == {"source": "hub", "id": "ylecun/mnist", "revision": "a" * 40, "split": "train", "rows": 5}
    assert fp["test"]["split"] == "test" and fp["test"]["revision"] == "a" * 40
    assert fp["digest"] != nothing["digest"]
    cache_hub_dataset(tmp_path / "cache", "ylecun/mnist", "b" * 40, 5)
    two = data_fingerprint(cfg, 10)["train"]
    assert two["revision"] is None and two["cached"] == ["a" * 40, "b" * 40]


# ---- a real run records it ----------------------------------------------------------------------------

def test_a_run_records_its_fingerprint_and_refuses_to_resume_on_other_data(mnist_sample, tmp_path):
    """A real run (ServerApp and ClientApp in one process, 2 nodes, 300 MNIST images) writes the
    fingerprint of the files it read into data-fingerprint.json and summary.json; continued from
    its checkpoint after its training file changed, it stops with DataChanged."""
    from tests.kit import serve_in_process

    data = Path(shutil.copytree(mnist_sample(300, 100), tmp_path / "data"))
    cfg = {"strategy": "fedavg", "dataset": "mnist", "model": "cnn-small", "data-dir": str(data),
           "num-server-rounds": 2, "fraction-fit": 1.0, "tracking": "none", "results-dir": str(tmp_path / "r"),
           "run-name": "run", "partitioner": "iid"}
    serve_in_process(cfg, 2)
    summary = json.loads((tmp_path / "r" / "run" / "summary.json").read_text())
    fp = summary["data_fingerprint"]
    train = data / "mnist" / "train.parquet"
    assert fp["train"]["sha256"] == hashlib.sha256(train.read_bytes()).hexdigest()
    assert fp["train"]["bytes"] == train.stat().st_size and fp["partition"]["num-partitions"] == 2
    assert fp == json.loads((tmp_path / "r" / "run" / "data-fingerprint.json").read_text())
    assert fp == data_fingerprint(validate_config(cfg), 2)

    with pytest.raises(RuntimeError, match="injected crash after round 1"):
        serve_in_process({**cfg, "run-name": "cut", "inject-faults": "crash-after:1"}, 2)
    shutil.copy(mnist_sample(200, 100) / "mnist" / "train.parquet", train)  # other images, same folder
    with pytest.raises(provenance.DataChanged, match=rf"started on data {fp['digest']} and would continue on data"):
        serve_in_process({**cfg, "run-name": "cut", "resume": True}, 2)
    assert not (tmp_path / "r" / "cut" / "summary.json").exists()

    # a fresh run (not resumed) in that folder starts anew: it records the data it read now
    serve_in_process({**cfg, "run-name": "cut"}, 2)
    fresh = json.loads((tmp_path / "r" / "cut" / "data-fingerprint.json").read_text())
    assert fresh["digest"] != fp["digest"] and fresh == json.loads((tmp_path / "r" / "cut" / "summary.json").read_text())["data_fingerprint"]


def cut_run(mnist_sample, tmp_path, name: str) -> tuple[dict, Path, Path]:
    """A 3-round run on a copy of 300 MNIST images (2 nodes) that crashed after round 1: its
    config, data folder and run folder."""
    from tests.kit import serve_in_process

    data = Path(shutil.copytree(mnist_sample(300, 100), tmp_path / f"data-{name}"))
    cfg = {"strategy": "fedavg", "dataset": "mnist", "model": "cnn-small", "data-dir": str(data),
           "num-server-rounds": 3, "fraction-fit": 1.0, "tracking": "none", "results-dir": str(tmp_path / "r"),
           "run-name": name, "partitioner": "iid"}
    with pytest.raises(RuntimeError, match="injected crash after round 1"):
        serve_in_process({**cfg, "inject-faults": "crash-after:1"}, 2)
    return cfg, data, tmp_path / "r" / name


def test_the_checkpoint_carries_the_fingerprint_so_a_deleted_file_does_not_let_other_data_in(mnist_sample, tmp_path):
    """Data swapped in place after round 1, data-fingerprint.json deleted, resume: without the
    fingerprint in the checkpoint, rounds 2-3 would train on the other data (rc 0). The checkpoint
    (hashed) carries the fingerprint:
    the server refuses in one line naming both digests, so does the runner before any launch."""
    from fl_app.server.checkpoint import load_checkpoint
    from tests.kit import serve_in_process

    cfg, data, run = cut_run(mnist_sample, tmp_path, "cut")
    before = json.loads((run / "data-fingerprint.json").read_text())
    (run / "data-fingerprint.json").unlink()
    shutil.copy(mnist_sample(200, 100) / "mnist" / "train.parquet", data / "mnist" / "train.parquet")
    now = data_fingerprint(validate_config(cfg), 2)["digest"]
    assert now != before["digest"]
    with pytest.raises(provenance.DataChanged) as refused:
        serve_in_process({**cfg, "resume": True}, 2)
    line = str(refused.value)
    assert "\n" not in line and f"started on data {before['digest']} and would continue on data {now}" in line
    assert "its checkpoint" in line
    assert len(read_metrics(run)) == 1 and not (run / "summary.json").exists()  # nothing trained on it
    assert load_checkpoint(run).data_fingerprint == before  # inside the checkpoint, under its SHA-256
    refusal = checks.changed_data(run, validate_config(cfg), 2)
    assert f"was run on data {before['digest']} (" in refusal and f"but the data asked for now is {now} (" in refusal


def test_a_checkpoint_without_a_fingerprint_resumes_only_when_the_file_agrees(mnist_sample, tmp_path):
    """A checkpoint written before checkpoints carried the fingerprint: resumed when
    data-fingerprint.json is there and agrees (its next checkpoints then carry it), refused in
    one line when the file is missing (the data it started on is unknown), by the server and by
    the runner's check."""
    from fl_app.server.checkpoint import load_checkpoint, save_checkpoint
    from tests.kit import serve_in_process

    cfg, _, run = cut_run(mnist_sample, tmp_path, "old")
    old = load_checkpoint(run)
    old.data_fingerprint = None  # as a checkpoint without a fingerprint is read
    save_checkpoint(run, old)
    kept = (run / "data-fingerprint.json").read_text()
    (run / "data-fingerprint.json").unlink()
    with pytest.raises(provenance.DataChanged) as refused:
        serve_in_process({**cfg, "resume": True}, 2)
    line = str(refused.value)
    assert "\n" not in line and "its checkpoint carries no data fingerprint" in line
    assert "data-fingerprint.json is missing" in line and len(read_metrics(run)) == 1
    assert "carries no data fingerprint" in checks.changed_data(run, validate_config(cfg), 2)

    (run / "data-fingerprint.json").write_text(kept)  # the file agrees with the data: resumed
    assert checks.changed_data(run, validate_config(cfg), 2) is None
    with pytest.raises(RuntimeError, match="injected crash after round 2"):
        serve_in_process({**cfg, "resume": True, "inject-faults": "crash-after:2"}, 2)
    assert load_checkpoint(run).data_fingerprint == json.loads(kept)  # carried from now on
    serve_in_process({**cfg, "resume": True}, 2)
    assert json.loads((run / "summary.json").read_text())["data_fingerprint"] == json.loads(kept)


def test_the_fingerprint_is_under_the_checkpoints_sha256(tmp_path):
    """An edited fingerprint inside the checkpoint is refused like any altered array."""
    import io
    import zipfile

    from fl_app.server.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint

    fp = {"dataset": "mnist", "digest": "0123456789ab"}
    path = save_checkpoint(tmp_path, Checkpoint(1, [np.zeros(3, np.float32)], data_fingerprint=fp))
    assert load_checkpoint(tmp_path).data_fingerprint == fp
    good = path.read_bytes()
    with zipfile.ZipFile(path, "w") as out, zipfile.ZipFile(io.BytesIO(good)) as src:
        for item in src.namelist():  # the same archive, another digest in the fingerprint
            data = src.read(item)
            out.writestr(item, data.replace(b"0123456789ab", b"ba9876543210") if "fingerprint" in item else data)
    with pytest.raises(CheckpointError, match="does not match its recorded SHA-256"):
        load_checkpoint(tmp_path)


def test_a_simulated_run_records_the_fingerprint_the_runner_expects(simulated, request):
    """Through Flower's Ray simulation (the shared fedavg run of tests/runner/test_simulation.py): the
    server's fingerprint has the partitions the nodes reported, so re-running the runner's
    command on the same data keeps the run (``changed_data`` finds no change)."""
    from tests.kit_runs import SUPERNODES, simulated_config

    cfg = simulated_config("fedavg", request)
    run = simulated("fedavg", cfg, SUPERNODES)
    assert run.rc == 0, "\n".join(run.lines[-30:])
    recorded = json.loads((run.run_dir / "summary.json").read_text())["data_fingerprint"]
    assert recorded == data_fingerprint(validate_config(cfg), SUPERNODES)
    assert recorded["partition"]["num-partitions"] == SUPERNODES
    assert checks.changed_data(run.run_dir, validate_config(cfg), SUPERNODES) is None


# ---- --collect and the report -------------------------------------------------------------------------

SUBSET = """
name = "subset"
strategies = ["fedavg"]
seeds = [0, 1]
clients = 10
[run-config]
dataset = "mnist"
model = "cnn-small"
num-server-rounds = 2
"""


def finished_run(runs: Path, seed: int, accuracy: float, data: Path | None) -> Path:
    """A finished run of SUBSET as the server writes it; ``data`` None: a run made before
    fingerprints were recorded (no data_fingerprint)."""
    cfg = mnist_cfg(data or Path("/gone"), seed=seed, **{"num-server-rounds": 2})
    d = runs / f"fedavg-seed{seed}"
    d.mkdir(parents=True)
    (d / "metrics.csv").write_text(f"round,test_accuracy\n1,0.1\n2,{accuracy}\n")
    summary = {"config": cfg, "rounds": 2, "final_accuracy": accuracy, "best_accuracy": accuracy,
               "final_loss": 1.0, "total_seconds": 1.0, "stopped": None, "num_clients": 10}
    if data is not None:
        summary["data_fingerprint"] = data_fingerprint(cfg, 10)
    (d / "summary.json").write_text(json.dumps(summary))
    return d


@pytest.fixture
def subset(tmp_path):
    exps = tmp_path / "experiments"
    exps.mkdir()
    (exps / "subset.toml").write_text(SUBSET)
    big = data_folder(tmp_path / "six-thousand", b"6000 images" * 100)
    small = data_folder(tmp_path / "six-hundred", b"600 images" * 10)
    argv = ["--experiments", str(exps), "--results", str(tmp_path / "store"), "--collect", str(tmp_path / "results"),
            "--out", str(tmp_path / "docs" / "results.md")]
    return argv, tmp_path / "results" / "subset" / "runs", big, small


def test_collect_refuses_runs_on_two_data_sets_in_one_line(subset, tmp_path, capsys):
    """Seed 0 on a 6,000-image subset and seed 1 on a 600-image one are refused in one line, never
    averaged into one row (which would read 0.664 +- 0.265, exit 0)."""
    argv, runs, big, small = subset
    finished_run(runs, 0, 0.851, big)
    finished_run(runs, 1, 0.477, small)
    assert load_make_results().main(argv) == 2
    err = capsys.readouterr().err
    digests = [data_fingerprint(mnist_cfg(d), 10)["digest"] for d in (big, small)]
    assert err.count("\n") == 1 and "--collect refused: experiment subset:" in err
    assert all(d in err for d in digests) and "subset/fedavg-seed0" in err and "subset/fedavg-seed1" in err
    assert not (tmp_path / "store").exists() and not (tmp_path / "docs").exists()  # nothing written


def test_collect_refuses_a_run_on_other_data_than_the_kept_runs_of_its_table(subset, tmp_path, capsys):
    argv, runs, big, small = subset
    finished_run(runs, 0, 0.851, big)
    mr = load_make_results()
    assert mr.main(argv) == 0
    shutil.rmtree(runs)
    finished_run(runs, 1, 0.477, small)  # seed 1 arrives later, on other data
    assert mr.main(argv) == 2
    err = capsys.readouterr().err
    assert "subset/fedavg-seed1 on data" in err and "subset/fedavg-seed0 (kept) on data" in err
    assert not (tmp_path / "store" / "subset" / "fedavg-seed1").exists()
    finished_run(runs.parent / "again", 0, 0.5, small)  # replacing seed 0 too: one data set again
    shutil.move(runs.parent / "again" / "fedavg-seed0", runs / "fedavg-seed0")
    assert mr.main(argv) == 0


def test_runs_that_all_lack_a_fingerprint_are_labelled_and_still_collect(subset, tmp_path, capsys):
    argv, runs, _, _ = subset
    finished_run(runs, 0, 0.851, None)  # made before fingerprints: not guessed to match or differ
    finished_run(runs, 1, 0.477, None)
    assert load_make_results().main(argv) == 0
    text = (tmp_path / "docs" / "results.md").read_text()
    assert "data fingerprint not recorded (2 runs," in text and "fingerprint `" not in text
    assert "0.6640 ± 0.2645" in text  # both seeds in the row: one (unknown) data set


def test_a_run_without_a_fingerprint_beside_one_with_is_refused_in_one_line(subset, tmp_path, capsys):
    """A run whose data is unknown is never averaged with one whose data is known (which would
    read as, say, 0.6640 +- 0.2645 over 2 seeds, with only a text line saying one fingerprint was
    not recorded): refused by --collect and by the report, in one line naming the runs."""
    argv, runs, big, _ = subset
    finished_run(runs, 0, 0.851, big)
    finished_run(runs, 1, 0.477, None)
    mr = load_make_results()
    assert mr.main(argv) == 2
    err = capsys.readouterr().err
    digest = data_fingerprint(mnist_cfg(big), 10)["digest"]
    assert err.count("\n") == 1 and "--collect refused: experiment subset:" in err
    assert f"subset/fedavg-seed0 on data {digest} (" in err
    assert "but subset/fedavg-seed1 without a data fingerprint (data unknown" in err
    assert not (tmp_path / "store").exists() and not (tmp_path / "docs").exists()  # nothing written

    store = tmp_path / "store" / "subset"  # the same two runs already in the store: the report refuses
    shutil.copytree(runs, store)
    assert mr.main(argv[:4] + argv[6:]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the kept runs mix two data sets: experiment subset: fedavg-seed0 on data" in err
    assert "but fedavg-seed1 without a data fingerprint" in err and not (tmp_path / "docs").exists()


def test_the_runners_comparison_splits_a_row_whose_runs_differ_in_data(tmp_path, capsys):
    """The runner's comparison.md/csv (``runner.sweep.report``): a row whose kept runs were made
    on other data, or on unknown data beside known, is split into one row per data set, never
    averaged, with one line naming the runs."""
    from runner.results.report import compare

    big = data_folder(tmp_path / "six-thousand", b"6000 images" * 100)
    small = data_folder(tmp_path / "six-hundred", b"600 images" * 10)
    runs = tmp_path / "runs"
    known, unknown = finished_run(runs, 0, 0.851, big), finished_run(runs, 1, 0.477, None)
    other = finished_run(runs, 2, 0.3, small)
    outcome = sweep.Outcome(runs={"fedavg": [known, unknown], "scaffold": [known, other]})
    assert sweep.report(outcome, tmp_path / "out") == 0
    digest, small_digest = (data_fingerprint(mnist_cfg(d), 10)["digest"] for d in (big, small))
    table = {r["method"]: r for r in compare(outcome.runs)}
    assert list(table) == [f"fedavg [data {digest}]", "fedavg [data unknown]", f"scaffold [data {digest}]",
                           f"scaffold [data {small_digest}]"]
    assert [r["seeds"] for r in table.values()] == [1, 1, 1, 1]
    assert table["fedavg [data unknown]"]["final_accuracy_mean"] == 0.477  # not averaged with 0.851
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "**Warning: rows split by data**" in md and "0.6640" not in md
    line = next(x for x in md.splitlines() if x.startswith(f"- fedavg [data {digest}], fedavg [data unknown]:"))
    assert f"fedavg split by data: fedavg-seed0 on data {digest} (" in line
    assert "but fedavg-seed1 without a data fingerprint (data unknown" in line
    assert f"but fedavg-seed2 on data {small_digest} (" in md
    csv_text = (tmp_path / "out" / "comparison.csv").read_text()
    assert f"fedavg [data {digest}]" in csv_text and "scaffold [data unknown]" not in csv_text


def test_the_report_refuses_a_store_that_mixes_data(subset, tmp_path, capsys):
    argv, _, big, small = subset
    store = tmp_path / "store" / "subset"
    finished_run(store, 0, 0.851, big)
    finished_run(store, 1, 0.477, small)
    assert load_make_results().main(argv[:4] + argv[6:]) == 2  # no --collect
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the kept runs mix two data sets: experiment subset: fedavg-seed0" in err
    assert not (tmp_path / "docs").exists()


def test_collect_from_a_folder_that_does_not_exist_is_refused(subset, tmp_path, capsys):
    argv, *_ = subset
    argv[argv.index("--collect") + 1] = str(tmp_path / "no-such-folder")
    assert load_make_results().main(argv) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-folder: no such folder" in err
    assert not (tmp_path / "store").exists() and not (tmp_path / "docs").exists()


# ---- the runner: re-run and --resume ------------------------------------------------------------------

def test_resume_refuses_runs_made_on_other_data_in_the_same_folder(mnist_sample, tmp_path):
    """--resume (and re-running the same command) keeps finished runs and continues started ones:
    with other files in the same data folder that would mix two data sets, which the data-dir
    path cannot tell. Refused, naming the run and both fingerprints."""
    data = Path(shutil.copytree(mnist_sample(300, 100), tmp_path / "data"))
    out = tmp_path / "out"
    args = cli.parse_args(["--dataset", "mnist", "--set", "model=cnn-small", "--clients", "2",
                                      "--rounds", "1", "--seeds", "0", "1", "--data-dir", str(data), "--out", str(out)])
    configs = checks.validate(args, out / "runs")
    out.mkdir()
    (out / "runner.json").write_text(json.dumps(cli.runner_record(args)))
    finished = out / "runs" / "fedavg-seed0"
    finished.mkdir(parents=True)
    cfg = validate_config(configs[0][2])
    (finished / "summary.json").write_text(json.dumps({"config": cfg, "data_fingerprint": data_fingerprint(cfg, 2)}))
    started = out / "runs" / "fedavg-seed1"  # started, checkpointed, not finished
    started.mkdir()
    cfg1 = validate_config(configs[1][2])
    (started / "run-config.json").write_text(json.dumps(cfg1))
    provenance.record_fingerprint(started, cfg1, 2)
    resumed = cli.parse_args(["--resume", str(out)])
    checks.validate(resumed, out / "runs")  # same data: accepted
    before = data_fingerprint(cfg, 2)["digest"]

    shutil.copy(mnist_sample(200, 100) / "mnist" / "train.parquet", data / "mnist" / "train.parquet")
    with pytest.raises(ConfigError) as refused:
        checks.validate(resumed, out / "runs")
    lines = str(refused.value).splitlines()
    now = data_fingerprint(cfg, 2)["digest"]
    for run in (finished, started):
        line = next(x for x in lines if x.strip().startswith(str(run)))
        assert f"was run on data {before} (" in line and f"but the data asked for now is {now} (" in line
