"""The app a sweep runs, frozen when the sweep starts.

``flwr run <app>`` packages the app folder (Flower's FAB) again for every run. A runner that
pointed each run at the checkout would let an edit made during a long sweep reach its later
runs, while every run records the revision taken when the sweep started (``FL_DRIFT_REVISION``,
``fl_app/server/provenance.py``): a table could mix two versions of the code under one name.

``snapshot_app`` packages the app once, with the same Flower function ``flwr run`` calls (so the
same files: ``fab-include`` in pyproject.toml), and unpacks it into a folder of the sweep's
results; every run of the sweep (the ``[tune]`` search and the table) is launched from that
folder. The folder stays beside the results as the code that made them, and is replaced when
the sweep is started again (``--resume``: the checkout as it is then, recorded again).
"""

from __future__ import annotations

import hashlib
import io
import shutil
import zipfile
from pathlib import Path

SNAPSHOT_FOLDER = "app"  # <out>/app
DIGEST_FILE = "fab.sha256"  # inside it: the digest of the packaged app, as Flower names the FAB by it


def snapshot_app(app_dir: Path, out: Path) -> tuple[Path, str]:
    """Package ``app_dir`` as ``flwr run`` would and unpack it into ``<out>/app`` (emptied
    first); returns that folder and the package's sha256. Raises ``ValueError`` (Flower's) when
    the app cannot be packaged, before any run."""
    from flwr.cli.build import build_fab_from_disk

    fab = build_fab_from_disk(Path(app_dir))
    digest = hashlib.sha256(fab).hexdigest()
    target = Path(out) / SNAPSHOT_FOLDER
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    with zipfile.ZipFile(io.BytesIO(fab)) as package:
        for name in package.namelist():
            if name.startswith(".info/"):  # Flower's manifest: rebuilt when a run packages the folder
                continue
            path = (target / name).resolve()
            if target.resolve() not in path.parents:
                raise ValueError(f"app package entry {name!r} points outside {target}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(package.read(name))
    (target / DIGEST_FILE).write_text(digest + "\n")
    return target, digest
