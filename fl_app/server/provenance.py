"""What a result was made with: data source, number of clients, software versions, code revision,
and a fingerprint of the data it trained and tested on.

``RunRecorder.write_summary`` (fl_app/server/recording.py) adds ``run_facts`` and ``data_fingerprint`` to every
``summary.json``; the fingerprint is also written when a run starts (``record_fingerprint``) and
carried inside every checkpoint, which a resume checks against the data it reads now
(``resumed_fingerprint``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from fl_app.common.files import atomic_write_text
from fl_app.common.run_files import FINGERPRINT_FILE
from protocol.keys import ConfigError


def code_revision(where: Path | None = None) -> str:
    """The git commit of the code (``+dirty`` when a file the app ships differs from it), else
    "unknown". The files the app ships are those ``fab-include`` in pyproject.toml names (all
    tracked files without it): an edit of docs/ or experiments/ changes no run, so it makes no
    run ``+dirty``.

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
            dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no",
                                    "--", *shipped_pathspecs(folder)],
                                   capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
        if commit:
            return f"{commit}+dirty" if dirty else commit
    return "unknown"


def with_app_digest(revision: str, digest: str) -> str:
    """``revision`` made exact by the sha256 of the app package a sweep ships
    (``runner/snapshot.py``): a ``+dirty`` commit does not say which code ran (two different
    uncommitted edits read alike, so a table mixing them would look like one code), so its first
    12 hex digits are appended, '<commit>+dirty.<digest12>'. A clean commit already names the
    code and "unknown" stays as it is; both are returned unchanged, as is a revision already
    carrying a digest."""
    return f"{revision}.{digest[:12]}" if revision.endswith("+dirty") else revision


