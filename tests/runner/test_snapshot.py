"""The app a sweep runs is frozen when the sweep starts (runner/snapshot.py): an edit of the
checkout during a sweep reaches none of its runs, and a run ships the app's packages only."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from flwr.cli.build import build_fab_from_disk

import run_simulation
from runner import sweep
from runner.launch import APP_DIR
from runner.snapshot import DIGEST_FILE, snapshot_app

APP_MODULE = "fl_app/server_app.py"


def tiny_app(folder: Path) -> Path:
    """A Flower app folder: pyproject.toml with fab-include, one module, one file it leaves out."""
    (folder / "pkg").mkdir(parents=True)
    (folder / "docs").mkdir()
    (folder / "pyproject.toml").write_text("""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "tiny"
version = "1.0.0"
dependencies = []

[tool.flwr.app]
publisher = "me"
fab-include = ["pkg/**/*.py"]

[tool.flwr.app.components]
serverapp = "pkg.app:server"
clientapp = "pkg.app:client"

[tool.flwr.app.config]
answer = 1
""")
    (folder / "pkg" / "app.py").write_text("VERSION = 1\n")
    (folder / "docs" / "notes.md").write_text("left out\n")
    return folder


def test_the_snapshot_is_what_a_run_ships_and_does_not_follow_later_edits(tmp_path):
    app = tiny_app(tmp_path / "app-src")
    folder, digest = snapshot_app(app, tmp_path / "out")
    assert folder == tmp_path / "out" / "app"
    assert digest == hashlib.sha256(build_fab_from_disk(app)).hexdigest()
    assert (folder / DIGEST_FILE).read_text().strip() == digest
    assert (folder / "pkg" / "app.py").read_text() == "VERSION = 1\n"
    assert not (folder / "docs").exists()  # not in fab-include: not shipped, not kept
    (app / "pkg" / "app.py").write_text("VERSION = 2\n")  # an edit while the sweep runs
    assert (folder / "pkg" / "app.py").read_text() == "VERSION = 1\n"
    # Flower packages the snapshot into the same files (the manifest aside)
    assert build_fab_from_disk(folder) == build_fab_from_disk(tiny_app(tmp_path / "again"))
    # a sweep started again replaces the snapshot with the checkout as it is then
    snapshot_app(app, tmp_path / "out")
    assert (folder / "pkg" / "app.py").read_text() == "VERSION = 2\n"


def test_a_run_ships_the_app_packages_only():
    folder_names = {name.split("/")[0] for name in shipped_names()}
    assert {"fl_app", "clients", "strategies", "tasks", "protocol"} <= folder_names
    assert not folder_names & {"docs", "tests", "bench", "scripts", "experiments", "runner"}


def shipped_names() -> list[str]:
    import io
    import zipfile

    return zipfile.ZipFile(io.BytesIO(build_fab_from_disk(APP_DIR))).namelist()


class RecordingSimulation:
    """Stands in for LocalSimulation: each run notes what its app folder's module says, and the
    first run edits the checkout's copy, as a developer might during a long sweep."""

    seen: list[str] = []
    source: Path

    def __init__(self, app_dir=None, ray_address=None, hold=()):
        self.app_dir, self.ray_resources, self.env = Path(app_dir), {}, {}

    def start(self):
        pass

    def close(self):
        pass

    def run(self, cfg, num_supernodes, cpus_per_client=1, gpus_per_client=0.0, on_line=None, timeout=None):
        RecordingSimulation.seen.append((self.app_dir / "pkg" / "app.py").read_text())
        (RecordingSimulation.source / "pkg" / "app.py").write_text("VERSION = 2\n")
        run_dir = Path(cfg["results-dir"]) / cfg["run-name"]
        (run_dir / "summary.json").write_text(json.dumps({
            "config": cfg, "rounds": 1, "final_accuracy": 0.5, "best_accuracy": 0.5, "total_seconds": 1.0}))
        return 0


