"""Replacing kept runs in the results store (``scripts/make_results.py --collect``) without ever
losing one: the kept runs are the product's evidence.

A run's new copy is built beside the old one, in a hidden temporary folder of the same parent
(``stage_run``), and checked (``check_copy``: metrics.csv and summary.json present and
parseable, the data fingerprint present and parseable where the run recorded one). Only when
every incoming run is staged and checked are they swapped in (``swap_in``: renames within one
folder, the old copy moved aside first and removed only after the new one is in place). Any
failure while staging removes what was staged and raises ``StoreError`` (one line): the store
is left byte-identical. A hidden temporary folder is never read as a run (runs are found by
their ``<row>-seed<N>`` names).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from fl_app.api import FINGERPRINT_KEY, METRICS_FILE, SUMMARY_FILE
from fl_app.config import ConfigError
from runner.results.fingerprint import fingerprint_of

# the metrics.csv columns every run writes (fl_app/common/run_files.py BASE_COLUMNS' first two)
NEEDED_COLUMNS = ("round", "test_accuracy")


class StoreError(ConfigError):
    """A run that cannot be put into the store; the store was left as it was."""


def check_copy(folder: Path, recorded: dict) -> None:
    """The staged copy ``folder`` holds a parseable metrics.csv (with its round and accuracy
    columns) and summary.json, and the data fingerprint the run recorded (``recorded``: the
    summary as read from the source) survives, parseable, in the copy's summary.json. Else
    ``StoreError`` naming the file and what is wrong."""
    metrics, summary_file = folder / METRICS_FILE, folder / SUMMARY_FILE
    try:
        with metrics.open(newline="") as f:
            reader = csv.DictReader(f)
            columns, rows = reader.fieldnames or [], list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise StoreError(f"{METRICS_FILE} cannot be read ({exc})") from None
    missing = [c for c in NEEDED_COLUMNS if c not in columns]
    if missing or any(None in row for row in rows):
        raise StoreError(f"{METRICS_FILE} is not a run's metrics table (columns {columns[:4]}...; needs"
                         f" {', '.join(NEEDED_COLUMNS)} and one cell per column in every row)")
    try:
        summary = json.loads(summary_file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StoreError(f"{SUMMARY_FILE} cannot be read as JSON ({exc})") from None
    if not isinstance(summary, dict):
        raise StoreError(f"{SUMMARY_FILE} holds a {type(summary).__name__}, not a run's summary")
    if recorded.get(FINGERPRINT_KEY) is not None and fingerprint_of(summary) is None:
        raise StoreError(f"the data fingerprint the run recorded ({FINGERPRINT_KEY!r} in {SUMMARY_FILE}) is missing"
                         " or not parseable (it needs a 'digest')")


def stage_run(parent: Path, name: str, fill: Callable[[Path], None], recorded: dict) -> Path:
    """A new copy of run ``name``, written by ``fill(folder)`` into a hidden temporary folder of
    ``parent`` (the store's experiment folder, created if needed) and checked (``check_copy``).
    On any failure the temporary folder is removed and ``StoreError`` says why."""
    parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{name}.incoming-", dir=parent))
    try:
        fill(staged)
        check_copy(staged, recorded)
    except (OSError, ValueError, shutil.Error) as exc:  # a missing file, a full disk, a bad record
        shutil.rmtree(staged, ignore_errors=True)
        why = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise StoreError(f"{parent.name}/{name}: {why}") from None
    return staged


def swap_in(staged: Path, target: Path) -> None:
    """Put the checked copy ``staged`` in ``target``'s place (same folder, so renames): the old
    copy is renamed aside, the new one renamed in, and only then is the old one removed; if the
    second rename fails, the old copy is renamed back."""
    if not target.exists():
        os.rename(staged, target)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.replaced-", dir=target.parent))
    os.rmdir(aside)  # only its unique name is wanted: rename needs a free name
    os.rename(target, aside)
    try:
        os.rename(staged, target)
    except OSError:
        os.rename(aside, target)
        raise
    shutil.rmtree(aside)


def discard(staged: list[Path], made: list[Path]) -> None:
    """Remove staged copies and then the folders (``made``, innermost last) that staging created
    and that are empty again, so a failed collect leaves the store as it was."""
    for folder in staged:
        shutil.rmtree(folder, ignore_errors=True)
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:
            pass


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, outermost first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    return list(reversed(missing))
