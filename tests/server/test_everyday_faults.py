"""A user's everyday faults between a run and its resume: a kill during a checkpoint write, a
truncated client-state file (a mirror's or a cohort node's journal's) before a resume, a results
disk that fills mid-run, and a run started anew in a folder an interrupted run left. Nothing kept
is lost, a resumed run equals the uninterrupted one, and a broken file a resume would read is
refused in one line before any round runs.

The runs are SCAFFOLD (server and client state) on synthetic data in one process
(``serve_in_process``, no Ray: tests/server/test_resume.py's reach). Ctrl-C and SIGTERM of the
runner, with Ray, are tests/runner/test_signals.py's.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fl_app.common import files
from fl_app.common.files import StateNotKept
from fl_app.common.run_files import read_metrics, read_summary
from fl_app.node.client_state import ClientStateMirror, RowsJournal, StateFileError, check_state_files
from fl_app.server.checkpoint import CHECKPOINT, Checkpoint, load_checkpoint, save_checkpoint
from tests.kit import ROOT, serve_in_process

NODES = 4
CFG = {"strategy": "scaffold", "dataset": "synthetic", "model": "logreg", "num-server-rounds": 6,
       "fraction-fit": 0.5, "learning-rate": 0.05, "tracking": "none"}


def without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if "seconds" not in k} for row in rows]


def leftovers(run_dir: Path) -> list[str]:
    """Temp files of ``fl_app.common.files.replacing`` left in the run folder."""
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.tmp"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[dict]:
    """The uninterrupted run's metrics.csv rows, less timings."""
    out = tmp_path_factory.mktemp("full")
    serve_in_process({**CFG, "results-dir": str(out), "run-name": "full"}, NODES)
    rows = read_metrics(out / "full")
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6]
    return without_timings(rows)


# ---- a kill during a checkpoint write -------------------------------------------------------------------

KILLED_MID_WRITE = """
import os, signal, sys
import numpy as np
from fl_app.server.checkpoint import Checkpoint, save_checkpoint
def half_then_killed(file, **arrays):
    file.write(b"PK\\x03\\x04 half a zip")
    file.flush()
    os.kill(os.getpid(), signal.SIGKILL)
np.savez = half_then_killed
save_checkpoint(sys.argv[1], Checkpoint(2, [np.zeros((2, 3), np.float32)], model="logreg"))
"""