def shipped_pathspecs(folder: Path) -> list[str]:
    """Git pathspecs of the files a run ships: pyproject.toml and its ``fab-include`` patterns
    (Flower's FAB), or every file when the app names none."""
    import tomllib

    try:
        app = tomllib.loads((folder / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    except (OSError, ValueError, KeyError, TypeError):
        return ["."]
    patterns = app.get("fab-include") if isinstance(app, dict) else None
    if not isinstance(patterns, list) or not patterns:
        return ["."]
    return ["pyproject.toml", *(f":(glob){p.lstrip('/')}" for p in patterns if isinstance(p, str))]


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


# ----------------------------------------------------------------------------- data fingerprint
DIGEST_CHARS = 12


class DataChanged(ConfigError):
    """A run is continued on other data than it started on, or on data that cannot be shown to
    be the same (no fingerprint recorded)."""


def file_identity(path: str) -> dict:
    """``{"bytes": size, "sha256": hex}`` of one file. The hash is computed once per process
    and file version (path, size, modification time): CIFAR-10's two parquet files (55.6 MB)
    take about 0.1 s, MNIST's (17.8 MB) about 0.02 s, from the page cache."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return {"bytes": stat.st_size, "sha256": _sha256(str(resolved), stat.st_size, stat.st_mtime_ns)}


@functools.lru_cache(maxsize=16)
def _sha256(path: str, _size: int, _mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def hub_identity(hub_id: str) -> tuple[dict, dict]:
    """(train, test) identity of a hub dataset: id, revision and rows of each split, read from
    the ``datasets`` cache alone (nothing is downloaded or loaded: a fingerprint never waits for
    the network). ``datasets`` (4.x) keeps a hub dataset it loaded under
    ``<HF_DATASETS_CACHE>/<owner>___<name>/<config>/<version>/<commit>/`` (the builder's
    ``hash`` is the repository's commit, also when loaded offline from that cache) with its
    ``dataset_info.json`` (rows per split). The revision is that commit when exactly one is
    cached; with none or several it is None (and ``cached`` lists them) rather than a guess."""
    from datasets import config

    root = Path(config.HF_DATASETS_CACHE) / hub_id.replace("/", "___")
    folders = sorted(p for p in root.glob("*/*/*") if p.is_dir() and re.fullmatch(r"[0-9a-f]{40}", p.name))
    commits = sorted({p.name for p in folders})
    revision = commits[0] if len(commits) == 1 else None
    splits: dict = {}
    if revision is not None:
        for folder in folders:
            try:
                splits = json.loads((folder / config.DATASET_INFO_FILENAME).read_text()).get("splits") or {}
            except (OSError, ValueError):
                continue
            break
    out = []
    for split in ("train", "test"):
        entry = {"source": "hub", "id": hub_id, "revision": revision, "split": split,
                 "rows": (splits.get(split) or {}).get("num_examples")}
        if len(commits) > 1:
            entry["cached"] = commits
        out.append(entry)
    return out[0], out[1]


def data_fingerprint(cfg: dict, num_partitions: int | None, node_local: int = 0) -> dict:
    """What a run trains and tests on, as one canonical dict, plus ``digest``: the first
    12 hex digits of the SHA-256 of that dict (sorted-key JSON) without its ``seed``.

    - ``train`` / ``test``: local parquet files (``data-dir`` or ``$FL_DATA_DIR``) by size and
      SHA-256 (never by path: a folder may move, and a path says nothing of what is in it); a
      hub dataset by id, revision and rows; the synthetic dataset by its generator (its keys
      are in ``partition``); ``node-local``: nodes that brought their own ``data-path`` (their
      files are not read by the server, so only their count is known);
    - ``partition``: ``PartitionSpec.identity`` (partitioner, num-partitions, alpha, ...) and
      ``client-test-fraction`` (the share of each partition held out from training);
    - ``seed``: kept apart from the digest, since the seeds of one table differ by design (the
      same data cut with another seed): runs that belong in one table share the digest.
    """
    from tasks.catalogue import DATASETS
    from tasks.datasets import local_parquet_files
    from tasks.partition_spec import PartitionSpec

    spec = PartitionSpec.from_config(cfg, num_partitions)
    partition = spec.identity()
    dataset, seed = partition.pop("dataset"), partition.pop("seed")
    partition["client-test-fraction"] = float(cfg["client-test-fraction"])
    if dataset == "synthetic":
        train = {"source": "synthetic", "generator": "tasks/synthetic.py"}
        test = {"source": "synthetic", "split": "20% of every device's samples"}
    else:
        files = local_parquet_files(dataset, spec.data_dir)
        if files is not None:  # a dataset without a test split holds one out of train (tasks.catalogue)
            held = {"source": "held out of train", "share": DATASETS[dataset].held_out_test}
            train, test = ({"source": "local parquet", **file_identity(files[s])} if s in files else held
                           for s in ("train", "test"))
        else:
            train, test = hub_identity(DATASETS[dataset].hub_id)
    if node_local:
        train = {**train, "node-local": node_local}
    shared = {"dataset": dataset, "train": train, "test": test, "partition": partition}
    return {**shared, "seed": seed, "digest": fingerprint_digest(shared)}


def fingerprint_digest(fingerprint: dict) -> str:
    """The digest of a fingerprint: its fields but ``seed`` and ``digest``, as sorted-key JSON."""
    shared = {k: v for k, v in fingerprint.items() if k not in ("seed", "digest")}
    text = json.dumps(shared, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def record_fingerprint(run_dir: Path, cfg: dict, num_partitions: int | None, node_local: int = 0) -> dict:
    """The data fingerprint of a run that starts (not resumed), computed now and kept in
    ``<run_dir>/data-fingerprint.json``; a file left there by an earlier run in the folder is
    replaced, never compared nor kept (the run starts its results anew)."""
    now = data_fingerprint(cfg, num_partitions, node_local)
    _write_fingerprint(Path(run_dir) / FINGERPRINT_FILE, now)
    return now


def resumed_fingerprint(run_dir: Path, cfg: dict, num_partitions: int | None, node_local: int = 0,
                        checkpointed: dict | None = None) -> dict | None:
    """The data fingerprint of a resumed run, which must equal the fingerprint of the data its
    rounds so far trained on, else ``DataChanged`` (one line naming both digests): a run
    continued on other data would mix two data sets in one result.

    The fingerprint it started on is the checkpoint's (``checkpointed``: inside the hashed
    checkpoint, so deleting or editing ``data-fingerprint.json`` changes nothing). A checkpoint
    written before checkpoints carried one (or when the data could not be read) has None: then
    ``data-fingerprint.json`` must be there and agree, and without it the resume is refused, since
    the data it started on is unknown. The file is (re)written with the fingerprint found now
    when it is missing or disagrees with the checkpoint's. A run resumed after its last round
    (``num_partitions`` None: no node asked) gets the recorded fingerprint back unchecked: it
    trains nothing more."""
    path = Path(run_dir) / FINGERPRINT_FILE
    kept = _read_fingerprint(path)
    started = checkpointed or kept
    if num_partitions is None:
        return started
    now = data_fingerprint(cfg, num_partitions, node_local)
    if started is None:
        raise DataChanged(f"{run_dir}: its checkpoint carries no data fingerprint (written before checkpoints "
                          f"carried one) and {path} is missing, so the data it started on is unknown and cannot be "
                          f"shown to be the data it would continue on ({now['digest']}); start the run again in "
                          "another folder")
    if started.get("digest") != now["digest"]:
        where = "its checkpoint" if checkpointed else str(path)
        raise DataChanged(f"{run_dir} started on data {started.get('digest')} and would continue on data "
                          f"{now['digest']} (the first as recorded in {where}): the data files or the partitioning "
                          "changed; start the run again in another folder")
    if kept is None or kept.get("digest") != now["digest"]:
        _write_fingerprint(path, now)
    return now


def _read_fingerprint(path: Path) -> dict | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _write_fingerprint(path: Path, fingerprint: dict) -> None:
    atomic_write_text(path, json.dumps(fingerprint, indent=1))