def test_every_run_of_a_sweep_ships_the_app_as_it_was_when_the_sweep_started(tmp_path, monkeypatch, capsys):
    source = tiny_app(tmp_path / "checkout")
    monkeypatch.setattr(sweep, "APP_DIR", source)
    monkeypatch.setattr(sweep, "LocalSimulation", RecordingSimulation)
    RecordingSimulation.seen, RecordingSimulation.source = [], source
    out = tmp_path / "out"
    rc = run_simulation.main(["--strategy", "fedavg", "--dataset", "synthetic", "--set", "model=logreg",
                              "--set", "tracking=none", "--rounds", "1", "--clients", "2", "--seeds", "0", "1",
                              "--out", str(out), "--quiet", "--parallel", "1"])
    assert rc == 0, capsys.readouterr()
    assert RecordingSimulation.seen == ["VERSION = 1\n", "VERSION = 1\n"]
    assert (out / "app" / "pkg" / "app.py").read_text() == "VERSION = 1\n"
    assert f"every run ships {out / 'app'}" in capsys.readouterr().out


def git(folder: Path, *args: str) -> None:
    import subprocess

    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def test_the_revision_is_dirty_only_when_a_shipped_file_changed(tmp_path, monkeypatch):
    """``code_revision`` marks ``+dirty`` when a file the app ships (``fab-include``) differs from
    the commit, not when docs/ does: a sweep started while its results page is being rewritten
    ran the committed app."""
    from fl_app.server import provenance

    monkeypatch.delenv("FL_DRIFT_REVISION", raising=False)
    repo = tmp_path / "repo"
    (repo / "fl_app" / "server").mkdir(parents=True)
    (repo / "docs").mkdir()
    shutil.copy(provenance.__file__, repo / "fl_app" / "server" / "provenance.py")  # the checkout it trusts
    (repo / "fl_app" / "top.py").write_text("A = 1\n")
    (repo / "docs" / "results.md").write_text("old\n")
    (repo / "pyproject.toml").write_text('[tool.flwr.app]\nfab-include = ["fl_app/**/*.py"]\n')
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "x")
    clean = provenance.code_revision(repo)
    assert len(clean) == 40 and not clean.endswith("+dirty")
    (repo / "docs" / "results.md").write_text("new\n")
    assert provenance.code_revision(repo) == clean
    (repo / "fl_app" / "top.py").write_text("A = 2\n")  # a shipped file, at the package's top
    assert provenance.code_revision(repo) == clean + "+dirty"
    git(repo, "checkout", "--", "fl_app/top.py")
    (repo / "pyproject.toml").write_text('[tool.flwr.app]\nfab-include = ["fl_app/**/*.py", "docs/*.md"]\n')
    assert provenance.code_revision(repo) == clean + "+dirty"  # pyproject.toml ships too


def test_a_dirty_revision_names_the_package_the_sweep_ships(tmp_path, monkeypatch):
    """Two sweeps from two different uncommitted edits of one commit both read `<commit>+dirty`
    from git; the runner appends the digest of the package it froze, so their runs record two
    revisions. A clean commit is kept as it is."""
    from fl_app.server.provenance import with_app_digest

    source = tiny_app(tmp_path / "checkout")
    monkeypatch.setattr(sweep, "APP_DIR", source)
    recorded = []
    for version in (1, 2):
        (source / "pkg" / "app.py").write_text(f"VERSION = {version}\n")
        monkeypatch.setenv("FL_DRIFT_REVISION", "c" * 40 + "+dirty")
        app = sweep.snapshot(tmp_path / f"out{version}")
        digest = (app / "fab.sha256").read_text().strip()
        assert os.environ["FL_DRIFT_REVISION"] == "c" * 40 + "+dirty." + digest[:12]
        recorded.append(os.environ["FL_DRIFT_REVISION"])
    assert recorded[0] != recorded[1]
    monkeypatch.setenv("FL_DRIFT_REVISION", "c" * 40)
    sweep.snapshot(tmp_path / "out3")
    assert os.environ["FL_DRIFT_REVISION"] == "c" * 40
    assert with_app_digest("unknown", "f" * 64) == "unknown"
    assert with_app_digest(recorded[0], "f" * 64) == recorded[0]  # already exact: kept