def test_a_kill_during_a_checkpoint_write_leaves_the_old_checkpoint_and_the_next_write_clears_its_temp(tmp_path):
    """``kill -9`` while ``np.savez`` writes the round-2 checkpoint: the round-1 checkpoint is
    read back whole, the half-written temp file is never read, and the next checkpoint write
    replaces it (today's code holds: ``fl_app.common.files.replacing``)."""
    save_checkpoint(tmp_path, Checkpoint(1, [np.ones((2, 3), np.float32)], model="logreg"))
    before = (tmp_path / CHECKPOINT).read_bytes()
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path)], cwd=ROOT, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert killed.returncode == -9
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT, CHECKPOINT + ".tmp"]  # what the kill left
    assert (tmp_path / CHECKPOINT).read_bytes() == before
    ckpt = load_checkpoint(tmp_path, "logreg", [(2, 3)])
    assert ckpt.round == 1 and np.array_equal(ckpt.weights[0], np.ones((2, 3), np.float32))
    save_checkpoint(tmp_path, Checkpoint(2, [np.zeros((2, 3), np.float32)], model="logreg"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT]
    assert load_checkpoint(tmp_path, "logreg", [(2, 3)]).round == 2


def test_a_killed_writer_s_temp_file_is_never_read_as_client_state(tmp_path):
    """A journal or mirror file of round 3 half written when its client was killed is
    ``round-3.npz.tmp``: the readers see rounds 1 and 2 only (today's code holds)."""
    journal, mirror = RowsJournal(str(tmp_path), 0), ClientStateMirror(str(tmp_path), "partition-0")
    for r in (1, 2):
        journal.write(r, {0: {"c": [np.full(3, r, np.float32)]}}, keep_from=0)
        mirror.save(r, {"c": [np.full(3, r, np.float32)]}, keep_from=0)
    for folder in (journal.dir, mirror.dir):
        (folder / "round-3.npz.tmp").write_bytes(b"PK\x03\x04 half a zip")
    assert [r for r, _ in journal.files()] == [1, 2]
    assert_state(mirror.load(10), 2)
    check_state_files(tmp_path, tmp_path / CHECKPOINT, 10)


# ---- a truncated client-state file before a resume ------------------------------------------------------

def state_files(run_dir: Path) -> tuple[RowsJournal, ClientStateMirror]:
    """A cohort node's journal (rows of rounds 1-4, none pruned: each round another client) and a
    client's mirror (rounds 3 and 4 kept, 1-2 pruned) in ``run_dir``."""
    journal, mirror = RowsJournal(str(run_dir), 0), ClientStateMirror(str(run_dir), "partition-0")
    for r in (1, 2, 3, 4):
        journal.write(r, {r: {"c": [np.full(3, r, np.float32)]}}, keep_from=min(r, 3))
        mirror.save(r, {"c": [np.full(3, r, np.float32)]}, keep_from=min(r, 3))
    assert [r for r, _ in journal.files()] == [1, 2, 3, 4] and [r for r, _ in mirror._files()] == [3, 4]
    return journal, mirror


def assert_state(loaded: dict, r: int) -> None:
    """``loaded`` is what ``state_files`` saved in round ``r``."""
    assert list(loaded) == ["c"] and len(loaded["c"]) == 1
    np.testing.assert_array_equal(loaded["c"][0], np.full(3, r, np.float32))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("broken", ["client-rows/node-0/round-1.npz", "client-rows/node-0/round-3.npz",
                                    "client-state/partition-0/round-3.npz"])
def test_a_truncated_state_file_a_resume_reads_is_refused_in_one_line_naming_it(tmp_path, broken):
    """Fails on the old code (no check; the client found it, and failed every round it was
    sampled while the run went on without it: ``test_a_resume_over_a_truncated_mirror_...``)."""
    state_files(tmp_path)
    truncate(tmp_path / broken)
    with pytest.raises(StateFileError) as refused:
        check_state_files(tmp_path, tmp_path / CHECKPOINT, 3)
    text = str(refused.value)
    assert "\n" not in text
    assert text.startswith(f"client state {tmp_path / broken} is unreadable (truncated or corrupt: BadZipFile")
    assert f"{tmp_path / CHECKPOINT} (round 3) needs it" in text and "to start this run from round 1" in text


@pytest.mark.parametrize("broken", ["client-rows/node-0/round-4.npz", "client-state/partition-0/round-4.npz"])
def test_a_truncated_state_file_of_a_round_after_the_checkpoint_is_not_read(tmp_path, broken):
    """Round 4's files come after the round-3 checkpoint: the resumed run drops (journal) or
    rewrites (mirror) them, never reads them, so they do not stop it."""
    journal, mirror = state_files(tmp_path)
    truncate(tmp_path / broken)
    check_state_files(tmp_path, tmp_path / CHECKPOINT, 3)
    assert_state(mirror.load(3), 3)
    journal.drop_after(3)
    assert [r for r, _ in journal.files()] == [1, 2, 3]


def test_a_resume_over_a_truncated_mirror_is_refused_before_any_round_and_the_runner_refuses_it_too(
        tmp_path, uninterrupted):
    """A crash after round 3, then one client's mirror truncated. Before: the resume ran, that
    client failed with ``BadZipFile`` in each round it was sampled (rounds 4 and 5: one client
    of two), and the run finished with rows unlike the uninterrupted run's. Now the resume is
    refused in one line before any round (the ServerApp, and the runner's check before it
    launches), the rows kept as they were; with the checkpoint renamed as the line says, the run
    starts over from round 1 and equals the uninterrupted run."""
    from fl_app.api import check_checkpoints

    cfg = {**CFG, "results-dir": str(tmp_path), "run-name": "cut"}
    with pytest.raises(RuntimeError, match="injected crash after round 3"):
        serve_in_process({**cfg, "inject-faults": "crash-after:3"}, NODES)
    run_dir = tmp_path / "cut"
    newest = {p.parent.name: p for p in sorted(run_dir.glob("client-state/*/round-*.npz"))}
    broken = max(newest.values(), key=lambda p: p.name)  # a client's mirror of round 2 or 3
    truncate(broken)
    with pytest.raises(StateFileError, match=f"client state {broken} is unreadable"):
        serve_in_process({**cfg, "resume": True}, NODES)
    with pytest.raises(StateFileError, match=f"client state {broken} is unreadable"):
        check_checkpoints([cfg], tmp_path)
    assert without_timings(read_metrics(run_dir)) == uninterrupted[:3] and read_summary(run_dir) is None

    (run_dir / CHECKPOINT).rename(run_dir / (CHECKPOINT + ".bad"))
    serve_in_process({**cfg, "resume": True}, NODES)  # no checkpoint: from round 1
    assert without_timings(read_metrics(run_dir)) == uninterrupted


def test_a_run_started_anew_in_an_interrupted_run_s_folder_never_reads_that_run_s_client_state(
        tmp_path, uninterrupted):
    """An interrupted run of another seed left its clients' mirrors in the folder; the run
    started there anew (no resume) must equal the uninterrupted run. Fails on the old code: a
    client first sampled after round 1 took the earlier run's mirror as its own state."""
    cfg = {**CFG, "results-dir": str(tmp_path), "run-name": "cut"}
    with pytest.raises(RuntimeError, match="injected crash after round 1"):  # partitions 1 and 2 trained
        serve_in_process({**cfg, "seed": 1, "inject-faults": "crash-after:1"}, NODES)
    assert list((tmp_path / "cut").glob("client-state/partition-1/round-1.npz"))  # seed 0 samples it in round 2
    serve_in_process(cfg, NODES)
    assert without_timings(read_metrics(tmp_path / "cut")) == uninterrupted


# ---- a results disk that fills mid-run ------------------------------------------------------------------

class FullDisk:
    """The results disk filling up: the ``nth`` write of a file named ``name`` through
    ``fl_app.common.files.replacing`` (every record, checkpoint and state file) and every write
    after it write half their bytes, then fail with ENOSPC, as a full disk's writes do."""

    def __init__(self, name: str, nth: int):
        self.name, self.nth, self.full = name, nth, False
        self.open = open

    def __call__(self, tmp, mode="r", newline=None):
        target = Path(tmp).name.removesuffix(".tmp")
        if target == self.name:
            self.nth -= 1
            self.full = self.full or self.nth == 0
        f = self.open(tmp, mode, newline=newline)
        return FullFile(f) if self.full else f


class FullFile:
    def __init__(self, f):
        self.f = f

    def write(self, data):
        self.f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)


