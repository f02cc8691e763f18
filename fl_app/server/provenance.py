"""What a result was made with: data source, number of clients, software versions, code revision.

``RecordingStrategy.write_summary`` adds ``run_facts`` to every ``summary.json``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def code_revision(where: Path | None = None) -> str:
    """The git commit of the code (``+dirty`` with uncommitted changes), else "unknown".

    ``$FL_DRIFT_REVISION`` wins: the runner sets it from its checkout. Flower runs the app from
    an installed copy without git metadata, so a plain ``flwr run`` looks in the working
    directory too (where the SuperLink was started), and trusts it only when its
    ``fl_app/server/provenance.py`` is this very file."""
    if os.environ.get("FL_DRIFT_REVISION"):
        return os.environ["FL_DRIFT_REVISION"]
    here = Path(__file__).resolve()
    inside = Path(*__name__.split(".")).with_suffix(".py")  # fl_app/server/provenance.py in a checkout
    candidates = [where] if where else [here.parents[len(inside.parts) - 1], Path.cwd()]
    for folder in candidates:
        mine = folder / inside
        try:
            if not mine.is_file() or mine.read_bytes() != here.read_bytes():
                continue
            top, commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "--show-toplevel", "HEAD"],
                                         capture_output=True, text=True, timeout=5, check=True).stdout.splitlines()
            if Path(top).resolve() != folder.resolve():  # an installed copy inside some other repository
                continue
            dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
        if commit:
            return f"{commit}+dirty" if dirty else commit
    return "unknown"


def software_versions() -> dict[str, str]:
    """Versions of the software that decides a run's numbers."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": sys.version.split()[0]}
    for name in ("flwr", "torch", "flwr-datasets", "numpy"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def data_source(cfg: dict) -> str:
    """Where the run's data came from: "synthetic", a local folder, or "hub:<id>"."""
    from tasks.catalogue import DATASETS
    from tasks.datasets import local_parquet_files, resolve_data_dir

    if cfg["dataset"] == "synthetic":
        return "synthetic"
    folder = resolve_data_dir(cfg["data-dir"])
    if local_parquet_files(cfg["dataset"], folder) is not None:
        return folder
    return f"hub:{DATASETS[cfg['dataset']].hub_id}"


def run_facts(cfg: dict, num_clients: int | None) -> dict:
    """The summary.json fields that make a result traceable."""
    return {
        "num_clients": num_clients,
        "data_source": data_source(cfg),
        "versions": software_versions(),
        "code_revision": code_revision(),
    }