@pytest.mark.parametrize("name, nth, error, kept_rows", [
    ("metrics.csv", 3, OSError, 2),  # round 3's row: the run stops, rows 1-2 and the round-2 checkpoint kept
    (CHECKPOINT, 3, OSError, 3),  # round 3's checkpoint: row 3 kept, the checkpoint of round 2
    ("round-3.npz", 1, StateNotKept, 2),  # a client's mirror in round 3: the run stops before recording it
], ids=["metrics", "checkpoint", "client-state"])
def test_a_disk_that_fills_mid_run_loses_nothing_kept_and_the_resume_equals_the_uninterrupted_run(
        tmp_path, monkeypatch, uninterrupted, name, nth, error, kept_rows):
    """The metrics and checkpoint cases held on the old code (atomic writes, rows past the
    checkpoint rewritten on resume). The client-state case failed: the client's failed write was
    one failed client, round 3 was aggregated without it and the run went on to round 6 with rows
    unlike the uninterrupted run's; now it stops the run (``StateNotKept``) in one line naming the
    file and the fix."""
    cfg = {**CFG, "results-dir": str(tmp_path), "run-name": "cut"}
    disk = FullDisk(name, nth)
    monkeypatch.setattr(files, "open", disk, raising=False)
    with pytest.raises(error) as stopped:
        serve_in_process(cfg, NODES)
    run_dir = tmp_path / "cut"
    if error is StateNotKept:
        text = str(stopped.value)
        assert "\n" not in text and text.startswith("round 3: client state not kept: partition-")
        assert f"/round-3.npz: {os.strerror(errno.ENOSPC)}" in text and "checkpoint (round 2) is kept" in text
    else:
        assert stopped.value.filename == str(run_dir / name) and stopped.value.errno == errno.ENOSPC
    monkeypatch.undo()  # room on the disk again
    assert leftovers(run_dir) == []
    assert without_timings(read_metrics(run_dir)) == uninterrupted[:kept_rows]
    assert load_checkpoint(run_dir).round == 2 and read_summary(run_dir) is None

    serve_in_process({**cfg, "resume": True}, NODES)
    assert without_timings(read_metrics(run_dir)) == uninterrupted
    assert read_summary(run_dir)["rounds"] == 6
